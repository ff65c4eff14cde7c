package consumer

// This file is one claimed partition's life: its messages are taken off
// the claim while the in-flight budget allows, handed to billing one key
// at a time (one key's messages in offset order, every key at once), and
// finished — counted, marked under the commit rule, or parked — as billing
// answers; a key whose message must be retried waits for it alone.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/cenkalti/backoff/v5"
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

// partition is the consumption of one claimed partition. Its state is
// owned by the goroutine of run; billing's answers, the dead-letter
// writes and the retry timers reach it through its inbox.
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
	queued      []queued // read off the claim, not yet taken (no in-flight slot yet)
	queuedBytes int64
	keys        map[string]*key // keys with messages taken and unfinished
	held        []*key          // keys whose next message waits for the membership to be confirmed
	// inFlight counts messages handed to billing or to the dead-letter
	// writer whose answer has not come back.
	inFlight int
	inbox    *inbox
	// retried and retrying feed the "retrying messages" log line, written
	// once a second at most rather than for each message of an outage.
	retried  int
	lastWarn time.Time
	// work is the context of the messages handed out. It outlives the
	// claim by the drain timeout so that a transaction in progress can
	// commit rather than be cut off half way.
	work       context.Context
	cancelWork context.CancelFunc
	// draining: the claim ended; billing sends no new charge for its
	// messages (Holds), while those sent are answered and settled.
	draining atomic.Bool
}

// Holds is the partition's fence (billing.Fence): billing may send a charge
// for one of its messages while the claim goes on and the coordinator
// confirms the membership. A claim that ended (revoked, or the consumer
// stopping) sends nothing more, and neither does a member cut off from the
// brokers, whose partitions may be another's by now (membership.go).
func (p *partition) Holds() bool { return !p.draining.Load() && p.c.member.holds() }

// key is one key's unfinished messages, in offset order.
type key struct {
	name string
	msgs []*message // msgs[0] is with billing, or waits for its retry
	busy bool       // msgs[0] is with billing or the dead-letter writer
	// retrying: msgs[0] failed and waits for its retry (counted, with the
	// messages behind it, in billing_messages_retrying).
	retrying bool
	retry    *backoff.ExponentialBackOff
	timer    *time.Timer
}

// message is a record taken off a claim, with the time it was taken, the
// span of its processing and its event.
type message struct {
	msg   *sarama.ConsumerMessage
	taken time.Time
	span  trace.Span
	size  int64 // key and value bytes, counted in Consumer.bytes until finished
	// event is the record's order.confirmed.v1 event (order.Parse), or
	// invalid says why it is none: the message goes to the dead-letter
	// topic without reaching billing.
	event   order.Event
	invalid error
}

// sizeOf is what a message counts against MaxInFlightBytes.
func sizeOf(m *sarama.ConsumerMessage) int64 { return int64(len(m.Key) + len(m.Value)) }

// answer is what comes back for a message handed out: billing's result, a
// dead-letter write's, a retry that is due (m nil, due set), or an offset
// the partition may be marked up to once idle (step: markers.go).
type answer struct {
	m      *message
	res    billing.Result
	err    error
	parked bool // the dead-letter writer's answer: err nil when the DLQ took it
	due    *key
	step   int64
}

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
		inbox:      newInbox(),
		work:       work,
		cancelWork: cancel,
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
	p.cancelWork()
	p.inbox.close()
}

// consume reads the claim's messages and handles the answers until the
// claim ends (a revocation closes messages), the session ends, or the
// partition is consumed again from the database's position.
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
		var confirmed <-chan struct{}
		if len(p.held) > 0 {
			confirmed = p.c.member.changes()
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
		case <-p.inbox.ready:
			for _, a := range p.inbox.takeAll() {
				p.handle(a, false)
			}
		case <-confirmed:
			p.dispatchHeld()
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
// queues it behind its key's unfinished messages, handing it to billing at
// once when there are none. It holds an in-flight slot from now on.
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
	msg.event, msg.invalid = order.Parse(m.Value)

	name := string(m.Key)
	k, ok := p.keys[name]
	if !ok {
		k = &key{name: name}
		p.keys[name] = k
	}
	k.msgs = append(k.msgs, msg)
	switch {
	case k.retrying:
		p.c.metrics.Retrying.Inc()
	case len(k.msgs) == 1:
		p.dispatch(k)
	}
}

