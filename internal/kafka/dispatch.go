package kafka

import (
	"context"
	"time"

	"github.com/IBM/sarama"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"example.com/billing/internal/tracing"
)

// message is a record taken off a claim, with the time it was taken and the
// span of its processing.
type message struct {
	msg   *sarama.ConsumerMessage
	taken time.Time
	span  trace.Span
	size  int64 // key and value bytes, counted in Consumer.bytes until finished
}

// sizeOf is what a message counts against MaxInFlightBytes.
func sizeOf(m *sarama.ConsumerMessage) int64 { return int64(len(m.Key) + len(m.Value)) }

// dispatch hands the claim's messages to the lanes until the claim ends.
//
// It never blocks on anything but its inputs, so that it sees the end of the
// claim (a revocation closes messages) even when every in-flight slot is
// taken or a lane is stuck retrying: revocation must not wait for an outage
// to end. Messages wait in a queue per lane until their lane has room and an
// in-flight slot is free. A lane keeps taking messages while one of its keys
// waits for a retry (it sets that key's messages aside), so a key that keeps
// failing holds back only its own messages, not its lane or its partition.
// When too many messages wait, fetching of the partition is paused until
// they drain, which bounds memory in messages;
// while the messages in flight on all partitions hold MaxInFlightBytes,
// it takes no more off the claim, which bounds in bytes what billing
// holds. (What sarama holds is on top: its channel buffer and its decoded
// fetch responses; see BENCHMARKS.md on compressed large messages.)
func (p *partition) dispatch(messages <-chan *sarama.ConsumerMessage) {
	done := p.sess.Context().Done()
	queues := make([][]*message, len(p.lanes))
	waiting, paused, next := 0, false, 0
	limit := 2 * len(p.lanes) * p.c.opts.BatchMax
	defer func() {
		if paused {
			p.c.group.Resume(map[string][]int32{p.topic: {p.id}})
		}
		// Messages never handed to a lane are left for the partition's next
		// owner; their spans end here.
		for _, q := range queues {
			for _, m := range q {
				m.span.SetStatus(codes.Error, "abandoned: the partition was released before it was processed")
				m.span.End()
				p.c.bytes.Add(-m.size)
			}
		}
	}()

	var overBytes <-chan time.Time // ticks while the byte budget is spent
	for {
		// Take messages off the claim only while the byte budget has room
		// (a message larger than the whole budget goes when nothing else
		// is in flight). Finished messages free bytes on any partition, so
		// a full budget is looked at again every few milliseconds.
		in := messages
		overBytes = nil
		if spent := p.c.bytes.Load(); spent > 0 && spent >= p.c.opts.MaxInFlightBytes {
			in = nil
			overBytes = time.After(5 * time.Millisecond)
		}
		// A lane that has waiting messages and room in its queue can take
		// one as soon as an in-flight slot frees up.
		ready := -1
		for i := range queues {
			lane := (next + i) % len(queues)
			if len(queues[lane]) > 0 && len(p.lanes[lane]) < cap(p.lanes[lane]) {
				ready = lane
				break
			}
		}
		var slot chan<- struct{}
		if ready >= 0 {
			slot = p.c.tokens
		}

		select {
		case m, ok := <-in:
			if !ok {
				return
			}
			p.tracker.add(m.Offset)
			lane := laneOf(m.Key, len(p.lanes))
			queues[lane] = append(queues[lane], p.take(m))
			if waiting++; waiting >= limit && !paused {
				p.c.group.Pause(map[string][]int32{p.topic: {p.id}})
				paused = true
			}
		case slot <- struct{}{}:
			// The only sender on this lane's queue: it has room, so this
			// send does not block.
			p.lanes[ready] <- queues[ready][0]
			queues[ready][0] = nil // the backing array must not keep it alive
			queues[ready] = queues[ready][1:]
			next = ready + 1
			if waiting--; paused && waiting <= limit/2 {
				p.c.group.Resume(map[string][]int32{p.topic: {p.id}})
				paused = false
			}
		case <-p.room:
		case <-overBytes:
		case <-done:
			return
		case <-p.pos.rewound: // consumed again from the database's position, in a session of its own
			return
		}
	}
}

// take starts the processing span of m: a consumer span below the
// producer's, whose trace context travels in the record's headers.
func (p *partition) take(m *sarama.ConsumerMessage) *message {
	parent := tracing.Propagator().Extract(context.Background(), consumerHeaders(m.Headers))
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(messageAttributes(m, p.c.opts.Group)...),
	}
	if trace.SpanContextFromContext(parent).IsValid() {
		// Child of the producer's span and linked to it, as the messaging
		// conventions describe for a message processed on its own.
		opts = append(opts, trace.WithLinks(trace.LinkFromContext(parent)))
	}
	_, span := p.c.tracer.Start(parent, p.topic+" process", opts...)
	size := sizeOf(m)
	p.c.bytes.Add(size)
	return &message{msg: m, taken: time.Now(), span: span, size: size}
}
