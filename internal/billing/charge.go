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
// answer, then what phase 3 recorded, and the tries waiting for it. It is
// the one call of its attempt in this process (settler.active) from join
// or activate until ended is closed: settled, or given up.
type call struct {
	// id is the attempt's event id, a.EventID, fixed at construction: a
	// claim hands one call to every copy of its event in the batch, so
	// join and end read it while the call's settle rewrites a.
	id      uuid.UUID
	a       charge.Row
	trace   trace.SpanContext // of the first event waiting for it
	fromRow bool              // read pending from the table, not recorded by this claim
	// waiters are the tries that joined the call, more of them while it
	// is in flight: its request is sent while one of them still wants it
	// (wanted); one that gave up stays, and says so (try.gone) (guarded by
	// settler.mu).
	waiters []*try
	// countedFor is the waiter whose message counts the outcome when this
	// process settles it: the first copy of the attempt's own event; nil
	// when none waits for it here (guarded by settler.mu).
	countedFor *try
	// left: the request is on its way to the provider (its Leave passed),
	// so it is answered and settled whoever still waits (guarded by
	// settler.mu).
	left bool
	// over: ended is closed (guarded by settler.mu).
	over  bool
	ended chan struct{}

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
	// gaveUp, once ended is closed, says why the call was given up
	// unsettled (end with an error): its attempt stays as the table has it.
	gaveUp error
	// counted is countedFor as the settle found it when it began: the
	// waiter its update recorded as counting the outcome.
	counted *try
	// settledHere: the settle moved the attempt out of pending; otherwise
	// another worker recorded the answer first.
	settledHere bool
}

func newCall(a charge.Row, fromRow bool) *call {
	return &call{id: a.EventID, a: a, fromRow: fromRow, ended: make(chan struct{})}
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

// join makes t wait for c's attempt: c becomes the attempt's call and t
// its leader, which sends the request (lead), unless a call of this
// process completes the attempt already (another event's, recovery's),
// which t waits for instead. A call that ended is not started again: t
// reads what it recorded.
func (s *settler) join(c *call, t *try) (joined *call, lead bool) {
	id := c.id
	s.mu.Lock()
	defer s.mu.Unlock()
	if busy, ok := s.active[id]; ok {
		c = busy
	} else if !c.over {
		s.active[id] = c
		lead = true
	}
	c.waiters = append(c.waiters, t)
	if c.countedFor == nil && id == t.res.Event.ID {
		c.countedFor = t // its own event's first copy counts the outcome
	}
	return c, lead
}

// activate registers c, which no event waits for (recovery's), as the call
// completing its attempt and reports true, or false when another call does
// so already.
func (s *settler) activate(c *call) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.active[c.id]; ok {
		return false
	}
	s.active[c.id] = c
	return true
}

// hasLeft reports whether c's request went to the provider.
func (s *settler) hasLeft(c *call) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return c.left
}

// end closes c: it is no longer its attempt's call, and its waiters read
// what it recorded, or, when gaveUp is not nil, why it was given up
// unsettled: they are left Pending with it, and the attempt stays pending
// in the table for a retry or maintenance.
func (s *settler) end(c *call, gaveUp error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.over {
		return
	}
	if s.active[c.id] == c {
		delete(s.active, c.id)
	}
	c.gaveUp, c.over = gaveUp, true
	close(c.ended)
}

// send runs phase 2 for c, which t leads: the request, with no
// transaction open, on a caller (at most as many at once as the payment
// client has slots, PAYMENT_MAX_CONCURRENCY), once the payment client
// gives it its turn (PAYMENT_MAX_RPS and the fleet's share, no pause of
// charging), and only if one of c's waiters still wants it then (wanted);
// then c goes to its settle (phase 3). It runs under no caller's
// cancellation: once it has left (Ready passed) it is answered (within
// PAYMENT_TIMEOUT) and settled whatever becomes of the messages (a
// partition revoked, a shutdown within its drain); until then its waiters
// may give it up, and Ready then keeps it unsent.
func (p *Processor) send(t *try, c *call) {
	window := p.horizon.ProviderWindow
	switch {
	case p.now().Sub(c.a.CreatedAt) > window:
		c.expired = true
		p.log.Error("charge attempt older than the provider's idempotency window; not retried blindly (reconcile it)",
			"event_id", c.a.EventID.String(), "order_id", c.a.OrderID, "created_at", c.a.CreatedAt, "window", window.String())
	case c.a.Status != charge.Pending:
		// Settled or in progress since the claim read it (skipSettled):
		// the settle reads what was recorded.
	default:
		ctx := trace.ContextWithSpanContext(context.WithoutCancel(t.ctx), c.trace)
		p.callers.do(func() {
			if err := p.wanted(c); err != nil {
				c.err = err // not sent: left pending
			} else if p.resend(ctx, c) {
				p.charge(ctx, c)
			}
			p.toSettle(c)
		})
		return
	}
	p.toSettle(c)
}

// charge asks the provider for c's attempt.
func (p *Processor) charge(ctx context.Context, c *call) {
	req := request(c.a)
	// Asked again while the request waits for its turn, which a rate limit
	// or a pause can make seconds later, and once it has it (Leave): a
	// partition lost meanwhile sends nothing more.
	withinWindowAnd := func(check func(*call) error) func() error {
		return func() error {
			if err := withinWindow(p.now(), c.a, p.horizon.ProviderWindow); err != nil {
				return err
			}
			return check(c)
		}
	}
	req.Ready, req.Leave = withinWindowAnd(p.wanted), withinWindowAnd(p.leave)
	c.answered(p.payer.Charge(ctx, req))
	if errors.Is(c.err, payment.ErrNotSent) {
		c.sent = false // left pending
	}
}

// leave lets c's request go while one of its waiters still wants it: from
// then on they wait for its settle whatever their callers do.
func (s *settler) leave(c *call) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.wantedLocked(c); err != nil {
		return err
	}
	c.left = true
	return nil
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
func (s *settler) wanted(c *call) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.wantedLocked(c)
}

// wantedLocked is wanted with s.mu held.
func (s *settler) wantedLocked(c *call) error {
	var why error
	for _, t := range c.waiters {
		err := t.gone()
		if err == nil {
			return nil
		}
		why = err
	}
	return why
}

// toSettle queues c for phase 3.
func (p *Processor) toSettle(c *call) {
	if !p.settles.push(c) {
		p.end(c, ErrStopped)
	}
}

// skipSettled marks the calls of attempts that were read pending but are
// settled by now: another copy of the event, another process or
// maintenance recorded the answer between the claim and this call. Asking
// again would be answered from the provider's store, but costs a request
// of the provider's rate limit for nothing. (A race that slips between
// this check and the request is still safe: same key, same body.)
func (p *Processor) skipSettled(ctx context.Context, calls map[*call]bool) {
	var ids []uuid.UUID
	byID := map[uuid.UUID]*call{}
	for c := range calls {
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
