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
	"slices"
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
	pos     *position
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
		pos:        newPosition(claim.InitialOffset()),
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

// held is a key of a lane whose oldest unfinished message failed for a
// reason outside the event (an outage) and waits to be tried again. The
// key's later messages wait behind it, in offset order; the lane's other
// keys go on.
type held struct {
	msgs   []*message // msgs[0] is tried again at at
	at     time.Time
	trying bool // msgs[0] is in the batch being settled
	// first: msgs[0] was the first message its attempt left pending, the
	// likely cause of the others' failing with it; it goes last next time.
	first bool
	// retry is shared by the keys that failed in the same attempt, so that
	// keys failing together (a database outage) are retried together, in
	// one batch, and back off as one.
	retry *backoff.ExponentialBackOff
	tries int // attempts of msgs[0] so far
}

// lane runs one lane: it takes batches of its keys' messages, settles them,
// and sets a key aside when its message must be retried, so that one failing
// key holds back only its own messages.
type lane struct {
	p     *partition
	in    <-chan *message
	held  map[string]*held
	count int     // messages in held
	due   []*held // scratch space of next
}

func (p *partition) runLane(in <-chan *message) {
	l := &lane{p: p, in: in, held: make(map[string]*held)}
	batch := make([]*message, 0, p.c.opts.BatchMax)
	for {
		batch, open := l.next(batch[:0])
		// A member the coordinator no longer confirms may have lost its
		// partitions: it starts nothing until confirmed again.
		if p.isStopped() || !open || !p.c.member.await(p.stopped) {
			l.abandon(batch)
			return
		}
		l.settle(batch)
		clear(batch) // finished messages must not stay alive in the reused array
	}
}

// next fills batch with the messages to try now: messages off the lane's
// queue (setting aside those of held keys), then the held keys whose retry
// is due. It blocks until there is one, and reports false when the queue
// is closed or the claim ended.
//
// The retried messages go last: a processor that stops at a failing event
// and leaves the rest of the batch pending (as a transaction does) then
// settles the new messages before it meets the failing one again, instead
// of failing them with it.
func (l *lane) next(batch []*message) ([]*message, bool) {
	for {
		now := time.Now()
		var wake time.Time
		due := l.due[:0]
		for _, h := range l.held {
			switch {
			case h.trying:
			case !h.at.After(now) && len(due) < cap(batch):
				h.trying = true
				due = append(due, h)
			case wake.IsZero() || h.at.Before(wake):
				wake = h.at
			}
		}
		// Of the retried messages, the first to fail last time go last:
		// the others, pending only because they were behind it, get
		// through.
		slices.SortStableFunc(due, func(a, b *held) int {
			switch {
			case a.first == b.first:
				return 0
			case a.first:
				return 1
			}
			return -1
		})
		l.due = due
		open := true
	fill:
		for len(batch)+len(due) < cap(batch) {
			select {
			case m, ok := <-l.in:
				if !ok {
					open = false
					break fill
				}
				l.took()
				batch = l.admit(batch, m)
			default:
				break fill
			}
		}
		for _, h := range due {
			batch = append(batch, h.msgs[0])
		}
		clear(due)
		if len(batch) > 0 || !open {
			return batch, open
		}

		var timer <-chan time.Time
		if !wake.IsZero() {
			timer = time.After(time.Until(wake))
		}
		select {
		case m, ok := <-l.in:
			if !ok {
				return batch, false
			}
			l.took()
			batch = l.admit(batch, m) // and fill the batch from the top
		case <-timer:
		case <-l.p.stopped:
			return batch, false
		}
	}
}

// admit adds m to batch, or to its key's held messages when the key waits
// for a retry: one key's messages are settled in offset order.
func (l *lane) admit(batch []*message, m *message) []*message {
	if h, ok := l.held[string(m.msg.Key)]; ok {
		h.msgs = append(h.msgs, m)
		l.hold(1)
		return batch
	}
	return append(batch, m)
}

// took tells the dispatcher, which may be waiting for room in this lane's
// queue, that a message left it.
func (l *lane) took() {
	select {
	case l.p.room <- struct{}{}:
	default:
	}
}

func (l *lane) hold(n int) {
	l.count += n
	l.p.c.metrics.Retrying.Add(float64(n))
}

