// Package billing charges each confirmed order exactly once in effect.
//
// Kafka delivers at least once, and a payment provider's answer can be lost
// after it charged. Handle takes one event through three phases, top-down,
// and returns its outcome; it never holds a database transaction open
// while the provider thinks:
//
//  1. Claim (claim.go, one short transaction): record the event in the
//     dedup store and, for a first-seen event, a charge attempt in state
//     pending that holds the whole provider request. That row is the
//     recovery point.
//  2. Charge (charge.go, no transaction): call the provider for the
//     attempt, with Idempotency-Key = eventId, once the payment client
//     gives the request its turn.
//  3. Settle (settle.go, one short transaction): record the answer
//     (succeeded, declined, rejected, in progress) and its outcome event.
//     Only then may the caller mark the offset.
//
// Each event goes at its own pace, on its caller's goroutine: one slow
// answer holds no other event. The transactions are shared: the claim and
// the settle each wait in a queue (queue.go) that a few writers (Run) empty
// into one transaction for whatever waits, so under load one transaction
// serves many events of many partitions. An attempt is asked of the
// provider by one call at a time in this process: an event that needs an
// attempt another event (or recovery) is completing waits for that call's
// settle instead of asking again.
//
// Any worker can complete any pending attempt from its row alone: the same
// key and body make the provider replay its stored answer. So a redelivered
// event resumes its own attempt, an event that meets another event's
// pending attempt for its order completes that one first and is then
// claimed again, and maintenance (Recover) completes attempts a crash left
// behind. An attempt older than the provider's idempotency window is never
// retried blindly: it is reported for a human. A provider's notification
// (Notify), a lookup (Recoverer) and an operator's verdict (Hand) enter the
// same settle.
package billing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel/trace"

	"example.com/billing/internal/charge"
	"example.com/billing/internal/dedup"
	"example.com/billing/internal/dlq/reason"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/order"
	"example.com/billing/internal/payment"
)

// Payer charges through the payment provider (payment.Client). Its errors
// are transient: what the provider said is the Outcome.
type Payer interface {
	Charge(ctx context.Context, r payment.Request) (payment.Outcome, error)
	// Resolve asks the provider what became of an attempt whose outcome
	// billing does not know.
	Resolve(ctx context.Context, l payment.Lookup) (payment.Outcome, error)
}

// walletBound is a Payer whose requests charge a customer's saved payment
// method, kept in payment_method under the provider's name (Wallet); a
// Payer without it, or with "", charges by customer id.
type walletBound interface {
	Wallet() string
}

// pausable is a Payer whose charging an operator can pause
// (payment.Client): recovery then takes no attempt it would have to hold
// until the resume.
type pausable interface {
	// Paused reports whether charging is paused.
	Paused() bool
	// ResolveSends reports whether a lookup sends the payment again
	// (Adyen's), and so waits for the resume like a charge.
	ResolveSends() bool
}

// concurrencyBound is a Payer that sends at most Concurrency() requests at
// once (0: no bound), as the payment client does: billing then runs no
// more callers than that.
type concurrencyBound interface {
	Concurrency() int
}

// Horizon bounds what billing can judge without a human.
type Horizon struct {
	// Retention is how long the dedup store remembers an event. An event
	// id older than that may be a duplicate whose record was dropped: it is
	// parked as stale-event, never charged blindly.
	Retention time.Duration
	// MaxFutureSkew is how far ahead of this clock an event id may be.
	MaxFutureSkew time.Duration
	// ProviderWindow is how long the provider keeps an idempotency key
	// (PAYMENT_IDEMPOTENCY_WINDOW). A pending attempt older than that
	// could be charged a second time if asked again: it is reported, never
	// retried blindly.
	ProviderWindow time.Duration
	// ResolveAfter is how long an in_progress attempt waits for the
	// provider's notification before billing asks the provider about it
	// (PAYMENT_RESOLVE_AFTER).
	ResolveAfter time.Duration
}

// Fence says whether the consumer that handed a message over may still act
// on it: no longer once its partition may be another consumer's (the
// partition revoked or draining, a membership the coordinator no longer
// confirms). billing asks it before it sends a charge; a request already
// sent is never cut short by it (the provider may have charged: its answer
// is worth settling).
type Fence interface {
	Holds() bool
}

// Message is one consumed event to settle.
type Message struct {
	// ID names the message (consumer group, topic, partition, offset): the
	// same for every try of it, different for another copy of its event.
	// With it, a try that meets the outcome an earlier try of the same
	// message recorded without learning so (a commit whose answer was lost)
	// counts it; without it, every try is a message of its own.
	ID    string
	Event order.Event // decoded by the consumer (order.Parse)
	// Trace is the span of the message's processing; the transaction and
	// payment spans hang below it.
	Trace trace.SpanContext
	// Fence, when set, is asked before the event's charge is claimed and
	// sent; nil holds always.
	Fence Fence
}

