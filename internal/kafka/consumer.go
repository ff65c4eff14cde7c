// Package kafka is billing's adapter to Apache Kafka through sarama: the
// consumer group that feeds events to the billing processor, the dead-letter
// producer, and the configuration they share.
package kafka

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/cenkalti/backoff/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"example.com/billing/internal/billing"
	"example.com/billing/internal/metrics"
)

// Processor settles the values of consecutive messages of one lane and says
// what became of each (billing.Processor).
type Processor interface {
	Process(ctx context.Context, msgs []billing.Message) ([]billing.Result, error)
}

// Parker parks a message in the dead-letter topic (package dlq): it
// returns once the broker acknowledged it, with the reason code it was
// parked under. Close fails a Park in progress.
type Parker interface {
	Park(m *sarama.ConsumerMessage, reason string) (code string, err error)
	Close() error
}

// Options tune a Consumer.
type Options struct {
	Topic string
	Group string
	// Lanes per partition: messages with different keys run concurrently,
	// messages with the same key in offset order.
	Lanes int
	// BatchMax is the most messages of one lane handed to the processor at
	// once (one transaction).
	BatchMax int
	// MaxInFlight bounds messages taken off partitions and not yet finished,
	// across all partitions of this instance: back-pressure on fetching.
	MaxInFlight int
	// DrainTimeout bounds how long in-flight work may go on after a
	// partition is revoked or the consumer stops.
	DrainTimeout time.Duration
	// CommitEveryMessage commits synchronously after each marked offset
	// instead of once a second (the seed design; a benchmark baseline).
	CommitEveryMessage bool
}

// stopGrace is how long, beyond the drain timeout, Run waits for sarama to
// leave the group after ctx is done.
const stopGrace = 5 * time.Second

// Consumer consumes the order topic in a consumer group.
type Consumer struct {
	client  sarama.Client
	group   sarama.ConsumerGroup
	proc    Processor
	dlq     Parker
	opts    Options
	metrics *metrics.Metrics
	tracer  trace.Tracer
	log     *slog.Logger

	tokens chan struct{} // one per message in flight
	ready  atomic.Bool   // holds a group session

	mu    sync.Mutex
	owned map[int32]*partition // partitions being consumed, for lag
}

// NewConsumer joins group opts.Group through client when Run is called.
func NewConsumer(client sarama.Client, proc Processor, dlq Parker, opts Options, m *metrics.Metrics, tp trace.TracerProvider, log *slog.Logger) (*Consumer, error) {
	group, err := sarama.NewConsumerGroupFromClient(opts.Group, client)
	if err != nil {
		return nil, err
	}
	return &Consumer{
		client:  client,
		group:   group,
		proc:    proc,
		dlq:     dlq,
		opts:    opts,
		metrics: m,
		tracer:  tp.Tracer("example.com/billing/internal/kafka"),
		log:     log,
		tokens:  make(chan struct{}, opts.MaxInFlight),
		owned:   make(map[int32]*partition),
	}, nil
}

// Ready reports whether the consumer holds a group session.
func (c *Consumer) Ready() bool { return c.ready.Load() }