// dispatch hands k's oldest unfinished message to billing; while the
// coordinator does not confirm the membership it waits (held), since the
// partition may be another member's by now.
func (p *partition) dispatch(k *key) {
	if !p.c.member.holds() {
		p.held = append(p.held, k)
		return
	}
	m := k.msgs[0]
	if m.invalid != nil {
		p.park(k, billing.Result{Outcome: billing.Parked, Reason: reason.Reason{Code: reason.InvalidEvent, Detail: m.invalid.Error()}})
		return
	}
	k.busy = true
	p.inFlight++
	msg := billing.Message{Event: m.event, Trace: m.span.SpanContext(), ID: p.messageID(m.msg), Fence: p}
	p.c.proc.Submit(p.work, msg, func(r billing.Result, err error) {
		p.inbox.post(answer{m: m, res: r, err: err})
	})
}

// dispatchHeld dispatches the held keys once the membership is confirmed
// again.
func (p *partition) dispatchHeld() {
	if !p.c.member.holds() {
		return
	}
	held := p.held
	p.held = nil
	for _, k := range held {
		p.dispatch(k)
	}
}

// handle acts on an answer. draining: the claim has ended, so nothing is
// retried or started any more; what cannot finish now is given up.
func (p *partition) handle(a answer, draining bool) {
	if a.step > 0 {
		p.commit.stepTo(a.step)
		return
	}
	if a.due != nil {
		a.due.timer = nil
		if !draining {
			p.resume(a.due)
		}
		return
	}
	p.inFlight--
	k := p.keys[string(a.m.msg.Key)]
	k.busy = false
	switch {
	case a.parked && a.err != nil:
		p.retry(k, a.err, draining)
	case a.parked:
		p.done(k, a.res)
	case a.res.Outcome == billing.Pending:
		p.retry(k, a.err, draining)
	case a.res.Outcome == billing.Parked:
		p.park(k, a.res)
	default:
		p.done(k, a.res)
	}
}

// park writes k's message to the dead-letter topic, on a goroutine of its
// own: the broker's acknowledgement comes back as an answer, with the
// reason it was parked under (an oversize one when only a reference fit).
func (p *partition) park(k *key, r billing.Result) {
	k.busy = true
	p.inFlight++
	m := k.msgs[0]
	go func() {
		parked, err := p.c.dlq.Park(m.msg, r.Reason)
		r.Reason = parked
		p.inbox.post(answer{m: m, res: r, err: err, parked: true})
	}()
}

// done finishes k's oldest message with r and dispatches its next one.
func (p *partition) done(k *key, r billing.Result) {
	m := k.msgs[0]
	k.msgs[0] = nil // the backing array must not keep it alive
	k.msgs = k.msgs[1:]
	p.finish(m, r)
	if k.retrying {
		k.retrying = false
		p.c.metrics.Retrying.Sub(float64(len(k.msgs) + 1))
	}
	k.retry = nil
	if len(k.msgs) == 0 {
		delete(p.keys, k.name)
		return
	}
	p.dispatch(k)
}

// retryAfter is what an error that leaves a message to retry may say: the
// least wait (a payment provider's Retry-After).
type retryAfter interface {
	error
	RetryAfter() time.Duration
}

// retry sets k aside until its message is tried again, with exponential
// backoff and jitter (at least the Retry-After err carries); its later
// messages wait behind it. The other keys go on.
func (p *partition) retry(k *key, err error, draining bool) {
	if draining {
		return // given up with the rest when the drain ends
	}
	if k.retry == nil {
		k.retry = backoff.NewExponentialBackOff()
		k.retry.InitialInterval = 100 * time.Millisecond
		k.retry.MaxInterval = 5 * time.Second
	}
	wait := k.retry.NextBackOff()
	if ra, ok := errors.AsType[retryAfter](err); ok {
		wait = max(wait, ra.RetryAfter())
	}
	if !k.retrying {
		k.retrying = true
		p.c.metrics.Retrying.Add(float64(len(k.msgs)))
	}
	k.timer = time.AfterFunc(wait, func() { p.inbox.post(answer{due: k}) })
	p.retried++
	if now := time.Now(); now.Sub(p.lastWarn) >= time.Second {
		p.c.log.Warn("retrying messages", "topic", p.topic, "partition", p.id,
			"offset", k.msgs[0].msg.Offset, "trace_id", traceID(k.msgs[0].span), "messages", p.retried,
			"keys_waiting", p.retryingKeys(), "retry_in", wait, "err", err)
		p.retried, p.lastWarn = 0, now
	}
}

