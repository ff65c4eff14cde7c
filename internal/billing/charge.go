package billing

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"go.opentelemetry.io/otel/trace"

	"example.com/billing/internal/order"
	"example.com/billing/internal/payment"
)

// orderLockSpace is the first key of billing's two-key advisory locks
// ("bill"), so that they never collide with one-key locks such as the
// migration lock. The second key is hashint8(order_id): two orders that share
// a hash only wait for each other.
const orderLockSpace = 0x62696c6c

// chargeOrders charges events, which the caller has just claimed in tx, and
// records each outcome in the charge table inside tx. It returns one outcome
// per event: Charged, Declined, or AlreadyCharged for an order that already
// has a succeeded charge.
//
// Charges of one order are serialized across transactions, partitions and
// replicas by a transaction-scoped advisory lock taken before the "already
// charged?" check, so that two different events confirming the same order at
// the same moment cannot both reach the provider. Locks are taken in key
// order, so that two batches sharing orders cannot deadlock.
//
// Provider calls for different orders run concurrently; events of one order
// are charged in their order. Each provider call is traced below its event's
// span (traces[i]). On any provider error the function returns it (wrapping
// payment.ErrRejected, or transient) and the caller must roll back.
func chargeOrders(ctx context.Context, tx *sqlx.Tx, payer Payer, events []order.Event, traces []trace.SpanContext) ([]Outcome, error) {
	orderIDs := make([]int64, 0, len(events))
	for _, ev := range events {
		orderIDs = append(orderIDs, ev.OrderID)
	}
	slices.Sort(orderIDs)
	orderIDs = slices.Compact(orderIDs)

	if err := lockOrders(ctx, tx, orderIDs); err != nil {
		return nil, err
	}
	// A separate statement after the locks: under READ COMMITTED it takes a
	// fresh snapshot and so sees a charge committed by the lock's last holder.
	paid, settled, err := recordedCharges(ctx, tx, orderIDs)
	if err != nil {
		return nil, err
	}

	outcomes := make([]Outcome, len(events))
	charges := make([]payment.Charge, len(events))
	errs := make([]error, len(events))
	var wg sync.WaitGroup
	for _, id := range orderIDs {
		alreadyPaid := paid[id] // read here: the goroutines must not share the map
		wg.Go(func() {
			for i, ev := range events {
				if ev.OrderID != id {
					continue
				}
				if settled[ev.ID.String()] {
					// This very event already has its charge row: settled
					// under another consumer group sharing the database, or
					// before its dedup record was lost. Never ask again.
					outcomes[i] = Duplicate
					continue
				}
				if alreadyPaid {
					outcomes[i] = AlreadyCharged
					continue
				}
				ch, err := payer.Charge(trace.ContextWithSpanContext(ctx, traces[i]), payment.Request{
					IdempotencyKey: ev.ID.String(),
					OrderID:        ev.OrderID,
					CustomerID:     ev.CustomerID,
					Amount:         ev.Amount.Minor,
					Currency:       ev.Amount.Currency,
				})
				switch {
				case err == nil:
					outcomes[i], charges[i] = Charged, ch
					alreadyPaid = true // a later event of this order is a business duplicate
				case errors.Is(err, payment.ErrDeclined):
					outcomes[i] = Declined
				default:
					errs[i] = err
					return // later events of this order wait for this one
				}
			}
		})
	}
	wg.Wait()
	if err := firstError(errs); err != nil {
		return nil, err
	}
	if err := insertCharges(ctx, tx, events, outcomes, charges); err != nil {
		return nil, err
	}
	return outcomes, nil
}

// firstError prefers a transient error over a rejection: a batch that met an
// outage is retried whole later, while a rejection alone makes the caller
// find the one event to park.
func firstError(errs []error) error {
	var rejected error
	for _, err := range errs {
		switch {
		case err == nil:
		case errors.Is(err, payment.ErrRejected):
			if rejected == nil {
				rejected = err
			}
		default:
			return err
		}
	}
	return rejected
}

func lockOrders(ctx context.Context, tx *sqlx.Tx, orderIDs []int64) error {
	// ORDER BY at the top level: PostgreSQL evaluates a volatile function of
	// the select list after sorting, so the locks are taken in key order.
	const q = `
SELECT pg_advisory_xact_lock($1, h)
FROM (SELECT DISTINCT hashint8(id) AS h FROM unnest($2::int8[]) AS id) AS keys
ORDER BY h`
	if _, err := tx.ExecContext(ctx, q, orderLockSpace, pq.Int64Array(orderIDs)); err != nil {
		return fmt.Errorf("lock orders: %w", err)
	}
	return nil
}

// recordedCharges reads the charge rows of orderIDs: which orders have a
// succeeded charge, and which events already have a row of their own.
func recordedCharges(ctx context.Context, tx *sqlx.Tx, orderIDs []int64) (paid map[int64]bool, settled map[string]bool, err error) {
	const q = `SELECT event_id, order_id, status FROM charge WHERE order_id = ANY($1::int8[])`
	var rows []struct {
		EventID string `db:"event_id"`
		OrderID int64  `db:"order_id"`
		Status  string `db:"status"`
	}
	if err := tx.SelectContext(ctx, &rows, q, pq.Int64Array(orderIDs)); err != nil {
		return nil, nil, fmt.Errorf("select charges: %w", err)
	}
	paid = make(map[int64]bool, len(orderIDs))
	settled = make(map[string]bool, len(rows))
	for _, r := range rows {
		settled[r.EventID] = true
		if r.Status == "succeeded" {
			paid[r.OrderID] = true
		}
	}
	return paid, settled, nil
}

// chargeRows holds the charge table's columns as arrays, so that a whole
// batch is recorded in one statement.
type chargeRows struct {
	eventIDs, currencies, statuses, providerIDs pq.StringArray
	orderIDs, customerIDs, amounts              pq.Int64Array
}

func insertCharges(ctx context.Context, tx *sqlx.Tx, events []order.Event, outcomes []Outcome, charges []payment.Charge) error {
	const q = `
INSERT INTO charge (event_id, order_id, customer_id, amount_minor, currency, status, provider_charge_id)
SELECT e, o, c, a, cur, s, NULLIF(p, '')
FROM unnest($1::uuid[], $2::int8[], $3::int8[], $4::int8[], $5::text[], $6::text[], $7::text[]) AS t(e, o, c, a, cur, s, p)
ON CONFLICT (event_id) DO NOTHING`

	var rows chargeRows
	for i, ev := range events {
		var status string
		switch outcomes[i] {
		case Charged:
			status = "succeeded"
		case Declined:
			status = "declined"
		default:
			continue
		}
		rows.eventIDs = append(rows.eventIDs, ev.ID.String())
		rows.orderIDs = append(rows.orderIDs, ev.OrderID)
		rows.customerIDs = append(rows.customerIDs, ev.CustomerID)
		rows.amounts = append(rows.amounts, ev.Amount.Minor)
		rows.currencies = append(rows.currencies, ev.Amount.Currency)
		rows.statuses = append(rows.statuses, status)
		rows.providerIDs = append(rows.providerIDs, charges[i].ID)
	}
	if len(rows.eventIDs) == 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, q, rows.eventIDs, rows.orderIDs, rows.customerIDs,
		rows.amounts, rows.currencies, rows.statuses, rows.providerIDs); err != nil {
		return fmt.Errorf("insert charge: %w", err)
	}
	return nil
}
