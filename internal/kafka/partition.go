package kafka

// This file is one claimed partition's life: its lanes (one key, one lane,
// in offset order), each lane's batches handed to billing and retried
// until finished, and the commit rule where offsets are marked. dispatch.go
// feeds the lanes from the claim.

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/cenkalti/backoff/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.17.0"

	"example.com/billing/internal/billing"
)

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

	// The commit rule: an offset is marked only when it and every offset
	// before it in the partition are finished (settled, counted, or parked
	// and acknowledged by the DLQ), so a crash redelivers, never skips.
	// The tracker says when the lowest unfinished offset moved. Marking is
	// not committing: sarama's auto-commit (ConsumerConfig: every second,
	// and at the end of a session) commits what was marked, and
	// KAFKA_COMMIT_EVERY_MESSAGE commits at once as the seed did.
	if next, ok := p.tracker.finish(m.msg.Offset); ok {
		p.sess.MarkOffset(p.topic, p.id, next, "")
		if p.c.opts.CommitEveryMessage {
			p.sess.Commit()
		}
	}
	p.c.bytes.Add(-m.size)
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
		p.c.bytes.Add(-m.size)
		<-p.c.tokens
	}
}

// messageID names a message for billing.Message.ID: group, topic,
// partition and offset identify it across redeliveries and processes.
func (p *partition) messageID(m *sarama.ConsumerMessage) string {
	return fmt.Sprintf("%s/%s/%d/%d", p.c.opts.Group, m.Topic, m.Partition, m.Offset)
}
