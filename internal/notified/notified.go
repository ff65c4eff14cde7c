// Package notified keeps the payments a provider described in its verified
// notifications, for a provider whose payments billing cannot list
// (Adyen): billing reconcile compares the charge table with them, as it
// compares it with Stripe's list.
//
// What they prove is what the provider signed: for each payment it
// notified, its verdict, amount, currency and reference. A payment whose
// notification never reached billing (the endpoint refusing, or down for
// longer than the provider retries) is not kept, and neither is what
// happened to the money after the verdict (a capture that failed, a
// refund, a chargeback): for those, the provider's reports.
package notified

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"example.com/billing/internal/payment"
)

// Store keeps one provider's notified payments in table notified_payment.
type Store struct {
	db       *sqlx.DB
	provider string // PAYMENT_PROVIDER
}

// NewStore returns the store of provider's notified payments in db.
func NewStore(db *sqlx.DB, provider string) *Store {
	return &Store{db: db, provider: provider}
}

// Keep records the payments notes describe (their Payment), each verdict
// once: a notification sent again is kept once. Notes without a Payment
// are skipped. It returns once they are committed: serve keeps a batch
// before it records its outcomes, and acknowledges it only after both.
func (s *Store) Keep(ctx context.Context, notes []payment.Notification) error {
	var refs, statuses, keys, currencies, created pq.StringArray
	var amounts pq.Int64Array
	for _, n := range notes {
		p := n.Payment
		if p == nil || p.ID == "" {
			continue
		}
		at := ""
		if !p.Created.IsZero() {
			at = p.Created.UTC().Format(time.RFC3339Nano)
		}
		refs, statuses, keys = append(refs, p.ID), append(statuses, p.Status), append(keys, p.IdempotencyKey)
		amounts, currencies, created = append(amounts, p.Amount), append(currencies, p.Currency), append(created, at)
	}
	if len(refs) == 0 {
		return nil
	}
	// A payment without the provider's time is kept at the time it was
	// received.
	const q = `
INSERT INTO notified_payment (provider, payment_ref, status, idempotency_key, amount_minor, currency, created_at)
SELECT $1, ref, status, key, amount, currency, COALESCE(NULLIF(at, '')::timestamptz, now())
FROM unnest($2::text[], $3::text[], $4::text[], $5::int8[], $6::text[], $7::text[]) AS t(ref, status, key, amount, currency, at)
ON CONFLICT (provider, payment_ref, status) DO NOTHING`
	if _, err := s.db.ExecContext(ctx, q, s.provider, refs, statuses, keys, amounts, currencies, created); err != nil {
		return fmt.Errorf("insert notified_payment: %w", err)
	}
	return nil
}

// Charges lists the provider's notified payments created in [from, to),
// its side of a reconciliation (reconcile.Ledger). A notification carries
// no order or customer: both are 0, which reconciliation does not
// compare.
func (s *Store) Charges(ctx context.Context, from, to time.Time) ([]payment.ListedCharge, error) {
	const q = `
SELECT payment_ref, idempotency_key, amount_minor, currency, status, created_at
FROM notified_payment
WHERE provider = $1 AND created_at >= $2 AND created_at < $3
ORDER BY created_at, payment_ref, status`
	var rows []struct {
		Ref      string    `db:"payment_ref"`
		Key      string    `db:"idempotency_key"`
		Amount   int64     `db:"amount_minor"`
		Currency string    `db:"currency"`
		Status   string    `db:"status"`
		Created  time.Time `db:"created_at"`
	}
	if err := sqlx.SelectContext(ctx, s.db, &rows, q, s.provider, from, to); err != nil {
		return nil, fmt.Errorf("select notified_payment in [%s, %s): %w", from.Format(time.RFC3339), to.Format(time.RFC3339), err)
	}
	out := make([]payment.ListedCharge, len(rows))
	for i, r := range rows {
		out[i] = payment.ListedCharge{ID: r.Ref, IdempotencyKey: r.Key, Amount: r.Amount, Currency: r.Currency,
			Status: r.Status, Created: r.Created.UTC()}
	}
	return out, nil
}
