package explain

// What the database holds of the events: each table read by its keys (an
// event's id, and the outcome ids derived from it), so that a story costs
// a few index lookups whatever the tables' sizes; an order's attempts by
// the order's partial indexes, and its declined and rejected ones within
// Limits.Declined.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"example.com/billing/internal/charge"
	"example.com/billing/internal/dedup"
	"example.com/billing/internal/dlq/reason"
	"example.com/billing/internal/order"
	"example.com/billing/internal/outbox"
)

// records is what the database holds of a story's events.
type records struct {
	attempts map[uuid.UUID]Attempt
	claims   map[uuid.UUID][]Claim
	waiting  map[uuid.UUID]Waiting
	outcomes map[uuid.UUID][]Outcome // by causation
	notified map[uuid.UUID][]Notified
	// orders maps an event to its order, as the database knows it.
	orders map[uuid.UUID]int64
	// horizon is the first day the dedup store still remembers (zero:
	// it never dropped one).
	horizon time.Time
	// declinedSince is how far back an order's declined and rejected
	// attempts were looked for.
	declinedSince time.Time
}

// attemptRow is a charge row with the columns charge.Row leaves out.
type attemptRow struct {
	charge.Row
	UpdatedAt time.Time  `db:"updated_at"`
	SettledAt *time.Time `db:"settled_at"`
	ResolveAt *time.Time `db:"resolve_at"`
	CountedBy *string    `db:"counted_by"`
}

const attemptColumns = charge.Columns + `, updated_at, settled_at, resolve_at, counted_by`

// records reads what the database holds of events ids, or, with ids empty,
// of every event of orderID it knows.
func (t *Teller) records(ctx context.Context, ids []uuid.UUID, orderID int64) (*records, error) {
	rec := &records{attempts: map[uuid.UUID]Attempt{}, claims: map[uuid.UUID][]Claim{}, waiting: map[uuid.UUID]Waiting{},
		outcomes: map[uuid.UUID][]Outcome{}, notified: map[uuid.UUID][]Notified{}, orders: map[uuid.UUID]int64{},
		declinedSince: time.Now().Add(-t.limits.Declined).UTC()}
	var rows []attemptRow
	var waits []waitingRow
	var err error
	if len(ids) > 0 {
		if rows, err = selectAttempts(ctx, t.db, `WHERE event_id = ANY($1::uuid[])`, texts(ids)); err != nil {
			return nil, err
		}
		if waits, err = selectWaiting(ctx, t.db, `WHERE event_id = ANY($1::uuid[])`, texts(ids)); err != nil {
			return nil, err
		}
	} else {
		// Each OR arm is one of the order's partial indexes (its succeeded
		// and its open attempt), and the last a window of the BRIN index
		// on created_at.
		const where = `WHERE (order_id = $1 AND status = $2) OR (order_id = $1 AND status IN ($3, $4))
   OR (order_id = $1 AND status IN ($5, $6) AND created_at >= $7) ORDER BY created_at`
		if rows, err = selectAttempts(ctx, t.db, where, orderID, charge.Succeeded, charge.Pending, charge.InProgress,
			charge.Declined, charge.Rejected, rec.declinedSince); err != nil {
			return nil, err
		}
		if waits, err = selectWaiting(ctx, t.db, `WHERE order_id = $1 ORDER BY created_at`, orderID); err != nil {
			return nil, err
		}
	}
	for _, r := range rows {
		rec.attempts[r.EventID] = attemptOf(r)
		rec.orders[r.EventID] = r.OrderID
		ids = append(ids, r.EventID)
	}
	for _, w := range waits {
		rec.waiting[w.EventID] = Waiting{OrderID: w.OrderID, CreatedAt: w.CreatedAt}
		rec.orders[w.EventID] = w.OrderID
		ids = append(ids, w.EventID)
	}
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
	ids = slices.Compact(ids)
	if err := rec.readClaims(ctx, t.db, ids); err != nil {
		return nil, err
	}
	if err := rec.readOutcomes(ctx, t.db, ids); err != nil {
		return nil, err
	}
	if err := rec.readNotified(ctx, t.db, t.provider, rows); err != nil {
		return nil, err
	}
	if rec.horizon, err = dedup.DroppedBefore(ctx, t.db); err != nil {
		return nil, err
	}
	return rec, nil
}

func selectAttempts(ctx context.Context, db sqlx.QueryerContext, where string, args ...any) ([]attemptRow, error) {
	var rows []attemptRow
	if err := sqlx.SelectContext(ctx, db, &rows, `SELECT `+attemptColumns+` FROM charge `+where, args...); err != nil {
		return nil, fmt.Errorf("read charge attempts: %w", err)
	}
	return rows, nil
}

