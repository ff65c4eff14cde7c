package billing

import (
	"context"
	"fmt"

	"github.com/gofrs/uuid/v5"

	"example.com/billing/internal/charge"
	"example.com/billing/internal/payment"
)

// Noticed is what Notify did with a provider's notifications.
type Noticed struct {
	// Settled counts the notifications that recorded an outcome, NoNews
	// those whose outcome was recorded already (by the attempt's own
	// answer, a lookup, the same notification before) or that name no
	// attempt of billing's.
	Settled, NoNews int
}

// Notify records the outcomes a provider announced on its own (its
// webhook), through the same settle as a direct answer: the attempt moves
// out of pending or in_progress once, its outcome event is recorded once,
// and the events that waited for its order are decided. A notification of
// an attempt already settled, or of a payment billing does not know, is no
// news. It returns once everything is committed; an error means some
// outcome was not recorded, and the provider should send the notification
// again.
func (s *settler) Notify(ctx context.Context, notes []payment.Notification) (Noticed, error) {
	var done Noticed
	// Every payment billing asks for carries its attempt's key (Stripe's
	// metadata[event_id], Adyen's reference): a notification without one
	// is of a payment made elsewhere on the account.
	var ids []uuid.UUID
	for _, n := range notes {
		if id, err := uuid.FromString(n.IdempotencyKey); err == nil {
			ids = append(ids, id)
		}
	}
	rows, err := charge.Get(ctx, s.db, ids)
	if err != nil {
		return done, err
	}
	byID := make(map[uuid.UUID]charge.Row, len(rows))
	for _, a := range rows {
		byID[a.EventID] = a
	}
	calls := map[uuid.UUID]*call{}
	var order []*call
	for _, n := range notes {
		a, ok := byID[uuid.FromStringOrNil(n.IdempotencyKey)]
		if !ok || !charge.Open(a.Status) || !n.Outcome.Kind.Final() {
			done.NoNews++
			continue
		}
		if _, twice := calls[a.EventID]; twice { // the same outcome twice in one batch
			done.NoNews++
			continue
		}
		c := newCall(a, true)
		c.sent, c.out = true, n.Outcome
		calls[a.EventID] = c
		order = append(order, c)
	}
	if len(order) == 0 {
		return done, nil
	}
	if unsettled := s.settleBatch(ctx, order); len(unsettled) > 0 {
		return done, fmt.Errorf("record %d of %d notified outcomes: %w", len(unsettled), len(order), unsettled[0].settleErr)
	}
	for _, c := range order {
		if c.settledHere {
			done.Settled++
		} else {
			done.NoNews++ // settled by someone else meanwhile
		}
	}
	return done, nil
}
