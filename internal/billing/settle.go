package billing

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel/trace"

	"example.com/billing/internal/charge"
	"example.com/billing/internal/dlq/reason"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/order"
	"example.com/billing/internal/outbox"
	"example.com/billing/internal/payment"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/tracing"
)

// settler settles the calls of the attempts this process is completing
// (phase 3) and keeps one call per attempt, so that an event needing an
// attempt in flight waits for it rather than asking the provider a second
// time. It runs every phase's transaction (tx.go). A Processor settles
// its messages' calls with it; its Recoverer shares it, so that within one
// process the consumer and recovery never send the same attempt at once.
type settler struct {
	db      *sqlx.DB
	metrics *metrics.Metrics
	tracer  trace.Tracer
	log     *slog.Logger
	now     func() time.Time

	// writes knows whether the database refuses writes (a full disk),
	// which only failing transactions tell.
	writes postgres.Writes

	// wallet is the provider whose saved payment methods the requests
	// charge (payment_method.provider), "" when they need none.
	wallet string
	// resolveAfter is how long an in_progress attempt waits for the
	// provider's notification before it is looked up (Horizon.ResolveAfter).
	resolveAfter time.Duration

	mu sync.Mutex
	// active are the attempts this process is completing (charging or
	// settling).
	active map[uuid.UUID]*call

	// woken is signalled when a settle recorded an attempt that no message
	// sends (waiting.go): recovery sends it (Recoverer.Woken).
	woken chan struct{}
}

func newSettler(db *sqlx.DB, payer Payer, resolveAfter time.Duration, m *metrics.Metrics, tp trace.TracerProvider, log *slog.Logger) *settler {
	s := &settler{db: db, metrics: m, tracer: tp.Tracer("example.com/billing/internal/billing"), log: log,
		now: time.Now, active: map[uuid.UUID]*call{}, resolveAfter: resolveAfter, woken: make(chan struct{}, 1)}
	if w, ok := payer.(walletBound); ok {
		s.wallet = w.Wallet()
	}
	return s
}

// settleBatch runs phase 3 for calls in one transaction, then ends each
// call settled: the tries waiting for it read what it recorded (decide).
//
// A transaction that fails is not the provider's fault: its calls keep
// their answers, and a batch is settled again one call at a time, so that
// a call the database refuses holds no other. It returns the calls still
// unsettled, their waiters still waiting, for the caller to settle again
// (settleLater) rather than ask the provider a second time.
func (s *settler) settleBatch(ctx context.Context, calls []*call) (unsettled []*call) {
	s.mu.Lock()
	for _, c := range calls {
		c.counted = c.countedFor
	}
	s.mu.Unlock()
	if err := s.settle(ctx, calls); err != nil {
		if len(calls) == 1 {
			calls[0].settles++
			calls[0].settleErr = err
			return calls
		}
		for _, c := range calls {
			unsettled = append(unsettled, s.settleBatch(ctx, []*call{c})...)
		}
		return unsettled
	}
	for _, c := range calls {
		s.end(c, nil)
	}
	return nil
}

// settleLater settles c again after a backoff, with the answer it holds,
// as long as the writers run; each failed settle counts as a database
// retry. A call that sent nothing has no answer to keep: it is given up,
// its waiters left Pending, as a failed claim leaves them.
func (p *Processor) settleLater(c *call) {
	if !c.sent {
		p.end(c, c.settleErr)
		return
	}
	p.metrics.Retries.WithLabelValues("database").Inc()
	if now := time.Now().UnixNano(); now-p.settleWarned.Load() >= int64(time.Second) { // once a second, not once per call of an outage
		p.settleWarned.Store(now)
		p.log.Warn("cannot record a provider's answer; keeping it and trying again (the provider is not asked again)",
			"event_id", c.a.EventID.String(), "order_id", c.a.OrderID, "tries", c.settles, "err", c.settleErr)
	}
	wait := min(100*time.Millisecond<<min(c.settles-1, 6), 5*time.Second)
	wait = wait/2 + rand.N(wait/2+1) // jitter: many calls failed at once
	time.AfterFunc(wait, func() { p.toSettle(c) })
}

// settle records every answer of calls in one transaction, counts an
// unanswered request on its attempt, and reads back what is recorded
// (another worker may have settled an attempt first; the provider gave it
// the same answer). calls' attempts then hold the recorded state. An answer
// is recorded as counted for its own event's message when that message
// waits for it (charge.counted_by), and for nobody otherwise: the event's
// message counts it when it comes. A deferred attempt's outcome (its
// message was finished while the provider held the payment) is counted
// here, and the events that waited for its order are decided with it.
func (s *settler) settle(ctx context.Context, calls []*call) error {
	byID := make(map[uuid.UUID]*call, len(calls))
	var answers []charge.Answer
	var all []uuid.UUID
	var spans []trace.SpanContext
	now := s.now()
	for _, c := range calls {
		byID[c.a.EventID] = c
		all = append(all, c.a.EventID)
		spans = append(spans, c.trace)
		if !c.sent {
			continue
		}
		answers = append(answers, s.answerOf(c, now))
	}
	var recorded []charge.Row
	var changed []charge.Change
	var decided waiterCounts
	err := s.inTx(ctx, "settle", spans, func(tx *sqlx.Tx) error {
		var err error
		if changed, err = charge.Settle(ctx, tx, answers); err != nil {
			return err
		}
		// The outcome is announced with the settle that records it, once:
		// only this transaction moved these attempts out of pending.
		var outcomes []outbox.Event
		for _, ch := range changed {
			if !charge.Open(ch.Status) {
				outcomes = append(outcomes, s.announcement(byID[ch.EventID], ch.Status))
			}
		}
		if err := outbox.Record(ctx, tx, outcomes); err != nil {
			return err
		}
		if decided, err = s.decideWaiters(ctx, tx, changed); err != nil {
			return err
		}
		recorded, err = charge.Get(ctx, tx, all)
		return err
	})
	if err != nil {
		return err
	}
	for _, a := range recorded {
		if c, ok := byID[a.EventID]; ok {
			c.a = a
		}
	}
	for _, ch := range changed {
		c, ok := byID[ch.EventID]
		if !ok {
			continue
		}
		if !charge.Open(ch.Status) {
			c.settledHere = true
		}
		if ch.Deferred && !charge.Open(ch.Status) {
			s.countDeferred(ch.Status)
		}
	}
	decided.count(s.metrics)
	if decided.promoted > 0 {
		select {
		case s.woken <- struct{}{}:
		default:
		}
	}
	return nil
}

