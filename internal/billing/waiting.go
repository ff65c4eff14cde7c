package billing

// An event whose order's payment the provider holds without a verdict
// (in_progress) neither charges nor holds its partition: the claim records
// it in charge_waiting and its message is finished (claim.go). The settle
// that records that payment's outcome decides the events that waited,
// under their order's lock: already charged when it succeeded, else the
// first of them becomes the order's next attempt, which recovery sends and
// whose own settle decides the rest.

import (
	"context"
	"fmt"
	"slices"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"

	"example.com/billing/internal/charge"
	"example.com/billing/internal/dlq/reason"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/order"
	"example.com/billing/internal/outbox"
	"example.com/billing/internal/wallet"
)

// waiterCounts is what decideWaiters decided, counted once the settle
// committed.
type waiterCounts struct {
	alreadyCharged int
	promoted       int
	// refused are events without a payment method, announced failed: their
	// messages were committed, so they are counted invalid without a
	// dead-letter message.
	refused int
}

func (w waiterCounts) count(m *metrics.Metrics) {
	if w.alreadyCharged > 0 {
		m.Events.WithLabelValues(metrics.OutcomeAlreadyCharged).Add(float64(w.alreadyCharged))
	}
	if w.refused > 0 {
		m.Events.WithLabelValues(metrics.OutcomeInvalid).Add(float64(w.refused))
	}
}

// decideWaiters decides, in the settle's transaction tx, the events that
// waited for the deferred attempts changed settled.
func (s *settler) decideWaiters(ctx context.Context, tx *sqlx.Tx, changed []charge.Change) (waiterCounts, error) {
	var done waiterCounts
	paid := map[int64]bool{}
	var orders []int64
	for _, ch := range changed {
		if ch.Deferred && !charge.Open(ch.Status) {
			paid[ch.OrderID] = ch.Status == charge.Succeeded
			orders = append(orders, ch.OrderID)
		}
	}
	if len(orders) == 0 {
		return done, nil
	}
	slices.Sort(orders)
	orders = slices.Compact(orders)
	// The claims that record waiters hold these locks: after them, every
	// waiter of these orders is committed and seen here.
	if err := lockOrders(ctx, tx, orders); err != nil {
		return done, err
	}
	waiters, err := charge.Waiters(ctx, tx, orders)
	if err != nil || len(waiters) == 0 {
		return done, err
	}
	methods, err := s.methodsOf(ctx, tx, waiters)
	if err != nil {
		return done, err
	}
	var decided []charge.Row // removed from charge_waiting
	var attempts []charge.Row
	var failures []outbox.Event
	next := map[int64]bool{} // orders whose next attempt is recorded
	for _, w := range waiters {
		switch {
		case paid[w.OrderID]:
			decided = append(decided, w)
			done.alreadyCharged++
		case next[w.OrderID]:
			// Waits on, for the attempt recorded below.
		default:
			a := w
			a.Status, a.Deferred = charge.Pending, true
			if s.wallet != "" {
				m, ok := methods[w.CustomerID]
				if !ok {
					a.Status = charge.Rejected
					why := noMethodDetail(s.wallet, w.CustomerID)
					a.LastError = &why
					failures = append(failures, outbox.NewEvent(outbox.Failed, eventOf(w), string(reason.NoPaymentMethod), s.now()))
					s.log.Error("an event that waited for its order's payment cannot be charged: the customer has no payment method; its payment.failed.v1 is published, and the order event must be published again once the card is imported",
						"event_id", w.EventID.String(), "order_id", w.OrderID, "customer_id", w.CustomerID)
					attempts, decided = append(attempts, a), append(decided, w)
					done.refused++
					continue // the next waiter may be charged
				}
				a.CustomerRef, a.PaymentMethodRef = &m.CustomerRef, &m.PaymentMethodRef
			}
			attempts, decided = append(attempts, a), append(decided, w)
			next[w.OrderID] = true
			done.promoted++
		}
	}
	ids := make([]uuid.UUID, 0, len(decided))
	for _, w := range decided {
		ids = append(ids, w.EventID)
	}
	if err := charge.Unwait(ctx, tx, ids); err != nil {
		return done, err
	}
	if err := charge.Insert(ctx, tx, attempts); err != nil {
		return done, err
	}
	return done, outbox.Record(ctx, tx, failures)
}

// methodsOf reads the saved payment methods of rows' customers, none for a
// provider that charges by customer id.
func (s *settler) methodsOf(ctx context.Context, tx *sqlx.Tx, rows []charge.Row) (map[int64]wallet.Method, error) {
	if s.wallet == "" || len(rows) == 0 {
		return nil, nil
	}
	customers := make([]int64, 0, len(rows))
	for _, r := range rows {
		customers = append(customers, r.CustomerID)
	}
	return wallet.Lookup(ctx, tx, s.wallet, customers)
}

// noMethodDetail is why an event whose customer has no saved payment
// method was not charged.
func noMethodDetail(provider string, customerID int64) string {
	return fmt.Sprintf("customer %d has no payment method for %s in payment_method; nothing was sent: import it (billing payment-methods import), then replay the event", customerID, provider)
}

// eventOf is the order event an attempt row records.
func eventOf(a charge.Row) order.Event {
	return order.Event{ID: a.EventID, OrderID: a.OrderID, CustomerID: a.CustomerID,
		Amount: order.Money{Minor: a.Amount, Currency: a.Currency}}
}
