package billing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gofrs/uuid/v5"
	"go.opentelemetry.io/otel/trace"

	"example.com/billing/internal/charge"
	"example.com/billing/internal/order"
	"example.com/billing/internal/payment"
)

// newAttemptOf is the pending charge attempt of ev.
func newAttemptOf(ev order.Event) charge.Row {
	return charge.Row{EventID: ev.ID, OrderID: ev.OrderID, CustomerID: ev.CustomerID,
		Amount: ev.Amount.Minor, Currency: ev.Amount.Currency, Status: charge.Pending, CreatedAt: time.Now()}
}

// request is the provider request of attempt a: the same bytes whoever
// sends it, so that the provider recognises a repeat.
func request(a charge.Row) payment.Request {
	return payment.Request{IdempotencyKey: a.EventID.String(), OrderID: a.OrderID,
		CustomerID: a.CustomerID, Amount: a.Amount, Currency: a.Currency,
		CustomerRef: deref(a.CustomerRef), PaymentMethodRef: deref(a.PaymentMethodRef)}
}

// lookup is what the provider is asked about attempt a.
func lookup(a charge.Row) payment.Lookup {
	return payment.Lookup{Request: request(a), Ref: deref(a.ProviderChargeID), Created: a.CreatedAt}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// sameRequest reports whether ev asks for the charge a records.
func sameRequest(a charge.Row, ev order.Event) bool {
	return a.OrderID == ev.OrderID && a.CustomerID == ev.CustomerID &&
		a.Amount == ev.Amount.Minor && a.Currency == ev.Amount.Currency
}

// outcomeOf is the event outcome an attempt's status stands for.
func outcomeOf(status string) Outcome {
	switch status {
	case charge.Succeeded:
		return Charged
	case charge.Declined:
		return Declined
	case charge.Rejected:
		return Parked
	}
	return Pending
}

// call is one attempt this process completes: phase 2's request and
// answer, then what phase 3 recorded, and the events waiting for it.
type call struct {
	a       charge.Row
	trace   trace.SpanContext // of the first event waiting for it
	fromRow bool              // read pending from the table, not recorded by this claim
	// waiters are the events decided once the attempt is settled; more
	// may join while it is in flight (guarded by settler.mu).
	waiters []*job
	// countedFor is the waiter whose message counts the outcome when this
	// process settles it: the first copy of the attempt's own event; nil
	// when none waits for it here.
	countedFor *job

	sent bool // the request went out (or, for a notification or a lookup, the answer came)
	// requests is 1 when the answer is a provider request's, 0 for a
	// notification's or a lookup's.
	requests int
	out      payment.Outcome // what the provider said, when it answered
	err      error           // why there is no answer: transient, or not sent
	expired  bool            // older than the provider's idempotency window: not sent
	// next, for an in_progress answer of a lookup, is when to look again
	// (zero: PAYMENT_RESOLVE_AFTER from now).
	next time.Time
	// lookupErr is why a lookup of the attempt failed, for recovery's log.
	lookupErr error
	// settles counts the settles that failed, settleErr says why the
	// last did: the answer is kept and settled again, never asked again.
	settles   int
	settleErr error
	// counted is countedFor as the settle found it when it began: the
	// waiter its update recorded as counting the outcome.
	counted *job
	// settledHere: the settle moved the attempt out of pending; otherwise
	// another worker recorded the answer first.
	settledHere bool
}

func newCall(a charge.Row, fromRow bool) *call {
	return &call{a: a, fromRow: fromRow}
}

// answered records the answer of c's request.
func (c *call) answered(out payment.Outcome, err error) {
	c.sent, c.requests, c.out, c.err = true, 1, out, err
}

// unanswered says why an attempt whose request was answered stays pending:
// the provider stored an answer without a verdict, which is sent once
// more before billing looks the payment up; nil otherwise.
func (c *call) unanswered() error {
	if c.err == nil && c.out.Kind == payment.Indeterminate {
		return payment.Transient("indeterminate", 0, fmt.Errorf("the provider stored an answer without a verdict (%s); asking once more under the same key", c.out.Detail))
	}
	return nil
}

// send runs phase 2 for c: its request, with no transaction open, as soon
// as the payment client has a slot (PAYMENT_MAX_CONCURRENCY,
// PAYMENT_MAX_RPS); the answer goes to a settle. The request is sent only
// if one of c's waiters still wants it then (wanted), and runs under ctx,
// the processor's, not a waiter's: once sent, it is answered and settled
// whatever becomes of the messages (a partition revoked, a shutdown within
// its drain). An attempt this process is already completing is not asked
// twice: c's waiters wait for that call instead. send reports whether c
// itself went on.
func (p *Processor) send(ctx context.Context, c *call) bool {
	if !p.activate(c) {
		return false
	}
	id := c.a.EventID
	window := p.horizon.ProviderWindow
	switch {
	case p.now().Sub(c.a.CreatedAt) > window:
		c.expired = true
		p.log.Error("charge attempt older than the provider's idempotency window; not retried blindly (reconcile it)",
			"event_id", id.String(), "order_id", c.a.OrderID, "created_at", c.a.CreatedAt, "window", window.String())
	case c.a.Status != charge.Pending:
		// Settled or in progress since the claim read it (skipSettled):
		// the settle reads what was recorded.
	default:
		p.callers.do(func() {
			if err := p.wanted(c); err != nil {
				c.err = err // not sent: left pending
			} else if p.resend(ctx, c) {
				// Asked again once the request has its turn, which a rate
				// limit can make seconds later: a partition lost meanwhile
				// sends nothing more.
				req := request(c.a)
				req.Ready = func() error {
					if err := withinWindow(p.now(), c.a, p.horizon.ProviderWindow); err != nil {
						return err
					}
					return p.wanted(c)
				}
				c.answered(p.payer.Charge(trace.ContextWithSpanContext(ctx, c.trace), req))
				if errors.Is(c.err, payment.ErrNotSent) {
					c.sent = false // left pending
				}
			}
			p.toSettle(c)
		})
		return true
	}
	p.toSettle(c)
	return true
}

// errPastWindow: an attempt's request had its turn only after the
// provider's idempotency window passed (a long wait for a slot or the rate
// limit); it is not sent, as no attempt past the window is.
var errPastWindow = errors.New("billing: the charge attempt passed the provider's idempotency window before its request had its turn; not sent")

// withinWindow returns errPastWindow once a is older than the provider's
// idempotency window: asked so when a request has its turn, it bounds how
// long after the window a request of billing's may be in flight to
// PAYMENT_TIMEOUT, which billing resolve relies on.
func withinWindow(now time.Time, a charge.Row, window time.Duration) error {
	if now.Sub(a.CreatedAt) > window {
		return errPastWindow
	}
	return nil
}

// wanted returns nil while one of c's waiters still wants its request sent,
// else why none does; nil for a call without waiters.
func (p *Processor) wanted(c *call) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var why error
	for _, j := range c.waiters {
		err := j.gone()
		if err == nil {
			return nil
		}
		why = err
	}
	return why
}

