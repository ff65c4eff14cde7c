// Package billing charges each confirmed order exactly once in effect.
//
// Kafka delivers at least once, and a payment provider's answer can be lost
// after it charged. Billing takes each event through three phases, and
// never holds a database transaction open while the provider thinks:
//
//  1. Claim (claim.go, one short transaction): record the event in the
//     dedup store and, for a first-seen event, a charge attempt in state
//     pending that holds the whole provider request. That row is the
//     recovery point.
//  2. Charge (charge.go, no transaction): call the provider for the
//     attempt, with Idempotency-Key = eventId, as soon as the claim
//     committed and the payment client has a slot.
//  3. Settle (settle.go, one short transaction): record the answer
//     (succeeded, declined, rejected) and its outcome event. Only then may
//     the caller mark the offset.
//
// Events travel one by one, each at its own pace: one slow answer holds no
// other event. The transactions are shared: a few writers each take
// whatever events wait for a claim, or answers for a settle, and record
// them together (queue.go), so under load one transaction serves many
// events of many partitions.
//
// Any worker can complete any pending attempt from its row alone: the same
// key and body make the provider replay its stored answer. So a redelivered
// event resumes its own attempt, an event that meets another event's
// pending attempt for its order completes that one first and is then
// claimed again, and maintenance (Recover) completes attempts a crash left
// behind. An attempt older than the provider's idempotency window is never
// retried blindly: it is reported for a human.
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

// Outcome is what became of one message. Charged and Declined are reported
// once per settled attempt, for the message whose try recorded it as
// counted (charge.counted_by); other copies of the event are Duplicates.
type Outcome int

const (
	// Pending: not finished; the message must be retried and its offset must
	// not be marked.
	Pending Outcome = iota
	// Charged: the provider charged the order and the charge was recorded.
	Charged
	// Duplicate: the event was already processed by this consumer group.
	Duplicate
	// AlreadyCharged: a different event for an order that already has a
	// succeeded charge; recorded as processed, not charged.
	AlreadyCharged
	// Declined: the provider declined the payment; recorded, not retried.
	Declined
	// Parked: the event cannot be processed as it is and belongs in the
	// dead-letter topic; Result.Reason says why. Its metric label is the
	// contract's "invalid", whatever the reason (stale, mismatched and
	// provider-rejected events too), counted by the dead-letter writer
	// once parked; billing_dlq_messages_total{reason} tells them apart.
	Parked
	// InProgress: the message is finished, its outcome decided later: the
	// provider holds its payment without a verdict (in_progress), or the
	// event waits for another attempt of its order that the provider
	// holds. The settle that records the outcome counts it (charge.deferred).
	InProgress
)