type waitingRow struct {
	EventID   uuid.UUID `db:"event_id"`
	OrderID   int64     `db:"order_id"`
	CreatedAt time.Time `db:"created_at"`
}

func selectWaiting(ctx context.Context, db sqlx.QueryerContext, where string, args ...any) ([]waitingRow, error) {
	var rows []waitingRow
	if err := sqlx.SelectContext(ctx, db, &rows, `SELECT event_id, order_id, created_at FROM charge_waiting `+where, args...); err != nil {
		return nil, fmt.Errorf("read charge_waiting: %w", err)
	}
	return rows, nil
}

// succeededOf is order's succeeded attempt, nil when it has none (the
// order's partial unique index).
func succeededOf(ctx context.Context, db sqlx.QueryerContext, orderID int64) (*charge.Row, error) {
	rows, err := charge.Select(ctx, db, `WHERE order_id = $1 AND status = $2`, orderID, charge.Succeeded)
	if err != nil || len(rows) == 0 {
		return nil, err
	}
	return &rows[0], nil
}

func attemptOf(r attemptRow) Attempt {
	a := Attempt{OrderID: r.OrderID, CustomerID: r.CustomerID, Currency: r.Currency, Status: r.Status,
		Amount:   order.Money{Minor: r.Amount, Currency: r.Currency}.Decimal(),
		Requests: r.Requests, Deferred: r.Deferred, Indeterminate: r.Indeterminate,
		CreatedAt: r.CreatedAt.UTC(), UpdatedAt: r.UpdatedAt.UTC(), SettledAt: utc(r.SettledAt), ResolveAt: utc(r.ResolveAt)}
	a.ProviderChargeID, a.LastError, a.DeclineCode = deref(r.ProviderChargeID), deref(r.LastError), deref(r.DeclineCode)
	a.CustomerRef, a.PaymentMethodRef, a.CountedBy = deref(r.CustomerRef), deref(r.PaymentMethodRef), deref(r.CountedBy)
	return a
}

// readClaims reads the events' records in processed_event, of every
// consumer group (the table's partitions are by event id: a lookup by id
// reads one).
func (rec *records) readClaims(ctx context.Context, db sqlx.QueryerContext, ids []uuid.UUID) error {
	var rows []struct {
		EventID uuid.UUID `db:"event_id"`
		Claim
	}
	const q = `SELECT event_id, consumer_group, processed_at, claimed_with
FROM processed_event WHERE event_id = ANY($1::uuid[]) ORDER BY processed_at`
	if err := sqlx.SelectContext(ctx, db, &rows, q, texts(ids)); err != nil {
		return fmt.Errorf("read processed_event: %w", err)
	}
	for _, r := range rows {
		r.ProcessedAt = r.ProcessedAt.UTC()
		rec.claims[r.EventID] = append(rec.claims[r.EventID], r.Claim)
	}
	return nil
}

// outcomeIDs are the ids every outcome of the events can have: an
// outcome's id is derived from its order event, its type and its reason
// (outbox.OutcomeID), so the outbox and outbox_dead are read by their
// primary keys.
func outcomeIDs(ids []uuid.UUID) pq.StringArray {
	var out pq.StringArray
	for _, id := range ids {
		out = append(out, outbox.OutcomeID(id, outbox.Succeeded, "").String(), outbox.OutcomeID(id, outbox.Declined, "").String())
		for _, code := range reason.Codes {
			out = append(out, outbox.OutcomeID(id, outbox.Failed, string(code)).String())
		}
	}
	return out
}

// readOutcomes reads the events' outcomes still in the outbox (recorded,
// not published: the relay deletes a row once the broker acknowledged it)
// and in outbox_dead.
func (rec *records) readOutcomes(ctx context.Context, db sqlx.QueryerContext, ids []uuid.UUID) error {
	if len(ids) == 0 {
		return nil
	}
	var rows []struct {
		CausationID uuid.UUID `db:"causation_id"`
		Payload     []byte    `db:"payload"`
		Attempts    int       `db:"attempts"`
		LastError   *string   `db:"last_error"`
		Dead        bool      `db:"dead"`
	}
	const q = `
SELECT causation_id, payload, attempts, last_error, dead FROM outbox WHERE event_id = ANY($1::uuid[])
UNION ALL
SELECT causation_id, payload, attempts, last_error, true FROM outbox_dead WHERE event_id = ANY($1::uuid[])`
	if err := sqlx.SelectContext(ctx, db, &rows, q, outcomeIDs(ids)); err != nil {
		return fmt.Errorf("read outbox: %w", err)
	}
	for _, r := range rows {
		o, _, err := outcomeOf(r.Payload)
		if err != nil {
			return err
		}
		o.State, o.Attempts, o.LastError = InOutbox, r.Attempts, deref(r.LastError)
		if r.Dead {
			o.State = Dead
		}
		rec.outcomes[r.CausationID] = append(rec.outcomes[r.CausationID], o)
	}
	return nil
}

