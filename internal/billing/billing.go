// Package billing charges each confirmed order exactly once in effect.
//
// Kafka delivers at least once. For every event, in one READ COMMITTED
// transaction, billing claims the event id in the dedup store and, only when
// the claim is new, charges the order and records the outcome; the caller
// marks the Kafka offset only after that transaction committed. A redelivered
// event finds its claim and is skipped; a charge whose answer was lost is
// retried under the same Idempotency-Key and deduplicated by the provider.
package billing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"example.com/billing/internal/dedup"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/order"
	"example.com/billing/internal/payment"
	"example.com/billing/internal/postgres"
)

// Outcome is what became of one message.
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
	// dead-letter topic; Result.Code and Result.Detail say why.
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

	trace trace.SpanContext
}

// Reason is the dead-letter reason, "<code>: <detail>".
func (r Result) Reason() string { return r.Code + ": " + r.Detail }

// Payer charges through the payment provider. Its errors wrap
// payment.ErrDeclined or payment.ErrRejected, or are transient.
type Payer interface {
	Charge(ctx context.Context, r payment.Request) (payment.Charge, error)
}

// Horizon bounds the event ids the dedup store can judge.
type Horizon struct {
	// Retention is how long the dedup store remembers an event. An event
	// id older than that may be a duplicate whose record was dropped: it is
	// parked as stale-event, never charged blindly.
	Retention time.Duration
	// MaxFutureSkew is how far ahead of this clock an event id may be.
	MaxFutureSkew time.Duration
}

// Message is one consumed message to settle.
type Message struct {
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
}

// NewProcessor returns a Processor that records in db, deduplicates with
// store, charges through payer and parks events outside horizon.
func NewProcessor(db *sqlx.DB, store *dedup.Store, payer Payer, horizon Horizon, m *metrics.Metrics, tp trace.TracerProvider, log *slog.Logger) *Processor {
	return &Processor{db: db, dedup: store, payer: payer, horizon: horizon, metrics: m,
		tracer: tp.Tracer("example.com/billing/internal/billing"), log: log, now: time.Now}
}

// Process handles consecutive messages of one lane, in order, and returns
// one Result for each.
//
// Valid events are settled together in one transaction. When it fails for a
// reason outside the events (database, provider outage), every valid event is
// left Pending and the error says why: the caller retries them later, and the
// provider deduplicates any charge that was made before the rollback. Invalid
// events are Parked whatever happens to the others.
func (p *Processor) Process(ctx context.Context, msgs []Message) ([]Result, error) {
	results := make([]Result, len(msgs))
	valid := make([]int, 0, len(msgs))
	now := p.now()
	for i, m := range msgs {
		results[i].trace = m.Trace
		ev, err := order.Parse(m.Value)
		if err != nil {
			results[i].Outcome, results[i].Code, results[i].Detail = Parked, CodeInvalidEvent, err.Error()
			continue
		}
		results[i].Event = ev
		if code, detail := p.judgeTime(ev, now); code != "" {
			results[i].Outcome, results[i].Code, results[i].Detail = Parked, code, detail
			continue
		}
		valid = append(valid, i)
	}
	if len(valid) == 0 {
		return results, nil
	}

	err := p.settle(ctx, results, valid)
	if dedup.IsMissingPartition(err) {
		// An event's day has no partition: retention dropped it (the event
		// cannot be judged) or maintenance has not created it (yet).
		if valid, err = p.healPartitions(ctx, results, valid); err == nil && len(valid) > 0 {
			err = p.settle(ctx, results, valid)
		}
	}
	if errors.Is(err, payment.ErrRejected) && len(valid) > 1 {
		// The provider refused one request of the group: settle the events
		// one by one so that only that one is parked.
		for n := range valid {
			if err = p.settle(ctx, results, valid[n:n+1]); err != nil && !errors.Is(err, payment.ErrRejected) {
				return results, err
			}
		}
		return results, nil
	}
	if err != nil && !errors.Is(err, payment.ErrRejected) {
		return results, err
	}
	return results, nil
}