// Processor charges the events of consumed messages (Handle).
type Processor struct {
	// settler runs the transactions and settles the calls, keeping one
	// call per attempt: the processor's Recoverer shares it.
	*settler
	dedup   *dedup.Store
	payer   Payer
	horizon Horizon

	// claims holds the events waiting for a claim, settles the calls
	// waiting for their settle; writers of each run their transactions.
	claims  *queue[*claimant]
	settles *queue[*call]
	writers int
	// callers send the calls' requests, as many at once as the payer
	// takes.
	callers *callers

	// settleWarned is when a failed settle was last logged (unix nanos).
	settleWarned atomic.Int64
	// oldClaimed counts the events older than a day claimed since
	// oldWarned (unix nanos), when that was last logged.
	oldClaimed, oldWarned atomic.Int64
	// instance tells this process's tries from another's in
	// charge.counted_by: a message redelivered to another process after a
	// crash was counted there (or lost with it), not here.
	instance string
}

// Transactions take at most maxBatch events (claims) or calls (settles):
// enough that a transaction's fixed cost is shared by many, few enough
// that it stays short.
const maxBatch = 128

// maxRounds bounds the claims of one Handle, while other attempts of its
// order come first; past it the event is left pending for the caller's
// retry.
const maxRounds = 8

// NewProcessor returns a Processor that records in db, deduplicates with
// store, charges through payer and parks events outside horizon. Run
// starts its writers, a quarter of db's connections for claims and as many
// for settles (at least one each). Its Recoverer completes the attempts
// left pending.
func NewProcessor(db *sqlx.DB, store *dedup.Store, payer Payer, horizon Horizon, m *metrics.Metrics, tp trace.TracerProvider, log *slog.Logger) *Processor {
	p := &Processor{settler: newSettler(db, payer, horizon.ResolveAfter, m, tp, log), dedup: store, payer: payer, horizon: horizon,
		claims: newQueue[*claimant](), settles: newQueue[*call](), writers: max(1, db.Stats().MaxOpenConnections/4),
		callers: &callers{}, instance: uuid.Must(uuid.NewV4()).String()}
	if b, ok := payer.(concurrencyBound); ok {
		p.callers.limit = b.Concurrency()
	}
	return p
}

// WriteRefusal says why the database refuses billing's writes (a full
// disk, no memory: postgres.Refuses), nil while it takes them. A server in
// that state answers every other check; readiness asks this.
func (p *Processor) WriteRefusal() error { return p.writes.Err() }

// ErrStopped: the processor stopped (Run returned) before the event was
// decided; it is left Pending.
var ErrStopped = errors.New("billing: the processor stopped")

// Run runs the writers that claim and settle events until ctx ends. Work
// still waiting then is left Pending, for the consumer's next owner.
func (p *Processor) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for range p.writers {
		wg.Go(func() {
			for batch := p.claims.take(ctx, maxBatch); batch != nil; batch = p.claims.take(ctx, maxBatch) {
				p.claimBatch(ctx, batch)
			}
		})
		wg.Go(func() {
			for batch := p.settles.take(ctx, maxBatch); batch != nil; batch = p.settles.take(ctx, maxBatch) {
				for _, c := range p.settleBatch(ctx, batch) {
					p.settleLater(c)
				}
			}
		})
	}
	wg.Wait()
	for _, cl := range p.claims.close() {
		cl.claimed(ErrStopped)
	}
	for _, c := range p.settles.close() {
		p.end(c, ErrStopped)
	}
}

// Handle takes m's event through the phases and returns its outcome:
// decided (Charged, Declined, Duplicate, AlreadyCharged, Parked,
// InProgress), or Pending with the reason, for the caller to retry later
// (the retry resumes the recorded attempt under the same key).
//
// It runs on the caller's goroutine and blocks: on the claim and the
// settle, which wait for a writer to record them with others (Run), and on
// the provider's answer. It returns Pending once ctx ends, unless the
// event's request was already sent: that one is answered and settled
// first, whoever asked for it, and its outcome is the caller's.
func (p *Processor) Handle(ctx context.Context, m Message) (Result, error) {
	t := p.newTry(ctx, &m)
	err := p.handle(t)
	return t.res, err
}

// handle runs t, unless the horizon parked it (nothing to record), and
// counts its result.
func (p *Processor) handle(t *try) error {
	if t.res.Outcome == Parked && !t.res.announced() {
		return t.tally(nil)
	}
	cl := t.claimant()
	return t.tally(p.phases(t, cl, p.toClaim(cl)))
}