// settle tries batch once: finished messages are counted and marked (a
// held key's next message is then due at once); messages billing left
// pending set their key aside until a retry with exponential backoff and
// jitter.
func (l *lane) settle(batch []*message) {
	p := l.p
	msgs := make([]billing.Message, len(batch))
	for i, m := range batch {
		msgs[i] = billing.Message{Value: m.msg.Value, Trace: m.span.SpanContext(), ID: p.messageID(m.msg)}
	}
	results, err := p.c.proc.Process(p.work, msgs)

	retryAs := billing.RetryFor(err)
	failed := retryAs.Cause
	var again []*message
	for i, r := range results {
		m := batch[i]
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
		l.release(m)
	}
	if len(again) == 0 {
		return
	}

	// The keys that failed together back off together, on the backoff of
	// the longest-failing of them.
	var retry *backoff.ExponentialBackOff
	tries := 0
	for _, m := range again {
		if h, ok := l.held[string(m.msg.Key)]; ok && h.msgs[0] == m && h.tries > tries {
			retry, tries = h.retry, h.tries
		}
	}
	if retry == nil {
		retry = backoff.NewExponentialBackOff()
		retry.InitialInterval = 100 * time.Millisecond
		retry.MaxInterval = 5 * time.Second
	}
	wait := max(retry.NextBackOff(), retryAs.After)
	at := time.Now().Add(wait)
	for _, m := range again {
		key := string(m.msg.Key)
		h, ok := l.held[key]
		switch {
		case !ok:
			h = &held{msgs: []*message{m}}
			l.held[key] = h
			l.hold(1)
		case h.msgs[0] != m:
			// A later message of a key that failed earlier in this batch:
			// it waits behind it. Messages admitted since are later still.
			h.msgs = append(h.msgs, nil)
			copy(h.msgs[2:], h.msgs[1:])
			h.msgs[1] = m
			l.hold(1)
			continue
		}
		h.at, h.retry, h.tries, h.trying, h.first = at, retry, h.tries+1, false, m == again[0]
	}
	p.c.metrics.Retries.WithLabelValues(failed).Inc()
	p.c.log.Warn("retrying messages", "topic", p.topic, "partition", p.id,
		"offset", again[0].msg.Offset, "trace_id", traceID(again[0].span), "messages", len(again),
		"keys_held", len(l.held), "attempt", tries+1, "retry_in", wait, "err", err)
}

// release ends m's hold on its key, if it held it: the key's next message
// is due at once.
func (l *lane) release(m *message) {
	key := string(m.msg.Key)
	h, ok := l.held[key]
	if !ok || h.msgs[0] != m {
		return
	}
	l.hold(-1)
	h.msgs[0] = nil
	h.msgs = h.msgs[1:]
	if len(h.msgs) == 0 {
		delete(l.held, key)
		return
	}
	h.at, h.retry, h.tries, h.trying = time.Time{}, nil, 0, false
}

// abandon gives up the lane's messages when the claim ends: batch, the held
// keys' messages and whatever is still queued.
func (l *lane) abandon(batch []*message) {
	// A held key's message in the batch goes with its key below.
	l.p.abandon(slices.DeleteFunc(batch, func(m *message) bool {
		h := l.held[string(m.msg.Key)]
		return h != nil && h.msgs[0] == m
	}))
	for key, h := range l.held {
		l.p.abandon(h.msgs)
		l.hold(-len(h.msgs))
		delete(l.held, key)
	}
	for m := range l.in {
		l.p.abandon([]*message{m})
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
	// The tracker says when the lowest unfinished offset moved. It is
	// marked once the database saved it as the partition's position
	// (position.go, every second), so that Kafka's commit never passes what
	// the database knows. Marking is not committing: sarama's auto-commit
	// (ConsumerConfig: every second, and at the end of a session) commits
	// what was marked, and KAFKA_COMMIT_EVERY_MESSAGE marks and commits at
	// once, as the seed did.
	if next, ok := p.tracker.finish(m.msg.Offset); ok {
		p.pos.done.Store(next)
		if p.c.positions == nil {
			p.sess.MarkOffset(p.topic, p.id, next, "")
			if p.c.opts.CommitEveryMessage {
				p.sess.Commit()
			}
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