// answerOf is what c's answer records on its attempt.
func (s *settler) answerOf(c *call, now time.Time) charge.Answer {
	a := charge.Answer{EventID: c.a.EventID, Status: charge.Pending, Requests: c.requests, ProviderChargeID: c.out.Ref}
	out := c.out
	switch {
	case c.err != nil:
		a.Err = c.err.Error()
	case out.Kind == payment.Succeeded:
		a.Status = charge.Succeeded
	case out.Kind == payment.Declined:
		a.Status, a.Err, a.DeclineCode = charge.Declined, declineText(out), out.Code
	case out.Kind == payment.Rejected:
		a.Status, a.Err = charge.Rejected, rejectText(out)
	case out.Kind == payment.InProgress:
		a.Status, a.ResolveAt, a.Err = charge.InProgress, cmp.Or(c.next, now.Add(s.resolveAfter)), out.Detail
	case out.Kind == payment.Indeterminate && c.a.Indeterminate > 0:
		// Sent again (its one re-send taken: resend) and the provider
		// still has no verdict: look the payment up, at once, instead.
		a.Status, a.ResolveAt, a.Err = charge.InProgress, now, "indeterminate: "+out.Detail
	case out.Kind == payment.Indeterminate:
		a.Indeterminate, a.Err = true, "indeterminate: "+out.Detail
	default:
		a.Err = "no verdict from the provider"
	}
	if c.counted != nil && !charge.Open(a.Status) {
		a.CountedBy = c.counted.counter
	}
	return a
}

// errResendTaken: another worker took the one re-send of an attempt whose
// first answer had no verdict; this one waits for that answer.
var errResendTaken = payment.Transient("indeterminate", 0, errors.New("the attempt's one re-send after an answer without a verdict is another worker's"))

// resend reports whether c's request may go out. An attempt whose first
// answer had no verdict (indeterminate) is sent again once, by one worker
// of every replica: the one that takes the re-send in the table. One sent
// again already is never sent a third time: it is answered here as
// indeterminate, which settles it in_progress with its lookup due now.
func (s *settler) resend(ctx context.Context, c *call) bool {
	switch c.a.Indeterminate {
	case 0:
		return true
	case 1:
		took, err := charge.TakeResend(ctx, s.db, c.a.EventID)
		switch {
		case err != nil:
			c.err = err
		case !took:
			c.err = errResendTaken
		default:
			c.a.Indeterminate = 2
			return true
		}
		return false
	}
	c.sent, c.out = true, payment.Outcome{Kind: payment.Indeterminate, Detail: "sent again once already; looked up instead"}
	return false
}

// declineText and rejectText are what last_error keeps of a decline and a
// refusal.
func declineText(out payment.Outcome) string {
	return strings.TrimSpace("declined " + out.Code + ": " + out.Detail)
}

func rejectText(out payment.Outcome) string {
	if out.Code != "" {
		return out.Code + ": " + out.Detail
	}
	return out.Detail
}

// countDeferred counts the outcome of a deferred attempt, whose message
// was finished before it was known. A refused one is counted invalid, as
// every event that ends in payment.failed.v1 is, although its message was
// committed and cannot be parked any more.
func (s *settler) countDeferred(status string) {
	label := map[string]string{charge.Succeeded: metrics.OutcomeCharged, charge.Declined: metrics.OutcomeDeclined,
		charge.Rejected: metrics.OutcomeInvalid}[status]
	if label != "" {
		s.metrics.Events.WithLabelValues(label).Inc()
	}
}

// announcement is the payment outcome event of c's attempt, settled here as
// status.
func (s *settler) announcement(c *call, status string) outbox.Event {
	a := c.a
	ev := order.Event{ID: a.EventID, OrderID: a.OrderID, CustomerID: a.CustomerID,
		Amount: order.Money{Minor: a.Amount, Currency: a.Currency}}
	typ := map[string]string{charge.Succeeded: outbox.Succeeded, charge.Declined: outbox.Declined, charge.Rejected: outbox.Failed}[status]
	var why string
	if status == charge.Rejected {
		why = string(reason.ProviderRejected)
	}
	o := outbox.NewEvent(typ, ev, why, s.now())
	switch status {
	case charge.Succeeded:
		o.ProviderChargeID = cmp.Or(c.out.Ref, deref(a.ProviderChargeID))
	case charge.Declined:
		o.DeclineCode = c.out.Code
	}
	sc := c.trace
	if c.counted != nil {
		sc = c.counted.trace // the attempt's own event
	}
	o.Traceparent = tracing.Traceparent(sc)
	return o
}
