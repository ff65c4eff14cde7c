package consumer

// This file is one claimed partition's life: its messages are taken off
// the claim while the in-flight budget allows, each handed to its key's
// goroutine (key.go), finished (counted, marked under the commit rule),
// and, when the claim ends, drained and released.

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.17.0"
	"go.opentelemetry.io/otel/trace"

	"example.com/billing/internal/billing"
	"example.com/billing/internal/dlq/reason"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/order"
	"example.com/billing/internal/tracing"
)

// partition is the consumption of one claimed partition: its claim is
// read by the goroutine of run (sarama's), its keys' messages handled by
// a goroutine per key (handleKey).
type partition struct {
	c     *Consumer
	sess  sarama.ConsumerGroupSession
	claim sarama.ConsumerGroupClaim
	topic string
	id    int32
	// initial is the offset the claim started at (sarama.OffsetOldest for
	// a group that never committed).
	initial int64

	commit      committer
	queued      []queued // read off the claim, not yet taken (no in-flight slot yet); run's own
	queuedBytes int64

	mu sync.Mutex
	// keys are the keys with messages taken and unfinished, each handled
	// by its goroutine (guarded by mu).
	keys map[string]*key
	// retried and lastWarn feed the "retrying messages" log line, written
	// once a second at most rather than for each message of an outage
	// (guarded by mu).
	retried  int
	lastWarn time.Time
	// handling counts the keys' goroutines.
	handling sync.WaitGroup

	// released is set once the claim's end was committed: a key's
	// goroutine that outlived the drain marks nothing after it (guarded
	// by releasing; marks take it shared).
	releasing sync.RWMutex
	released  bool

	// work is the context of the messages handed to billing. It outlives
	// the claim by the drain timeout so that a transaction in progress can
	// commit rather than be cut off half way.
	work       context.Context
	cancelWork context.CancelFunc
	// draining: the claim ended; billing sends no new charge for its
	// messages (Holds), while those sent are answered and settled, and no
	// key starts a new message or a retry. ended is closed with it, for
	// the keys waiting for a retry or the membership.
	draining atomic.Bool
	ended    chan struct{}
}

// Holds is the partition's fence (billing.Fence): billing may send a charge
// for one of its messages while the claim goes on and the coordinator
// confirms the membership. A claim that ended (revoked, or the consumer
// stopping) sends nothing more, and neither does a member cut off from the
// brokers, whose partitions may be another's by now (membership.go).
func (p *partition) Holds() bool { return !p.draining.Load() && p.c.member.holds() }

// message is a record taken off a claim, with the time it was taken, the
// span of its processing, what it is for billing and what became of it.
// It lives on the heap: its key's goroutine waits in a few small frames
// while billing has it (handle).
type message struct {
	msg   *sarama.ConsumerMessage
	taken time.Time
	span  trace.Span
	size  int64 // key and value bytes, counted in Consumer.bytes until finished
	// bill holds the record's order.confirmed.v1 event (order.Parse), or
	// invalid says why it is none: the message goes to the dead-letter
	// topic without reaching billing.
	bill    billing.Message
	invalid error
	// res is its outcome: billing's (once decided is set), or Parked
	// invalid-event.
	res     billing.Result
	decided bool
}

// sizeOf is what a message counts against MaxInFlightBytes.
func sizeOf(m *sarama.ConsumerMessage) int64 { return int64(len(m.Key) + len(m.Value)) }

func (c *Consumer) newPartition(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) *partition {
	work, cancel := context.WithCancel(context.WithoutCancel(sess.Context()))
	p := &partition{
		c:          c,
		sess:       sess,
		claim:      claim,
		topic:      claim.Topic(),
		id:         claim.Partition(),
		initial:    claim.InitialOffset(),
		keys:       make(map[string]*key),
		work:       work,
		cancelWork: cancel,
		ended:      make(chan struct{}),
	}
	p.commit = c.newCommitter(p)
	return p
}

// run consumes messages until the claim ends, then lets the work in flight
// finish within the drain timeout and gives up the rest, unmarked: the
// partition's next owner gets it again.
func (p *partition) run(messages <-chan *sarama.ConsumerMessage) {
	p.consume(messages)
	p.drain()
}

