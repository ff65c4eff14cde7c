// Package billing charges each confirmed order exactly once in effect.
//
// Kafka delivers at least once, and a payment provider's answer can be lost
// after it charged. Billing settles a lane's batch of events in three
// phases, and never holds a database transaction open while the provider
// thinks:
//
//  1. Claim (one short transaction): record each event in the dedup store
//     and, for each first-seen event, a charge attempt in state pending that
//     holds the whole provider request. That row is the recovery point.
//  2. Charge (no transaction): call the provider for the batch's pending
//     attempts, concurrently, with Idempotency-Key = eventId.
//  3. Settle (one short transaction): record each answer (succeeded,
//     declined, rejected). Only then may the caller mark the offsets.
//
// Any worker can complete any pending attempt from its row alone: the same
// key and body make the provider replay its stored answer. So a redelivered
// event resumes its own attempt, an event that meets another event's
// pending attempt for its order completes that one first and then decides,
// and maintenance (Recover) completes attempts a crash left behind. An
// attempt older than the provider's idempotency window is never retried
// blindly: it is reported for a human.
package billing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel/trace"

	"example.com/billing/internal/dedup"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/order"
	"example.com/billing/internal/outbox"
	"example.com/billing/internal/partition"
	"example.com/billing/internal/payment"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/tracing"
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
	// dead-letter topic; Result.Code and Result.Detail say why. Its metric
	// label is the contract's "invalid", whatever the reason (stale,
	// mismatched and provider-rejected events too);
	// billing_dlq_messages_total{reason} tells them apart.
	Parked
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
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Dead-letter reason codes: the stable, kebab-case start of x-dlq-reason.
const (
	CodeInvalidEvent     = "invalid-event"
	CodeStaleEvent       = "stale-event"
	CodePayloadMismatch  = "payload-mismatch"
	CodeProviderRejected = "provider-rejected"
)

// Result is the fate of one message.
type Result struct {
	Outcome Outcome
	Code    string      // for Parked: one of the Code constants
	Detail  string      // for Parked: the rule that failed, for a human
	Event   order.Event // the decoded event; zero when it did not decode
	// Recorded is, for a Duplicate, what the charge table holds for the
	// event itself (Charged, Declined), or Pending when it holds nothing.
	Recorded Outcome

	trace trace.SpanContext
	// counter is what charge.counted_by holds when this message's try
	// counts the event's outcome (see Processor.counter).
	counter string
}

// Reason is the dead-letter reason, "<code>: <detail>".
func (r Result) Reason() string { return r.Code + ": " + r.Detail }

func (r *Result) park(code, detail string) {
	r.Outcome, r.Code, r.Detail = Parked, code, detail
}

// Payer charges through the payment provider. Its errors wrap
// payment.ErrDeclined or payment.ErrRejected, or are transient.
type Payer interface {
	Charge(ctx context.Context, r payment.Request) (payment.Charge, error)
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
	// (PAYMENT_IDEMPOTENCY_WINDOW; 0 means 24h). A pending attempt older
	// than that could be charged a second time if asked again: it is
	// reported, never retried blindly.
	ProviderWindow time.Duration
}

func (h Horizon) providerWindow() time.Duration {
	if h.ProviderWindow <= 0 {
		return 24 * time.Hour
	}
	return h.ProviderWindow
}

// Message is one consumed message to settle.
type Message struct {
	// ID names the message (consumer group, topic, partition, offset): the
	// same for every try of it, different for another copy of its event.
	// With it, a try that meets the outcome an earlier try of the same
	// message recorded without learning so (a commit whose answer was lost)
	// counts it; without it, every try is a message of its own.
	ID    string
	Value []byte
	// Trace is the span of the message's processing; the transaction and
	// payment spans hang below it.
	Trace trace.SpanContext
}