// String returns the outcome's metric label.
func (o Outcome) String() string {
	switch o {
	case Pending:
		return "pending"
	case Charged:
		return metrics.OutcomeCharged
	case Duplicate:
		return metrics.OutcomeDuplicate
	case AlreadyCharged:
		return metrics.OutcomeAlreadyCharged
	case Declined:
		return metrics.OutcomeDeclined
	case Parked:
		return metrics.OutcomeInvalid
	case InProgress:
		return "in_progress"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Result is the fate of one event.
type Result struct {
	Outcome Outcome
	// Reason, for Parked: its code and the rule that failed, for a human.
	Reason reason.Reason
	Event  order.Event
	// Recorded is, for a Duplicate, what the charge table holds for the
	// event itself (Charged, Declined), or Pending when it holds nothing.
	Recorded Outcome

	trace trace.SpanContext
	// counter is what charge.counted_by holds when this message's try
	// counts the event's outcome (see Processor.counter).
	counter string
}

// announced reports whether r is an event parked for a reason of its own
// (stale-event, payload-mismatch, no-payment-method), whose
// payment.failed.v1 outcome the claim records so that the order service
// does not wait for it for ever (a provider-rejected one's is recorded by
// its settle).
func (r Result) announced() bool {
	switch r.Reason.Code {
	case reason.StaleEvent, reason.PayloadMismatch, reason.NoPaymentMethod:
		return r.Outcome == Parked
	}
	return false
}

func (r *Result) park(code reason.Code, detail string) {
	r.Outcome, r.Reason = Parked, reason.Reason{Code: code, Detail: detail}
}

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

// Processor turns Kafka message values into charges.
type Processor struct {
	// settler runs the transactions and settles the calls, keeping one
	// call per attempt: the processor's Recoverer shares it.
	*settler
	dedup   *dedup.Store
	payer   Payer
	horizon Horizon

	// claims holds the events waiting for a claim, settles the calls
	// waiting for their settle; writers of each run their transactions.
	claims  *queue[*job]
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

// maxRounds bounds how often one event is claimed again while other
// attempts of its order come first; past it the event is left pending for
// the caller's retry.
const maxRounds = 8

// NewProcessor returns a Processor that records in db, deduplicates with
// store, charges through payer and parks events outside horizon. Run
// starts its writers, a quarter of db's connections for claims and as many
// for settles (at least one each). Its Recoverer completes the attempts
// left pending.
func NewProcessor(db *sqlx.DB, store *dedup.Store, payer Payer, horizon Horizon, m *metrics.Metrics, tp trace.TracerProvider, log *slog.Logger) *Processor {
	p := &Processor{settler: newSettler(db, payer, horizon.ResolveAfter, m, tp, log), dedup: store, payer: payer, horizon: horizon,
		claims: newQueue[*job](), settles: newQueue[*call](), writers: max(1, db.Stats().MaxOpenConnections/4),
		callers: &callers{}, instance: uuid.Must(uuid.NewV4()).String()}
	p.onSettled = p.decide
	if b, ok := payer.(concurrencyBound); ok {
		p.callers.limit = b.Concurrency()
	}
	return p
}

// WriteRefusal says why the database refuses billing's writes (a full
// disk, no memory: postgres.Refuses), nil while it takes them. A server in
// that state answers every other check; readiness asks this.
func (p *Processor) WriteRefusal() error { return p.writes.Err() }

// job is one message on its way through claim → charge → settle.
type job struct {
	msg     Message
	res     Result
	ctx     context.Context // the caller's: once it ends, the job goes back Pending unsent
	done    func(Result, error)
	metrics *metrics.Metrics
	// rounds counts the job's claims: an event waiting for another attempt
	// of its order is claimed again once that attempt is settled.
	rounds int
}

// finish hands the job's result to its caller, with why it is Pending, and
// counts it where it was decided: a decided event by its outcome (a parked
// one is counted by the dead-letter writer once parked), an event left
// pending by a failure as a retry by its cause.
func (j *job) finish(err error) {
	switch j.res.Outcome {
	case Pending:
		if err != nil && j.ctx.Err() == nil && !errors.Is(err, ErrStopped) && !errors.Is(err, errFenced) { // not the caller giving up
			j.metrics.Retries.WithLabelValues(retryCause(err)).Inc()
		}
	case Parked, InProgress:
		err = nil // a parked one is counted once parked, one in progress once settled
	default:
		err = nil
		j.metrics.Events.WithLabelValues(j.res.Outcome.String()).Inc()
		j.metrics.EndToEnd.Observe(time.Since(j.res.Event.OccurredAt).Seconds())
	}
	j.done(j.res, err)
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
	for _, j := range p.claims.close() {
		j.finish(ErrStopped)
	}
	for _, c := range p.settles.close() {
		p.abandon(c, ErrStopped)
	}
}

// Submit starts m's event on its way and returns at once; done is called
// once, from another goroutine, with its result: decided (charged,
// declined, a duplicate, parked), or Pending with the reason, for the
// caller to retry later (the retry resumes the recorded attempt under the
// same key).
func (p *Processor) Submit(ctx context.Context, m Message, done func(Result, error)) {
	j := p.newJob(ctx, m, done)
	if j.res.Outcome == Parked && !j.res.announced() {
		j.finish(nil) // nothing to record
		return
	}
	if !p.claims.push(j) {
		j.finish(ErrStopped)
	}
}

// The round: a job is claimed (claim.go); follow sends it on to the call
// of the attempt it needs (charge.go); once that call is settled
// (settle.go), decide finishes the job or claims it again.

// follow sends the claimed jobs on: the decided ones are finished, the
// others wait for the call of the attempt they need, and those whose
// attempt was not recorded after all are claimed again.
func (p *Processor) follow(ctx context.Context, jobs []*job, pl *plan) {
	needed := map[uuid.UUID]*call{}
	var order []*call
	for _, j := range jobs { // batch order: the first waiting event traces the call
		id, waits := pl.waits[j]
		if !waits {
			if j.res.Outcome != Pending {
				j.finish(nil)
			} else {
				p.again(j) // decided in no way by this claim: claim it again
			}
			continue
		}
		c, ok := pl.calls[id]
		if !ok {
			p.again(j) // an attempt that was not recorded after all
			continue
		}
		if _, started := needed[id]; !started {
			needed[id] = c
			order = append(order, c)
			c.trace = j.res.trace
		}
		c.waiters = append(c.waiters, j)
		if id == j.res.Event.ID && c.countedFor == nil {
			c.countedFor = j // its own event's first copy counts the outcome
		}
	}
	// The pending attempts of orders whose events all decided otherwise
	// are left to their own events and to maintenance.
	p.skipSettled(ctx, order)
	for _, c := range order {
		p.send(ctx, c)
	}
}

// decide sends on j, which waited for c, now settled.
func (p *Processor) decide(c *call, j *job) {
	own := c.a.EventID == j.res.Event.ID
	switch {
	case c.expired:
		// Parked; the claim records its failure, under its order's lock.
		j.res.park(reason.StaleEvent, expiredDetail(c.a, own, p.horizon.ProviderWindow))
		if !p.claims.push(j) {
			j.finish(ErrStopped)
		}
	case c.a.Status == charge.Pending:
		j.finish(cmp.Or(c.err, c.unanswered(), errUnanswered)) // still unanswered: the caller retries
	case !own:
		p.again(j) // the order's other attempt is settled or in progress: decide now
	case c.a.Status == charge.InProgress:
		// The provider holds the payment; its notification or a lookup
		// settles it, and that settle counts it.
		j.res.Outcome = InProgress
		j.finish(nil)
	case c.a.Status == charge.Rejected:
		detail := "the provider refused the request"
		if c.a.LastError != nil {
			detail = *c.a.LastError
		}
		j.res.park(reason.ProviderRejected, detail)
		j.finish(nil)
	case c.settledHere && c.counted == j && !c.a.Deferred:
		j.res.Outcome = outcomeOf(c.a.Status)
		j.finish(nil)
	default:
		// Settled by another worker (a copy of the event, another event
		// of the order, maintenance, a notification), or j is a second
		// copy, or its outcome was counted when its first copy's message
		// was finished in progress: the next claim decides which message
		// counts it.
		p.again(j)
	}
}

// errUnanswered: an attempt is still pending and nothing says why.
var errUnanswered = errors.New("billing: the charge attempt is still unanswered")

// again claims j once more, after the attempt it waited for was settled.
func (p *Processor) again(j *job) {
	if j.rounds++; j.rounds > maxRounds {
		// Other partitions keep putting attempts in front of this order.
		j.finish(fmt.Errorf("billing: event %s still waits behind other attempts of order %d", j.res.Event.ID, j.res.Event.OrderID))
		return
	}
	if !p.claims.push(j) {
		j.finish(ErrStopped)
	}
}

// newJob checks m's event against the horizon: an event billing cannot
// judge is parked before any claim (whose failure the claim records).
func (p *Processor) newJob(ctx context.Context, m Message, done func(Result, error)) *job {
	j := &job{msg: m, ctx: ctx, done: done, metrics: p.metrics}
	j.res.Event, j.res.trace, j.res.counter = m.Event, m.Trace, p.counter(m)
	if code, detail := p.outsideHorizon(m.Event, p.now()); code != "" {
		j.res.park(code, detail)
	}
	return j
}

// live finishes the jobs whose caller gave up or whose fence no longer
// holds, and returns the others.
func live(jobs []*job) []*job {
	out := jobs[:0]
	for _, j := range jobs {
		if err := j.gone(); err != nil {
			j.finish(err)
			continue
		}
		out = append(out, j)
	}
	return out
}

// errFenced: the message's consumer may no longer act on it (its fence
// does not hold); it is left Pending, for the partition's next owner.
var errFenced = errors.New("billing: the message's partition may be another consumer's; left to its next owner")

// gone says why j's caller no longer wants it sent: its context ended, or
// its fence does not hold; nil while it does.
func (j *job) gone() error {
	if err := j.ctx.Err(); err != nil {
		return err
	}
	if f := j.msg.Fence; f != nil && !f.Holds() {
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
func (p *Processor) counter(m Message) string {
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