// resume tries k's message again.
func (p *partition) resume(k *key) {
	if len(k.msgs) == 0 || k.busy {
		return
	}
	p.dispatch(k)
}

func (p *partition) retryingKeys() int {
	n := 0
	for _, k := range p.keys {
		if k.retrying {
			n++
		}
	}
	return n
}

// drain lets the messages with billing or the dead-letter writer finish,
// within the drain timeout, and then gives up every unfinished message.
// Billing sends no new charge meanwhile (Holds): the requests already at
// the provider are answered and settled, and their offsets committed with
// the session's end.
func (p *partition) drain() {
	p.draining.Store(true)
	for _, k := range p.keys {
		if k.timer != nil {
			k.timer.Stop()
		}
	}
	timeout := time.NewTimer(p.c.opts.DrainTimeout)
	defer timeout.Stop()
	for p.inFlight > 0 {
		select {
		case <-p.inbox.ready:
			for _, a := range p.inbox.takeAll() {
				p.handle(a, true)
			}
		case <-timeout.C:
			p.c.log.Warn("drain timeout: abandoning in-flight work", "topic", p.topic, "partition", p.id, "in_flight", p.inFlight)
			p.inFlight = 0
		}
	}
	for name, k := range p.keys {
		p.abandon(k.msgs)
		if k.retrying {
			p.c.metrics.Retrying.Sub(float64(len(k.msgs)))
		}
		delete(p.keys, name)
	}
	p.held = nil
	p.queued = nil // never taken: neither counted nor marked
}

// finish marks what became committable once m is finished with r (billing
// counted its outcome where it decided it, the dead-letter writer a parked
// one), ends its span and frees its in-flight slot.
func (p *partition) finish(m *message, r billing.Result) {
	p.c.metrics.Processing.Observe(time.Since(m.taken).Seconds())
	if r.Outcome == billing.Parked {
		p.c.log.Warn("message parked in dead-letter topic", append(p.attrs(m, r), "reason", r.Reason.String())...)
	} else if p.c.log.Enabled(p.work, slog.LevelDebug) { // the attributes cost allocations per event
		p.c.log.Debug("message processed", p.attrs(m, r)...)
	}

	if m.invalid != nil {
		m.span.SetAttributes(attribute.String("billing.outcome", r.Outcome.String()))
	} else {
		m.span.SetAttributes(semconv.MessagingMessageID(m.event.ID.String()), attribute.String("billing.outcome", r.Outcome.String()))
	}
	if r.Outcome == billing.Parked {
		m.span.SetStatus(codes.Error, r.Reason.String())
	}
	m.span.End()

	// The commit rule: an offset is committed only when it and every
	// offset before it in the partition are finished (settled, counted,
	// or parked and acknowledged by the DLQ), so a crash redelivers, never
	// skips. The committer (committer.go) keeps it.
	p.commit.finish(m.msg.Offset)
	p.c.bytes.Add(-m.size)
	<-p.c.tokens
}

// attrs are the log attributes of a message: where it is and what it was.
func (p *partition) attrs(m *message, r billing.Result) []any {
	a := []any{"topic", p.topic, "partition", p.id, "offset", m.msg.Offset, "trace_id", traceID(m.span), "outcome", r.Outcome.String()}
	if m.invalid == nil {
		a = append(a, "event_id", m.event.ID.String())
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

// inbox is where answers wait for the partition's goroutine: posting never
// blocks, so that billing's writers never wait for one partition.
type inbox struct {
	mu     sync.Mutex
	items  []answer
	closed bool
	ready  chan struct{} // signalled when items arrive
}

func newInbox() *inbox { return &inbox{ready: make(chan struct{}, 1)} }

// post delivers a; after close (the partition is gone, its messages given
// up) it is dropped.
func (b *inbox) post(a answer) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.items = append(b.items, a)
	select {
	case b.ready <- struct{}{}:
	default:
	}
}

// takeAll returns what was posted, in order.
func (b *inbox) takeAll() []answer {
	b.mu.Lock()
	defer b.mu.Unlock()
	items := b.items
	b.items = nil
	return items
}

func (b *inbox) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	b.items = nil
}