// Run consumes until ctx is done, then drains in-flight work (within the
// drain timeout), commits the marked offsets and leaves the group.
func (c *Consumer) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		for err := range c.group.Errors() {
			c.log.Warn("consumer group error", "err", err)
		}
	})
	lagCtx, stopLag := context.WithCancel(ctx)
	defer stopLag()
	wg.Go(func() { c.reportLag(lagCtx) })

	// sarama does not watch ctx while it joins the group, so a SIGTERM
	// during a rebalance would wait for the rebalance (up to its timeout, or
	// for a broker that never answers) and could outlive the pod's grace
	// period. Past the drain time, closing the connection ends it; offsets
	// not yet committed then only cost skipped duplicates later.
	returned := make(chan struct{})
	defer close(returned)
	wg.Go(func() {
		select {
		case <-returned:
			return
		case <-ctx.Done():
		}
		select {
		case <-returned:
		case <-time.After(c.opts.DrainTimeout + stopGrace):
			c.log.Warn("the consumer group did not stop within the drain timeout (a rebalance or a dead-letter write in progress?); closing the broker connections")
			_ = c.dlq.Close() // a Park blocked on an unreachable broker fails; its message stays unmarked
			_ = c.client.Close()
		}
	})

	// A failed join is retried within 2s at most: on Apache Kafka the group
	// coordinator's broker dying leaves no coordinator until the controller
	// fences it (broker.session.timeout.ms, 9s), and a backoff grown to 10s
	// by then kept the whole group idle for seconds after the new
	// coordinator was ready (measured in the chaos suite's
	// coordinator-kill-9). A join attempt to a dead or absent coordinator is
	// cheap; this costs one warning per process every 2s of an outage.
	retry := backoff.NewExponentialBackOff()
	retry.MaxInterval = 2 * time.Second
	for ctx.Err() == nil {
		// Consume returns when the session ends: on shutdown, or after an
		// eager rebalance or a lost session; then join again.
		err := c.group.Consume(ctx, []string{c.opts.Topic}, c)
		if ctx.Err() != nil {
			break
		}
		if err == nil {
			retry.Reset()
			continue
		}
		if errors.Is(err, sarama.ErrClosedConsumerGroup) {
			return err
		}
		wait := retry.NextBackOff()
		c.log.Warn("consumer group session failed; joining again", "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	return c.group.Close()
}

// Setup implements sarama.ConsumerGroupHandler.
func (c *Consumer) Setup(sess sarama.ConsumerGroupSession) error {
	c.ready.Store(true)
	c.log.Info("joined consumer group", "member_id", sess.MemberID(), "generation", sess.GenerationID(), "claims", sess.Claims())
	return nil
}

// Cleanup implements sarama.ConsumerGroupHandler.
func (c *Consumer) Cleanup(sess sarama.ConsumerGroupSession) error {
	c.ready.Store(false)
	c.log.Info("left consumer group session", "member_id", sess.MemberID(), "generation", sess.GenerationID())
	return nil
}

// ConsumeClaim implements sarama.ConsumerGroupHandler. It dispatches the
// partition's messages to key-ordered lanes and returns when the claim ends
// (revoked, or the session is over), after the lanes finished or abandoned
// their work.
func (c *Consumer) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	p := c.newPartition(sess, claim)
	c.mu.Lock()
	c.owned[claim.Partition()] = p
	c.mu.Unlock()
	c.metrics.Rebalances.WithLabelValues("assigned").Inc()
	c.log.Info("partition assigned", "topic", claim.Topic(), "partition", claim.Partition(), "offset", claim.InitialOffset())

	p.run(claim.Messages())

	c.mu.Lock()
	delete(c.owned, claim.Partition())
	c.mu.Unlock()
	c.metrics.Lag.DeleteLabelValues(partitionLabel(claim.Partition()))
	c.metrics.Rebalances.WithLabelValues("revoked").Inc()
	c.log.Info("partition released", "topic", claim.Topic(), "partition", claim.Partition(), "unfinished", p.tracker.unfinished())
	return nil
}

// partition is the consumption of one claimed partition.
type partition struct {
	c     *Consumer
	sess  sarama.ConsumerGroupSession
	topic string
	id    int32

	tracker tracker
	lanes   []chan *message
	// room is signalled when a lane takes messages off its queue.
	room chan struct{}
	// stopped is closed when the claim ends: no new attempt starts, no retry
	// waits any longer, queued messages are abandoned.
	stopped chan struct{}
	// work is the context of attempts. It outlives the claim by the drain
	// timeout so that a transaction in progress can commit rather than be
	// cut off half way.
	work       context.Context
	cancelWork context.CancelFunc
}

func (c *Consumer) newPartition(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) *partition {
	work, cancel := context.WithCancel(context.WithoutCancel(sess.Context()))
	p := &partition{
		c:          c,
		sess:       sess,
		topic:      claim.Topic(),
		id:         claim.Partition(),
		lanes:      make([]chan *message, c.opts.Lanes),
		room:       make(chan struct{}, 1),
		stopped:    make(chan struct{}),
		work:       work,
		cancelWork: cancel,
	}
	for i := range p.lanes {
		// A short queue per lane: enough to fill a batch, small enough that
		// one slow key does not hoard the in-flight budget.
		p.lanes[i] = make(chan *message, c.opts.BatchMax)
	}
	return p
}

func (p *partition) run(messages <-chan *sarama.ConsumerMessage) {
	var lanes sync.WaitGroup
	for _, lane := range p.lanes {
		lanes.Go(func() { p.runLane(lane) })
	}

	p.dispatch(messages)

	close(p.stopped)
	for _, lane := range p.lanes {
		close(lane)
	}
	drained := make(chan struct{})
	go func() { lanes.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(p.c.opts.DrainTimeout):
		p.c.log.Warn("drain timeout: abandoning in-flight work", "topic", p.topic, "partition", p.id)
		p.cancelWork()
		<-drained
	}
	p.cancelWork()
}

// laneOf maps a key to a lane: one key, one lane, so one key's messages are
// handled in offset order.
func laneOf(key []byte, lanes int) int {
	h := fnv.New32a()
	h.Write(key)
	return int(h.Sum32() % uint32(lanes))
}

func (p *partition) runLane(lane <-chan *message) {
	batch := make([]*message, 0, p.c.opts.BatchMax)
	for m := range lane {
		batch = append(batch[:0], m)
	fill:
		for len(batch) < cap(batch) {
			select {
			case m, ok := <-lane:
				if !ok {
					break fill
				}
				batch = append(batch, m)
			default:
				break fill
			}
		}
		select { // the dispatcher may be waiting for room in this lane
		case p.room <- struct{}{}:
		default:
		}
		p.handle(batch)
	}
}

func (p *partition) isStopped() bool {
	select {
	case <-p.stopped:
		return true
	default:
		return false
	}
}