// Processor turns Kafka message values into charges.
type Processor struct {
	db      *sqlx.DB
	dedup   *dedup.Store
	payer   Payer
	horizon Horizon
	metrics *metrics.Metrics
	tracer  trace.Tracer
	log     *slog.Logger
	now     func() time.Time

	// writes knows whether the database refuses writes (a full disk),
	// which only failing transactions tell.
	writes postgres.Writes

	mu      sync.Mutex
	sending map[uuid.UUID]struct{} // attempts whose request this process is sending
	// instance tells this process's tries from another's in
	// charge.counted_by: a message redelivered to another process after a
	// crash was counted there (or lost with it), not here.
	instance string
}

// NewProcessor returns a Processor that records in db, deduplicates with
// store, charges through payer and parks events outside horizon. A
// Processor without a payer can only ReportPending.
func NewProcessor(db *sqlx.DB, store *dedup.Store, payer Payer, horizon Horizon, m *metrics.Metrics, tp trace.TracerProvider, log *slog.Logger) *Processor {
	return &Processor{db: db, dedup: store, payer: payer, horizon: horizon, metrics: m,
		tracer: tp.Tracer("example.com/billing/internal/billing"), log: log, now: time.Now,
		sending: map[uuid.UUID]struct{}{}, instance: uuid.Must(uuid.NewV4()).String()}
}

// WriteRefusal says why the database refuses billing's writes (a full
// disk, no memory: postgres.Refuses), nil while it takes them. A server in
// that state answers every other check; readiness asks this.
func (p *Processor) WriteRefusal() error { return p.writes.Err() }

// Process handles consecutive messages of one lane and returns one Result
// for each.
//
// Valid events go through claim → charge → settle together. An event whose
// order has another event's attempt pending waits for that attempt to be
// completed (here, by this call) and is decided in a further round, as is
// the second event of one order in the batch. When something outside the
// events fails (database, provider outage), the events it concerns are left
// Pending and the error says why; the caller retries them later, and the
// retry resumes their recorded attempts under the same key. Invalid events
// are Parked whatever happens to the others.
func (p *Processor) Process(ctx context.Context, msgs []Message) ([]Result, error) {
	results := make([]Result, len(msgs))
	valid := make([]int, 0, len(msgs))
	now := p.now()
	for i, m := range msgs {
		results[i].trace = m.Trace
		results[i].counter = p.counter(m)
		ev, err := order.Parse(m.Value)
		if err != nil {
			results[i].park(CodeInvalidEvent, err.Error())
			continue
		}
		results[i].Event = ev
		if code, detail := p.outsideHorizon(ev, now); code != "" {
			results[i].park(code, detail)
			continue
		}
		valid = append(valid, i)
	}

	errs := p.decide(ctx, results, valid)
	if err := p.announceParked(ctx, results); err != nil {
		errs = append(errs, err)
	}
	return results, errors.Join(errs...)
}

// decide runs rounds of claim → charge → settle for the events
// results[valid] until each is decided or left Pending for the caller's
// retry, and returns why events were left Pending.
func (p *Processor) decide(ctx context.Context, results []Result, valid []int) []error {
	var errs []error
	for rounds := 0; len(valid) > 0; rounds++ {
		if rounds > len(results) {
			// Other partitions keep putting attempts in front of these
			// events' orders: leave them to the caller's retry.
			errs = append(errs, fmt.Errorf("%d events still wait behind other attempts of their orders", len(valid)))
			break
		}
		next, err := p.round(ctx, results, valid)
		if dedup.Table.IsMissing(err) {
			// An event's day has no partition: retention dropped it (the
			// event cannot be judged) or maintenance has not created it
			// (yet). The claim rolled back; decide and try again.
			if valid, err = p.healPartitions(ctx, results, valid); err == nil {
				continue
			}
		}
		var refused *refusedError
		if errors.As(err, &refused) {
			// Waiting will not change a constraint the claim broke. Alone,
			// the event that broke it is parked; in a batch, each event
			// is decided alone to find it.
			if len(valid) == 1 {
				results[valid[0]].park(CodeInvalidEvent, refused.Error())
				break
			}
			for _, i := range valid {
				errs = append(errs, p.decide(ctx, results, []int{i})...)
			}
			break
		}
		if err != nil {
			errs = append(errs, err)
		}
		valid = next
	}
	return errs
}