// judgeTime parks an event whose id the dedup store cannot judge: older
// than the retention (its record may have been dropped, so a duplicate would
// be charged again), or further in the future than the clock skew allows.
func (p *Processor) judgeTime(ev order.Event, now time.Time) (code, detail string) {
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
		if dedup.Day(ev.ID).Before(droppedBefore) {
			results[i].Outcome, results[i].Code = Parked, CodeStaleEvent
			results[i].Detail = fmt.Sprintf("eventId time %s falls on a day whose dedup records were dropped (the store remembers from %s on); it is not charged blindly",
				ev.IDTime().Format(time.RFC3339), droppedBefore.Format(time.DateOnly))
			continue
		}
		keep = append(keep, i)
		ids = append(ids, ev.ID)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	p.log.Warn("processed_event has no partition for an event's day; creating it (is `billing maintain` running?)")
	return keep, dedup.EnsurePartitions(ctx, p.db, ids)
}

// settle runs the events results[idx] in one transaction and fills their
// outcomes once it committed. A single event that the provider rejects is
// Parked and ErrRejected returned.
func (p *Processor) settle(ctx context.Context, results []Result, idx []int) error {
	events := make([]order.Event, len(idx))
	traces := make([]trace.SpanContext, len(idx))
	links := make([]trace.Link, 0, len(idx))
	for n, i := range idx {
		events[n], traces[n] = results[i].Event, results[i].trace
		links = append(links, trace.Link{SpanContext: results[i].trace})
	}
	// One transaction settles the whole group: its span hangs below the
	// first message's and links to all of them.
	ctx, span := p.tracer.Start(trace.ContextWithSpanContext(ctx, traces[0]), "billing settle",
		trace.WithSpanKind(trace.SpanKindClient), trace.WithLinks(links...),
		trace.WithAttributes(semconv.DBSystemNamePostgreSQL, attribute.Int("billing.events", len(idx))))
	defer span.End()

	var outcomes []Outcome
	var details []string
	err := postgres.InTx(ctx, p.db, func(tx *sqlx.Tx) error {
		var err error
		outcomes, details, err = p.claimAndCharge(ctx, tx, events, traces)
		return err
	})
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "rolled back")
		if errors.Is(err, payment.ErrRejected) && len(idx) == 1 {
			results[idx[0]].Outcome = Parked
			results[idx[0]].Code = CodeProviderRejected
			results[idx[0]].Detail = err.Error()
		}
		return err
	}
	for n, i := range idx {
		results[i].Outcome = outcomes[n]
		if outcomes[n] == Parked {
			results[i].Code, results[i].Detail = CodePayloadMismatch, details[n]
		}
	}
	p.metrics.Batch.Observe(float64(len(idx)))
	return nil
}

// claimAndCharge claims the events in the dedup store and charges those seen
// for the first time, all inside tx. An event whose id was processed with
// another payload is Parked, with a detail for the dead-letter reason.
func (p *Processor) claimAndCharge(ctx context.Context, tx *sqlx.Tx, events []order.Event, traces []trace.SpanContext) ([]Outcome, []string, error) {
	entries := make([]dedup.Entry, len(events))
	for i, ev := range events {
		entries[i] = dedup.Entry{ID: ev.ID, Fingerprint: ev.Fingerprint()}
	}
	verdicts, err := p.dedup.Claim(ctx, tx, entries)
	if err != nil {
		return nil, nil, err
	}
	outcomes := make([]Outcome, len(events))
	details := make([]string, len(events))
	var fresh []order.Event
	var freshTraces []trace.SpanContext
	var freshAt []int
	for i, v := range verdicts {
		switch v {
		case dedup.Duplicate:
			outcomes[i] = Duplicate
		case dedup.Mismatch:
			outcomes[i] = Parked
			details[i] = fmt.Sprintf("eventId %s was already processed with a different payload (fingerprint %x); not a duplicate to skip", events[i].ID, entries[i].Fingerprint[:8])
		default:
			fresh = append(fresh, events[i])
			freshTraces = append(freshTraces, traces[i])
			freshAt = append(freshAt, i)
		}
	}
	if len(fresh) == 0 {
		return outcomes, details, nil
	}
	charged, err := chargeOrders(ctx, tx, p.payer, fresh, freshTraces)
	if err != nil {
		return nil, nil, err
	}
	for n, i := range freshAt {
		outcomes[i] = charged[n]
	}
	return outcomes, details, nil
}