// try is one Handle of a message: its event on its way through the
// phases.
type try struct {
	ctx     context.Context // the caller's: once it ends, nothing more is sent for the try
	fence   Fence           // the message's (Message.Fence)
	metrics *metrics.Metrics
	res     Result // what became of the event so far (its goroutine's)
	// counter and trace are res's, for the calls the try waits for to
	// read from their own goroutines.
	counter string
	trace   trace.SpanContext
}

// newTry checks m's event against the horizon: an event billing cannot
// judge is parked before any claim (whose failure the claim records).
func (p *Processor) newTry(ctx context.Context, m *Message) *try {
	t := &try{ctx: ctx, fence: m.Fence, metrics: p.metrics, counter: p.counter(m), trace: m.Trace}
	t.res.Event, t.res.trace, t.res.counter = m.Event, t.trace, t.counter
	if code, detail := p.outsideHorizon(m.Event, p.now()); code != "" {
		t.res.park(code, detail)
	}
	return t
}

// claimant is a try waiting for a claim's verdict. A claim writer decides
// on res, its copy of the try's result, and hands it back with the call
// of the attempt the event needs completed (its own, or another event's
// of its order; nil when the claim decided the event or left it
// undecided), or why the claim failed, by closing decided. The try may
// stop waiting first (its caller gave up): the writer then works on what
// nobody reads.
type claimant struct {
	t       *try // asked whether it is still wanted (gone), never written
	res     Result
	call    *call
	err     error
	decided chan struct{}
}

func (t *try) claimant() *claimant {
	return &claimant{t: t, res: t.res, decided: make(chan struct{})}
}

// claimed hands cl the claim's verdict (res and call set) or why the claim
// failed.
func (cl *claimant) claimed(err error) {
	cl.err = err
	close(cl.decided)
}

// toClaim queues cls for a claim, in order: one writer takes the ones
// pushed together into one transaction.
func (p *Processor) toClaim(cls ...*claimant) error {
	if !p.claims.push(cls...) {
		return ErrStopped
	}
	return nil
}

// phases runs t's rounds, cl being queued for its claim (unless queued
// says why not): the claim's verdict; for an event that needs an attempt
// completed, its charge and settle, and then what the settled attempt
// means for the event. An event that waited for another attempt of its
// order, or whose attempt someone else settled, is claimed again, and
// the next claim decides it.
func (p *Processor) phases(t *try, cl *claimant, queued error) error {
	if queued != nil {
		return queued
	}
	for round := 1; ; round++ {
		select {
		case <-cl.decided:
		case <-t.ctx.Done():
			return t.ctx.Err() // a claim under way commits without it; the retry resumes
		}
		if cl.err != nil {
			return cl.err
		}
		t.res = cl.res
		again := t.res.Outcome == Pending // decided in no way by this claim: claim it again
		if cl.call != nil {
			var err error
			if again, err = p.complete(t, cl.call); !again {
				return err
			}
		}
		if !again {
			return nil
		}
		if round == maxRounds {
			// Other partitions keep putting attempts in front of this order.
			return fmt.Errorf("billing: event %s still waits behind other attempts of order %d", t.res.Event.ID, t.res.Event.OrderID)
		}
		cl = t.claimant()
		if err := p.toClaim(cl); err != nil {
			return err
		}
	}
}

// complete has t's event wait for the attempt of c completed: by a call t
// leads when no call of this process is completing it (t starts its
// request, phase 2, which goes on to its settle, phase 3), else by the
// call that is. It then decides what the settled attempt means for t, or
// says that a new claim must (again).
func (p *Processor) complete(t *try, c *call) (again bool, err error) {
	c, lead := p.join(c, t)
	if lead {
		p.send(t, c)
	}
	select {
	case <-c.ended:
	case <-t.ctx.Done():
		if !p.hasLeft(c) {
			return false, t.ctx.Err() // nothing sent for it: left pending
		}
		<-c.ended // sent: its answer is settled, and the outcome is the caller's
	}
	return p.decide(c, t)
}

// decide says what c, settled (or given up), means for t's event: its
// outcome, Pending with why, or that a new claim decides it (again).
func (p *Processor) decide(c *call, t *try) (again bool, err error) {
	own := c.a.EventID == t.res.Event.ID
	switch {
	case c.gaveUp != nil:
		return false, c.gaveUp // not settled: the attempt stays as the table has it
	case c.expired:
		// Parked; the next claim records its failure, under its order's lock.
		t.res.park(reason.StaleEvent, expiredDetail(c.a, own, p.horizon.ProviderWindow))
		return true, nil
	case c.a.Status == charge.Pending:
		return false, cmp.Or(c.err, c.unanswered(), errUnanswered) // still unanswered: the caller retries
	case !own:
		return true, nil // the order's other attempt is settled or in progress: decide now
	case c.a.Status == charge.InProgress:
		// The provider holds the payment; its notification or a lookup
		// settles it, and that settle counts it.
		t.res.Outcome = InProgress
	case c.a.Status == charge.Rejected:
		detail := "the provider refused the request"
		if c.a.LastError != nil {
			detail = *c.a.LastError
		}
		t.res.park(reason.ProviderRejected, detail)
	case c.settledHere && c.counted == t && !c.a.Deferred:
		t.res.Outcome = outcomeOf(c.a.Status)
	default:
		// Settled by another worker (a copy of the event, another event
		// of the order, maintenance, a notification), or t is a second
		// copy, or its outcome was counted when its first copy's message
		// was finished in progress: the next claim decides which message
		// counts it.
		return true, nil
	}
	return false, nil
}