// consume reads the claim's messages until the claim ends (a revocation
// closes messages), the session ends, or the partition is consumed again
// from the database's position.
//
// It never blocks on anything but its inputs, so that it sees the end of
// the claim at once, even when every in-flight slot is taken or keys are
// stuck retrying: revocation must not wait for an outage to end. So it
// reads the claim all the time; a message read waits in p.queued until it
// can be taken: with an in-flight slot (MaxInFlight, all partitions of this
// instance) and while the messages in flight hold less than
// MaxInFlightBytes (a message larger than the whole budget goes when
// nothing else is in flight). When too much waits, fetching the partition
// is paused until it drains: what sarama had fetched still arrives, nothing
// more. Memory stays bounded whatever the keys do.
func (p *partition) consume(messages <-chan *sarama.ConsumerMessage) {
	done := p.sess.Context().Done()
	paused := false
	defer func() {
		if paused {
			p.c.group.Resume(map[string][]int32{p.topic: {p.id}})
		}
	}()
	for {
		var slot chan<- struct{}
		var overBytes <-chan time.Time // ticks while the byte budget is spent
		if len(p.queued) > 0 {
			if p.c.overBudget() {
				// Finished messages free bytes on any partition: look
				// again in a few milliseconds.
				overBytes = time.After(5 * time.Millisecond)
			} else {
				slot = p.c.tokens
			}
		}
		select {
		case m, ok := <-messages:
			if !ok {
				return
			}
			p.commit.add(m.Offset)
			p.queued = append(p.queued, queued{msg: m, read: time.Now()})
			p.queuedBytes += sizeOf(m)
			if !paused && (len(p.queued) >= maxQueued || p.queuedBytes >= maxQueuedBytes) {
				p.c.group.Pause(map[string][]int32{p.topic: {p.id}})
				paused = true
			}
		case slot <- struct{}{}:
			w := p.queued[0]
			p.queued[0] = queued{} // the backing array must not keep it alive
			p.queued = p.queued[1:]
			p.queuedBytes -= sizeOf(w.msg)
			if paused && len(p.queued) <= maxQueued/2 && p.queuedBytes < maxQueuedBytes/2 {
				p.c.group.Resume(map[string][]int32{p.topic: {p.id}})
				paused = false
			}
			p.take(w)
		case <-overBytes:
		case <-done:
			return
		case <-p.commit.rewound(): // consumed again from the database's position, in a session of its own
			return
		}
	}
}

// A partition pauses fetching while this much waits to be taken: a few
// hundred events, or one large message.
const (
	maxQueued      = 256
	maxQueuedBytes = 1 << 20
)

// queued is a message read off the claim and not yet taken.
type queued struct {
	msg  *sarama.ConsumerMessage
	read time.Time
}

// overBudget reports whether the messages in flight hold MaxInFlightBytes.
func (c *Consumer) overBudget() bool {
	spent := c.bytes.Load()
	return spent > 0 && spent >= c.opts.MaxInFlightBytes
}

// take starts the processing span of w's message (a consumer span below
// the producer's, whose trace context travels in the record's headers) and
// queues it behind its key's unfinished messages, starting the key's
// goroutine when there are none. It holds an in-flight slot from now on.
func (p *partition) take(w queued) {
	m := w.msg
	parent := tracing.Propagator().Extract(context.Background(), kafka.ConsumerHeaders(m.Headers))
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(kafka.MessageAttributes(m, p.c.opts.Group)...),
	}
	if trace.SpanContextFromContext(parent).IsValid() {
		// Child of the producer's span and linked to it, as the messaging
		// conventions describe for a message processed on its own.
		opts = append(opts, trace.WithLinks(trace.LinkFromContext(parent)))
	}
	_, span := p.c.tracer.Start(parent, p.topic+" process", opts...)
	size := sizeOf(m)
	p.c.bytes.Add(size)
	msg := &message{msg: m, taken: w.read, span: span, size: size}
	if ev, err := order.Parse(m.Value); err != nil {
		msg.invalid, msg.decided = err, true
		msg.res = billing.Result{Outcome: billing.Parked, Reason: reason.Reason{Code: reason.InvalidEvent, Detail: err.Error()}}
	} else {
		msg.bill = billing.Message{Event: ev, Trace: span.SpanContext(), ID: p.messageID(m), Fence: p}
	}

	name := string(m.Key)
	p.mu.Lock()
	k, running := p.keys[name]
	if !running {
		k = &key{name: name}
		p.keys[name] = k
	}
	k.msgs = append(k.msgs, msg)
	if k.retrying {
		p.c.metrics.Retrying.Inc()
	}
	p.mu.Unlock()
	if !running {
		p.handling.Go(func() { p.handleKey(k) })
	}
}

