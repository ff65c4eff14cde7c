// Package charge owns the charge table: its row (one payment request to the
// provider, keyed by the event that asked for it, and what is known of its
// outcome), its statuses, and its statements (store.go). billing writes the
// rows through them (claim, charge, settle); reconcile, the demo and the
// chaos suite read them with this same struct and these same columns, so
// that a column or a status is changed in one place.
package charge

import (
	"context"
	"fmt"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
)

// Statuses of a row (the status column). Only a succeeded charge moved
// money.
const (
	Pending = "pending" // recorded before the provider call; no answer recorded yet
	// InProgress: the provider accepted the payment and gives its verdict
	// later (ProviderChargeID holds its id when it gave one); settled by
	// the provider's notification or a lookup, never asked again.
	InProgress = "in_progress"
	Succeeded  = "succeeded" // charged; ProviderChargeID holds the provider's id
	Declined   = "declined"  // the provider declined the payment
	// Rejected: the provider refused the request itself, or billing did
	// not send it (no payment method); the event was parked.
	Rejected = "rejected"
)

// Open reports whether status is an attempt's before its outcome is known:
// an order has at most one open attempt.
func Open(status string) bool { return status == Pending || status == InProgress }

// Row is one row of the charge table. Everything the provider request needs
// is in it, so any worker can complete a pending attempt.
type Row struct {
	EventID          uuid.UUID `db:"event_id"` // the provider request's Idempotency-Key
	OrderID          int64     `db:"order_id"`
	CustomerID       int64     `db:"customer_id"`
	Amount           int64     `db:"amount_minor"`
	Currency         string    `db:"currency"`
	Status           string    `db:"status"`
	ProviderChargeID *string   `db:"provider_charge_id"`
	LastError        *string   `db:"last_error"`
	CreatedAt        time.Time `db:"created_at"`
	// CustomerRef and PaymentMethodRef are the saved card the request
	// charges, for a provider that needs one.
	CustomerRef      *string `db:"customer_ref"`
	PaymentMethodRef *string `db:"payment_method_ref"`
	DeclineCode      *string `db:"decline_code"`
	// Deferred: the event's message was finished before the outcome was
	// known; the settle that records it counts it.
	Deferred bool `db:"deferred"`
	// Indeterminate counts the answers without a verdict the provider
	// stored under the key (Stripe's 500): re-sent once, then looked up.
	Indeterminate int `db:"indeterminate"`
	// Requests counts the provider requests made for the attempt.
	Requests int `db:"requests"`
}

// Columns are Row's columns, for SELECT and RETURNING lists.
const Columns = `event_id, order_id, customer_id, amount_minor, currency, status, provider_charge_id, last_error, created_at,
customer_ref, payment_method_ref, decline_code, deferred, indeterminate, requests`

// Select returns the rows that the SQL text after `FROM charge` selects (a
// WHERE clause, or "" for every row), with args as its parameters.
func Select(ctx context.Context, q sqlx.QueryerContext, where string, args ...any) ([]Row, error) {
	var rows []Row
	if err := sqlx.SelectContext(ctx, q, &rows, `SELECT `+Columns+` FROM charge `+where, args...); err != nil {
		return nil, fmt.Errorf("read the charge table: %w", err)
	}
	return rows, nil
}