// handle settles a batch, retrying what failed for reasons outside the
// events with exponential backoff and jitter, until it is finished or the
// claim ends.
func (p *partition) handle(batch []*message) {
	pending := batch
	var retry *backoff.ExponentialBackOff
	for attempt := 1; ; attempt++ {
		if p.isStopped() {
			p.abandon(pending)
			return
		}
		msgs := make([]billing.Message, len(pending))
		for i, m := range pending {
			msgs[i] = billing.Message{Value: m.msg.Value, Trace: m.span.SpanContext(), ID: p.messageID(m.msg)}
		}
		results, err := p.c.proc.Process(p.work, msgs)

		retryAs := billing.RetryFor(err)
		failed := retryAs.Cause
		var again []*message
		for i, r := range results {
			m := pending[i]
			switch r.Outcome {
			case billing.Pending:
				again = append(again, m)
				continue
			case billing.Parked:
				code, perr := p.c.dlq.Park(m.msg, r.Reason())
				if perr != nil {
					err, failed = errors.Join(err, perr), "dlq"
					again = append(again, m)
					continue
				}
				if code != r.Code { // parked as a reference: say so, and why it was parked
					r.Code, r.Detail = code, r.Reason()
				}
			}
			p.finish(m, r)
		}
		if len(again) == 0 {
			return
		}

		if retry == nil {
			retry = backoff.NewExponentialBackOff()
			retry.InitialInterval = 100 * time.Millisecond
			retry.MaxInterval = 5 * time.Second
		}
		wait := max(retry.NextBackOff(), retryAs.After)
		p.c.metrics.Retries.WithLabelValues(failed).Inc()
		p.c.log.Warn("retrying messages", "topic", p.topic, "partition", p.id,
			"offset", again[0].msg.Offset, "trace_id", traceID(again[0].span), "messages", len(again),
			"attempt", attempt, "retry_in", wait, "err", err)
		if !p.wait(wait, len(again)) {
			p.abandon(again)
			return
		}
		pending = again
	}
}

// wait sleeps d unless the claim ends first; it reports whether to go on.
func (p *partition) wait(d time.Duration, messages int) bool {
	p.c.metrics.Retrying.Add(float64(messages))
	defer p.c.metrics.Retrying.Sub(float64(messages))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.stopped:
		return false
	}
}

// finish counts a finished message, marks what became committable and
// frees its in-flight slot.
func (p *partition) finish(m *message, r billing.Result) {
	now := time.Now()
	p.c.metrics.Events.WithLabelValues(r.Outcome.String()).Inc()
	p.c.metrics.Processing.Observe(now.Sub(m.taken).Seconds())
	if !r.Event.OccurredAt.IsZero() {
		p.c.metrics.EndToEnd.Observe(now.Sub(r.Event.OccurredAt).Seconds())
	}
	if r.Outcome == billing.Parked {
		p.c.metrics.DLQ.WithLabelValues(r.Code).Inc()
		p.c.log.Warn("message parked in dead-letter topic", append(p.attrs(m, r), "reason", r.Reason())...)
	} else if p.c.log.Enabled(p.work, slog.LevelDebug) { // the attributes cost allocations per event
		p.c.log.Debug("message processed", p.attrs(m, r)...)
	}

	if r.Event.OccurredAt.IsZero() {
		m.span.SetAttributes(attribute.String("billing.outcome", r.Outcome.String()))
	} else {
		m.span.SetAttributes(semconv.MessagingMessageID(r.Event.ID.String()), attribute.String("billing.outcome", r.Outcome.String()))
	}
	if r.Outcome == billing.Parked {
		m.span.SetStatus(codes.Error, r.Reason())
	}
	m.span.End()

	if next, ok := p.tracker.finish(m.msg.Offset); ok {
		p.sess.MarkOffset(p.topic, p.id, next, "")
		if p.c.opts.CommitEveryMessage {
			p.sess.Commit()
		}
	}
	<-p.c.tokens
}

// attrs are the log attributes of a message: where it is and what it was.
func (p *partition) attrs(m *message, r billing.Result) []any {
	a := []any{"topic", p.topic, "partition", p.id, "offset", m.msg.Offset, "trace_id", traceID(m.span), "outcome", r.Outcome.String()}
	if !r.Event.OccurredAt.IsZero() {
		a = append(a, "event_id", r.Event.ID.String())
	}
	return a
}

// abandon gives up messages when the claim ends: they are not marked, so the
// partition's next owner gets them again.
func (p *partition) abandon(ms []*message) {
	for _, m := range ms {
		m.span.SetStatus(codes.Error, "abandoned: the partition was released; its next owner processes it")
		m.span.End()
		<-p.c.tokens
	}
}

// messageID names a message for billing.Message.ID: group, topic,
// partition and offset identify it across redeliveries and processes.
func (p *partition) messageID(m *sarama.ConsumerMessage) string {
	return fmt.Sprintf("%s/%s/%d/%d", p.c.opts.Group, m.Topic, m.Partition, m.Offset)
}

// traceID is the trace id of a message's span, "" when it has none.
func traceID(span trace.Span) string {
	if sc := span.SpanContext(); sc.HasTraceID() {
		return sc.TraceID().String()
	}
	return ""
}