// activate registers c as the call completing its attempt and reports
// true, or hands its waiters to the call already doing so and reports
// false.
func (s *settler) activate(c *call) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	busy, ok := s.active[c.a.EventID]
	if !ok {
		s.active[c.a.EventID] = c
		return true
	}
	busy.waiters = append(busy.waiters, c.waiters...)
	if busy.countedFor == nil {
		busy.countedFor = c.countedFor
	}
	return false
}

// toSettle queues c for phase 3.
func (p *Processor) toSettle(c *call) {
	if !p.settles.push(c) {
		p.abandon(c, ErrStopped)
	}
}

// abandon gives c up unsettled: its waiters are left Pending with err, and
// the attempt stays pending in the table for a retry or maintenance.
func (s *settler) abandon(c *call, err error) {
	s.mu.Lock()
	if s.active[c.a.EventID] == c {
		delete(s.active, c.a.EventID)
	}
	waiters := c.waiters
	s.mu.Unlock()
	for _, j := range waiters {
		j.finish(err)
	}
}

// skipSettled marks the calls of attempts that were read pending but are
// settled by now: another copy of the event, another process or
// maintenance recorded the answer between the claim and this call. Asking
// again would be answered from the provider's store, but costs a request
// of the provider's rate limit for nothing. (A race that slips between
// this check and the request is still safe: same key, same body.)
func (p *Processor) skipSettled(ctx context.Context, calls []*call) {
	var ids []uuid.UUID
	byID := map[uuid.UUID]*call{}
	for _, c := range calls {
		if c.fromRow {
			ids = append(ids, c.a.EventID)
			byID[c.a.EventID] = c
		}
	}
	if len(ids) == 0 {
		return
	}
	settled, err := charge.Settled(ctx, p.db, ids)
	if err != nil {
		return // ask the provider: it knows
	}
	for id, status := range settled {
		byID[id].a.Status = status
	}
}

func expiredDetail(a charge.Row, own bool, window time.Duration) string {
	whose := "its charge attempt"
	if !own {
		whose = fmt.Sprintf("order %d has a charge attempt (event %s)", a.OrderID, a.EventID)
	}
	return fmt.Sprintf("%s from %s is still unanswered and older than the provider's idempotency window %s: asking again could charge twice, so it is never sent again; billing looks it up at the provider and settles it with what the provider says (one the provider cannot find needs a human: docs/operations.md, an unresolved charge attempt); replay this event once it is settled",
		whose, a.CreatedAt.UTC().Format(time.RFC3339), window)
}