// drain lets the keys' messages in flight finish, within the drain
// timeout, and then gives up every unfinished message: billing sends no
// new charge meanwhile (Holds), the requests already at the provider are
// answered and settled, and the messages finished in time are committed
// with the session's end. A key still busy past the timeout (a request
// answered later) is left to finish on its own; it marks nothing after
// the release, and gives up its messages when it ends.
func (p *partition) drain() {
	p.draining.Store(true)
	close(p.ended)
	p.queued = nil // never taken: neither counted nor marked
	handled := make(chan struct{})
	go func() {
		p.handling.Wait()
		close(handled)
	}()
	timeout := time.NewTimer(p.c.opts.DrainTimeout)
	defer timeout.Stop()
	select {
	case <-handled:
	case <-timeout.C:
		p.mu.Lock()
		busy := len(p.keys)
		p.mu.Unlock()
		p.c.log.Warn("drain timeout: abandoning in-flight work", "topic", p.topic, "partition", p.id, "keys_in_flight", busy)
	}
	p.cancelWork()
}

// release ends the claim's marking: from now on a finished message is not
// marked (its offset is the partition's next owner's to commit).
func (p *partition) release() {
	p.releasing.Lock()
	defer p.releasing.Unlock()
	p.released = true
}

// mark records offset as finished with the committer, unless the claim
// was released.
func (p *partition) mark(offset int64) {
	p.releasing.RLock()
	defer p.releasing.RUnlock()
	if !p.released {
		p.commit.finish(offset)
	}
}

// stepTo moves the partition's finished prefix over transaction markers
// (markers.go), unless the claim was released.
func (p *partition) stepTo(to int64) {
	p.releasing.RLock()
	defer p.releasing.RUnlock()
	if !p.released {
		p.commit.stepTo(to)
	}
}

// finish marks what became committable once m is finished (billing
// counted its outcome where it decided it, the dead-letter writer a parked
// one), ends its span and frees its in-flight slot.
func (p *partition) finish(m *message) {
	r := &m.res
	p.c.metrics.Processing.Observe(time.Since(m.taken).Seconds())
	if r.Outcome == billing.Parked {
		p.c.log.Warn("message parked in dead-letter topic", append(p.attrs(m, r), "reason", r.Reason.String())...)
	} else if p.c.log.Enabled(p.work, slog.LevelDebug) { // the attributes cost allocations per event
		p.c.log.Debug("message processed", p.attrs(m, r)...)
	}

	if m.invalid != nil {
		m.span.SetAttributes(attribute.String("billing.outcome", r.Outcome.String()))
	} else {
		m.span.SetAttributes(semconv.MessagingMessageID(m.bill.Event.ID.String()), attribute.String("billing.outcome", r.Outcome.String()))
	}
	if r.Outcome == billing.Parked {
		m.span.SetStatus(codes.Error, r.Reason.String())
	}
	m.span.End()

	// The commit rule: an offset is committed only when it and every
	// offset before it in the partition are finished (settled, counted,
	// or parked and acknowledged by the DLQ), so a crash redelivers, never
	// skips. The committer (committer.go) keeps it.
	p.mark(m.msg.Offset)
	p.c.bytes.Add(-m.size)
	<-p.c.tokens
}

// attrs are the log attributes of a message: where it is and what it was.
func (p *partition) attrs(m *message, r *billing.Result) []any {
	a := []any{"topic", p.topic, "partition", p.id, "offset", m.msg.Offset, "trace_id", traceID(m.span), "outcome", r.Outcome.String()}
	if m.invalid == nil {
		a = append(a, "event_id", m.bill.Event.ID.String())
	}
	return a
}

// messageID names a message for billing.Message.ID: group, topic,
// partition and offset identify it across redeliveries and processes.
func (p *partition) messageID(m *sarama.ConsumerMessage) string {
	return fmt.Sprintf("%s/%s/%d/%d", p.c.opts.Group, m.Topic, m.Partition, m.Offset)
}
