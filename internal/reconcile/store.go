package reconcile

import (
	"context"
	"fmt"
	"time"

	"example.com/billing/internal/charge"
	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// Store reads billing's side from the charge table.
type Store struct {
	db *sqlx.DB
}

// NewStore returns a Store reading db.
func NewStore(db *sqlx.DB) *Store { return &Store{db: db} }

// InWindow returns the rows created in w (index charge_created_at).
func (s *Store) InWindow(ctx context.Context, w Window) ([]Record, error) {
	rows, err := charge.Select(ctx, s.db, `WHERE created_at >= $1 AND created_at < $2`, w.From, w.To)
	if err != nil {
		return nil, fmt.Errorf("select charges created in [%s, %s): %w", w.From.Format(time.RFC3339), w.To.Format(time.RFC3339), err)
	}
	return toRecords(rows), nil
}

// ByKey returns the rows of the given event ids, whenever they were created,
// and the rows that recorded one of the given provider charge ids: the
// counterparts of provider charges whose rows may lie outside the window.
// Keys that are not UUIDs cannot be event ids and are ignored.
func (s *Store) ByKey(ctx context.Context, keys, chargeIDs []string) ([]Record, error) {
	var ids pq.StringArray
	for _, k := range keys {
		if u, err := uuid.FromString(k); err == nil {
			ids = append(ids, u.String())
		}
	}
	var out []Record
	if len(ids) > 0 {
		rows, err := charge.Select(ctx, s.db, `WHERE event_id = ANY($1::uuid[])`, ids)
		if err != nil {
			return nil, fmt.Errorf("select charges by event id: %w", err)
		}
		out = append(out, toRecords(rows)...)
	}
	// Only for provider charges that carry no key, which billing never
	// makes: provider_charge_id has no index, and this reads the table.
	if len(chargeIDs) > 0 {
		rows, err := charge.Select(ctx, s.db, `WHERE provider_charge_id = ANY($1::text[])`, pq.StringArray(chargeIDs))
		if err != nil {
			return nil, fmt.Errorf("select charges by provider charge id: %w", err)
		}
		out = append(out, toRecords(rows)...)
	}
	return out, nil
}

func toRecords(rows []charge.Row) []Record {
	out := make([]Record, len(rows))
	for i, r := range rows {
		out[i] = Record{
			EventID:    r.EventID.String(),
			OrderID:    r.OrderID,
			CustomerID: r.CustomerID,
			Amount:     r.Amount,
			Currency:   r.Currency,
			Status:     r.Status,
			CreatedAt:  r.CreatedAt.UTC(),
		}
		if r.ProviderChargeID != nil {
			out[i].ProviderChargeID = *r.ProviderChargeID
		}
	}
	return out
}

// Options tune Reconcile.
type Options struct {
	// Slack widens the window in which the provider's side is read, so
	// that the provider charge of a row just inside the window, created
	// just outside it, is found. It must exceed the time a charge can take
	// from the provider's created to billing's commit: a transaction's
	// length, or an outage's when an answer was lost and retried.
	Slack time.Duration
}

// Reconcile reads both sides of w and compares them.
func Reconcile(ctx context.Context, store *Store, ledger Ledger, w Window, opts Options) (Report, error) {
	if err := w.Validate(); err != nil {
		return Report{}, err
	}
	lookup := w.Widen(opts.Slack)
	records, err := store.InWindow(ctx, w)
	if err != nil {
		return Report{}, err
	}
	charges, err := ledger.Charges(ctx, lookup.From, lookup.To)
	if err != nil {
		return Report{}, fmt.Errorf("list provider charges in [%s, %s): %w", lookup.From.Format(time.RFC3339), lookup.To.Format(time.RFC3339), err)
	}

	// The rows of the provider's in-window charges that lie outside the
	// window: looked up by key, at any time.
	seen := make(map[string]bool, len(records))
	seenCharge := make(map[string]bool, len(records))
	for _, r := range records {
		seen[normKey(r.EventID)] = true
		seenCharge[r.ProviderChargeID] = true
	}
	var keys, chargeIDs []string
	for _, c := range charges {
		if !w.Contains(c.Created) {
			continue
		}
		switch k := normKey(c.IdempotencyKey); {
		case k == "" && !seenCharge[c.ID]:
			chargeIDs = append(chargeIDs, c.ID)
		case k != "" && !seen[k]:
			keys = append(keys, k)
		}
	}
	extra, err := store.ByKey(ctx, keys, chargeIDs)
	if err != nil {
		return Report{}, err
	}
	for _, r := range extra {
		// ByKey's two lookups can find one row twice.
		if k := normKey(r.EventID); !seen[k] {
			records = append(records, r)
			seen[k] = true
		}
	}

	rep := Compare(w, records, charges)
	rep.Lookup = lookup
	return rep, nil
}