// errUnanswered: an attempt is still pending and nothing says why.
var errUnanswered = errors.New("billing: the charge attempt is still unanswered")

// tally counts t's result where it was decided and returns why it is
// Pending (nil when it is not): a decided event by its outcome (a parked
// one is counted by the dead-letter writer once parked), an event left
// pending by a failure as a retry by its cause.
func (t *try) tally(err error) error {
	if err != nil {
		// Nothing recorded what the result says so far: a parked event's
		// failure outcome, say, whose claim did not commit. It is decided
		// only once that is recorded.
		t.res.Outcome, t.res.Reason = Pending, reason.Reason{}
	}
	switch t.res.Outcome {
	case Pending:
		if err != nil && t.ctx.Err() == nil && !errors.Is(err, ErrStopped) && !errors.Is(err, errFenced) { // not the caller giving up
			t.metrics.Retries.WithLabelValues(retryCause(err)).Inc()
		}
	case Parked, InProgress:
		err = nil // a parked one is counted once parked, one in progress once settled
	default:
		err = nil
		t.metrics.Events.WithLabelValues(t.res.Outcome.String()).Inc()
		t.metrics.EndToEnd.Observe(time.Since(t.res.Event.OccurredAt).Seconds())
	}
	return err
}

// retryCause labels a failure that leaves an event pending in
// billing_retries_total: the provider's, or the database's.
func retryCause(err error) string {
	var te *payment.TransientError
	if errors.As(err, &te) {
		return "payment"
	}
	return "database"
}

// live hands their verdict to the claimants whose caller gave up or whose
// fence no longer holds, and returns the others.
func live(cls []*claimant) []*claimant {
	out := cls[:0]
	for _, cl := range cls {
		if err := cl.t.gone(); err != nil {
			cl.claimed(err)
			continue
		}
		out = append(out, cl)
	}
	return out
}

// errFenced: the message's consumer may no longer act on it (its fence
// does not hold); it is left Pending, for the partition's next owner.
var errFenced = errors.New("billing: the message's partition may be another consumer's; left to its next owner")

// gone says why t's caller no longer wants it sent: its context ended, or
// its fence does not hold; nil while it does.
func (t *try) gone() error {
	if err := t.ctx.Err(); err != nil {
		return err
	}
	if t.fence != nil && !t.fence.Holds() {
		return errFenced
	}
	return nil
}

// counter is the charge.counted_by value of m's tries in this process.
//
// It is a 64-bit hash of this process's instance and the message's ID, in
// hex: the settle writes it into every attempt it settles, and the 90
// characters it hashes were a third of the settle's bytes of WAL. Two
// tries collide once in 2^64.
func (p *Processor) counter(m *Message) string {
	id := m.ID
	if id == "" {
		id = uuid.Must(uuid.NewV4()).String()
	}
	h := fnv.New64a()
	h.Write([]byte(p.instance + " " + id))
	return strconv.FormatUint(h.Sum64(), 16)
}

// outsideHorizon returns the reason to park an event whose id the dedup
// store cannot judge ("" when it can): older than the retention (its
// record may have been dropped, so a duplicate would be charged again), or
// further in the future than the clock skew allows.
func (p *Processor) outsideHorizon(ev order.Event, now time.Time) (code reason.Code, detail string) {
	created := ev.IDTime()
	if horizon := now.Add(-p.horizon.Retention); created.Before(horizon) {
		return reason.StaleEvent, fmt.Sprintf("eventId time %s is older than the dedup retention %s (horizon %s); its record may be gone, so it is not charged blindly",
			created.Format(time.RFC3339), p.horizon.Retention, horizon.Format(time.RFC3339))
	}
	if ahead := created.Sub(now); ahead > p.horizon.MaxFutureSkew {
		return reason.InvalidEvent, fmt.Sprintf("eventId: time %s is %s ahead of this consumer's clock (more than the allowed skew %s)",
			created.Format(time.RFC3339), ahead.Round(time.Second), p.horizon.MaxFutureSkew)
	}
	return "", ""
}
