package billing

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
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

	// onSettled sends on an event that waited for a call, once the call
	// is settled (Processor.decide). Only a Processor's calls have
	// waiters: a recoverer of its own (maintain) leaves it nil.
	onSettled func(c *call, j *job)

	mu sync.Mutex
	// active are the attempts this process is completing (charging or
	// settling).
	active map[uuid.UUID]*call
}

func newSettler(db *sqlx.DB, m *metrics.Metrics, tp trace.TracerProvider, log *slog.Logger) *settler {
	return &settler{db: db, metrics: m, tracer: tp.Tracer("example.com/billing/internal/billing"), log: log,
		now: time.Now, active: map[uuid.UUID]*call{}}
}

// settleBatch runs phase 3 for calls in one transaction, then decides the
// events that waited for them: an event whose own attempt this settle
// recorded gets its outcome; one that waited for another attempt of its
// order, or whose attempt someone else settled first, is claimed again;
// one whose request is still unanswered is left Pending for the caller's
// retry, which resumes the attempt under the same key.
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
		s.mu.Lock()
		if s.active[c.a.EventID] == c {
			delete(s.active, c.a.EventID)
		}
		waiters := c.waiters
		s.mu.Unlock()
		for _, j := range waiters {
			s.onSettled(c, j)
		}
	}
	return nil
}

// settleLater settles c again after a backoff, with the answer it holds,
// as long as the writers run; each failed settle counts as a database
// retry. A call that sent nothing has no answer to keep: it is given up,
// its waiters left Pending, as a failed claim leaves them.
func (p *Processor) settleLater(c *call) {
	if !c.sent {
		p.abandon(c, c.settleErr)
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
// message counts it when it comes.
func (s *settler) settle(ctx context.Context, calls []*call) error {
	byID := make(map[uuid.UUID]*call, len(calls))
	var answers []charge.Answer
	var all []uuid.UUID
	var spans []trace.SpanContext
	for _, c := range calls {
		byID[c.a.EventID] = c
		all = append(all, c.a.EventID)
		spans = append(spans, c.trace)
		if !c.sent {
			continue
		}
		a := charge.Answer{EventID: c.a.EventID, Status: charge.Pending, ProviderChargeID: c.charge.ID}
		switch {
		case c.err == nil:
			a.Status = charge.Succeeded
		case errors.Is(c.err, payment.ErrDeclined):
			a.Status, a.Err = charge.Declined, c.err.Error()
		case errors.Is(c.err, payment.ErrRejected):
			a.Status, a.Err = charge.Rejected, c.err.Error()
		default:
			a.Err = c.err.Error()
		}
		if c.counted != nil && a.Status != charge.Pending {
			a.CountedBy = c.counted.res.counter
		}
		answers = append(answers, a)
	}
	var recorded []charge.Row
	var changed map[uuid.UUID]string
	err := s.inTx(ctx, "settle", spans, func(tx *sqlx.Tx) error {
		var err error
		if changed, err = charge.Settle(ctx, tx, answers); err != nil {
			return err
		}
		// The outcome is announced with the settle that records it, once:
		// only this transaction moved these attempts out of pending.
		var outcomes []outbox.Event
		for id, status := range changed {
			if status != charge.Pending {
				outcomes = append(outcomes, s.announcement(byID[id], status))
			}
		}
		if err := outbox.Record(ctx, tx, outcomes); err != nil {
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
	for id, status := range changed {
		if c, ok := byID[id]; ok && status != charge.Pending {
			c.settledHere = true
		}
	}
	return nil
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
		o.ProviderChargeID = c.charge.ID
	case charge.Declined:
		o.DeclineCode = payment.DeclineCode(c.err)
	}
	sc := c.trace
	if c.counted != nil {
		sc = c.counted.res.trace // the attempt's own event
	}
	o.Traceparent = tracing.Traceparent(sc)
	return o
}