// outcomeJSON is a payments.settled value, as much of it as a story tells.
type outcomeJSON struct {
	EventID          uuid.UUID `json:"eventId"`
	EventType        string    `json:"eventType"`
	OccurredAt       time.Time `json:"occurredAt"`
	CausationID      uuid.UUID `json:"causationId"`
	ProviderChargeID string    `json:"providerChargeId"`
	DeclineCode      string    `json:"declineCode"`
	Reason           string    `json:"reason"`
}

// outcomeOf reads an outcome event's value, and the order event it is of.
func outcomeOf(payload []byte) (Outcome, uuid.UUID, error) {
	var v outcomeJSON
	if err := json.Unmarshal(payload, &v); err != nil {
		return Outcome{}, uuid.Nil, fmt.Errorf("read an outcome event: %w", err)
	}
	return Outcome{EventID: v.EventID, Type: v.EventType, OccurredAt: v.OccurredAt.UTC(), Reason: v.Reason,
		ProviderID: v.ProviderChargeID, DeclineCode: v.DeclineCode}, v.CausationID, nil
}

// readNotified reads the provider's notifications kept of the attempts'
// payments: by their ids, or by their keys around their creation (the
// table's index is the provider's and the payment's creation time).
func (rec *records) readNotified(ctx context.Context, db sqlx.QueryerContext, provider string, attempts []attemptRow) error {
	if len(attempts) == 0 {
		return nil
	}
	var refs, keys pq.StringArray
	from, to := attempts[0].CreatedAt, attempts[0].UpdatedAt
	for _, a := range attempts {
		keys = append(keys, a.EventID.String())
		if a.ProviderChargeID != nil {
			refs = append(refs, *a.ProviderChargeID)
		}
		from, to = minTime(from, a.CreatedAt), maxTime(to, a.UpdatedAt)
	}
	var rows []struct {
		Key        string    `db:"idempotency_key"`
		PaymentRef string    `db:"payment_ref"`
		Status     string    `db:"status"`
		Amount     int64     `db:"amount_minor"`
		Currency   string    `db:"currency"`
		CreatedAt  time.Time `db:"created_at"`
		ReceivedAt time.Time `db:"received_at"`
	}
	const q = `
SELECT idempotency_key, payment_ref, status, amount_minor, currency, created_at, received_at FROM notified_payment
WHERE provider = $1 AND (payment_ref = ANY($2::text[])
   OR (idempotency_key = ANY($3::text[]) AND created_at >= $4 AND created_at < $5))
ORDER BY received_at`
	day := 24 * time.Hour
	if err := sqlx.SelectContext(ctx, db, &rows, q, provider, refs, keys, from.Add(-day), to.Add(day)); err != nil {
		return fmt.Errorf("read notified_payment: %w", err)
	}
	for _, r := range rows {
		id, err := uuid.FromString(r.Key)
		if err != nil {
			continue // a payment notified without billing's key names no event
		}
		rec.notified[id] = append(rec.notified[id], Notified{PaymentRef: r.PaymentRef, Status: r.Status,
			Amount:    order.Money{Minor: r.Amount, Currency: r.Currency}.String(),
			CreatedAt: r.CreatedAt.UTC(), ReceivedAt: r.ReceivedAt.UTC()})
	}
	return nil
}

// orderOf is id's order as the database knows it, 0 when it does not.
func (rec *records) orderOf(id uuid.UUID) int64 { return rec.orders[id] }

// eventIDs are the events the records name, in id (creation) order.
func (rec *records) eventIDs() []uuid.UUID {
	var ids []uuid.UUID
	for id := range rec.orders {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
	return ids
}

// event is id's story as the database tells it.
func (rec *records) event(id uuid.UUID) Event {
	ev := Event{EventID: id, Created: created(id), Reads: []Read{}, Claims: rec.claims[id], Outcomes: rec.outcomes[id],
		Parkings: []Parking{}, Notified: rec.notified[id]}
	if ev.Claims == nil {
		ev.Claims = []Claim{}
	}
	if ev.Outcomes == nil {
		ev.Outcomes = []Outcome{}
	}
	if a, ok := rec.attempts[id]; ok {
		ev.Attempt = &a
	}
	if w, ok := rec.waiting[id]; ok {
		ev.Waiting = &w
	}
	return ev
}

func texts(ids []uuid.UUID) pq.StringArray {
	out := make(pq.StringArray, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