// announceParked records a payment.failed.v1 outcome for every decoded
// event parked for a reason of its own (stale-event, payload-mismatch; a
// provider-rejected one was announced by its settle), so that the order
// service does not wait for it for ever. It runs before the caller writes
// the dead-letter record: a failure leaves those events Pending, to be
// tried again, and a redelivered one is announced once.
func (p *Processor) announceParked(ctx context.Context, results []Result) error {
	var idx []int
	var orderIDs []int64
	var outcomes []outbox.Outcome
	for i, r := range results {
		if r.Outcome != Parked || r.Event.ID == uuid.Nil || (r.Code != CodeStaleEvent && r.Code != CodePayloadMismatch) {
			continue
		}
		o := outbox.NewOutcome(outbox.Failed, r.Event, r.Code, p.now())
		o.Traceparent = tracing.Traceparent(r.trace)
		idx = append(idx, i)
		orderIDs = append(orderIDs, r.Event.OrderID)
		outcomes = append(outcomes, o)
	}
	if len(idx) == 0 {
		return nil
	}
	slices.Sort(orderIDs)
	orderIDs = slices.Compact(orderIDs)
	err := p.inTxWithOutbox(ctx, "park", results, idx, func(tx *sqlx.Tx) error {
		// Under the orders' locks two copies of one event cannot both find
		// its failure unannounced.
		if err := lockOrders(ctx, tx, orderIDs); err != nil {
			return err
		}
		return outbox.Record(ctx, tx, outcomes)
	})
	if err != nil {
		for _, i := range idx {
			results[i].Outcome, results[i].Code, results[i].Detail = Pending, "", ""
		}
	}
	return err
}

// counter is the charge.counted_by value of m's tries in this process.
func (p *Processor) counter(m Message) string {
	id := m.ID
	if id == "" {
		id = uuid.Must(uuid.NewV4()).String()
	}
	return p.instance + " " + id
}

// outsideHorizon returns the reason to park an event whose id the dedup
// store cannot judge ("" when it can): older than the retention (its
// record may have been dropped, so a duplicate would be charged again), or
// further in the future than the clock skew allows.
func (p *Processor) outsideHorizon(ev order.Event, now time.Time) (code, detail string) {
	created := ev.IDTime()
	if horizon := now.Add(-p.horizon.Retention); created.Before(horizon) {
		return CodeStaleEvent, fmt.Sprintf("eventId time %s is older than the dedup retention %s (horizon %s); its record may be gone, so it is not charged blindly",
			created.Format(time.RFC3339), p.horizon.Retention, horizon.Format(time.RFC3339))
	}
	if ahead := created.Sub(now); ahead > p.horizon.MaxFutureSkew {
		return CodeInvalidEvent, fmt.Sprintf("eventId: time %s is %s ahead of this consumer's clock (more than the allowed skew %s)",
			created.Format(time.RFC3339), ahead.Round(time.Second), p.horizon.MaxFutureSkew)
	}
	return "", ""
}

// healPartitions parks the events of days that retention dropped, creates
// the missing partitions of the others rather than retry forever, and
// returns the events still to settle.
func (p *Processor) healPartitions(ctx context.Context, results []Result, idx []int) ([]int, error) {
	droppedBefore, err := dedup.DroppedBefore(ctx, p.db)
	if err != nil {
		return idx, err
	}
	var keep []int
	var ids []uuid.UUID
	for _, i := range idx {
		ev := results[i].Event
		if partition.Day(ev.ID).Before(droppedBefore) {
			results[i].park(CodeStaleEvent, fmt.Sprintf("eventId time %s falls on a day whose dedup records were dropped (the store remembers from %s on); it is not charged blindly",
				ev.IDTime().Format(time.RFC3339), droppedBefore.Format(time.DateOnly)))
			continue
		}
		keep = append(keep, i)
		ids = append(ids, ev.ID)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	p.log.Warn("processed_event has no partition for an event's day; creating it (is `billing maintain` running?)")
	return keep, dedup.Table.EnsureFor(ctx, p.db, ids)
}
