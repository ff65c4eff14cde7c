package loadgen

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"example.com/billing/internal/kafka"
	"example.com/billing/internal/tracing"
)

// PublishOptions tune Publish.
type PublishOptions struct {
	// Topic to publish to.
	Topic string
	// Rate is the most messages per second; 0 sends as fast as the
	// producer takes them.
	Rate float64
	// Acked, when set, is incremented for every message the broker
	// acknowledged, for progress displays.
	Acked *atomic.Int64
	// Tracer, when set, gives each message a producer span whose context
	// travels in the record's traceparent header, so that the consumer's
	// spans join the producer's trace.
	Tracer trace.Tracer
}

// Result says what Publish did.
type Result struct {
	// Produced counts the messages the broker acknowledged.
	Produced int
	Elapsed  time.Duration
}

// Publish sends every remaining message of g to opts.Topic through p and
// waits until the broker acknowledged them all. p must return successes and
// errors (Producer.Return.Successes and .Errors), as kafka.ProducerConfig
// sets; the caller owns p and closes it.
//
// Each message is generated just before it is handed to the producer, so
// its occurredAt is its send time. On the first failed message Publish stops
// sending, waits for the messages in flight and returns the error; when ctx
// ends it returns at once (closing p then settles what is in flight).
func Publish(ctx context.Context, p sarama.AsyncProducer, g *Generator, opts PublishOptions) (Result, error) {
	start := time.Now()
	var sent, settled, produced int
	var firstErr error
	// settle counts the broker's answer about pm and ends its span.
	settle := func(pm *sarama.ProducerMessage, err error) {
		endSpan(pm, err)
		settled++
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			return
		}
		produced++
		if opts.Acked != nil {
			opts.Acked.Add(1)
		}
	}
	var pace *time.Timer
	defer func() {
		if pace != nil {
			pace.Stop()
		}
	}()

	for firstErr == nil {
		if opts.Rate > 0 {
			due := start.Add(time.Duration(float64(sent) / opts.Rate * float64(time.Second)))
			if wait := time.Until(due); wait > 0 {
				if pace == nil {
					pace = time.NewTimer(wait)
				} else {
					pace.Reset(wait)
				}
				if err := waitFor(ctx, pace.C, p, settle); err != nil {
					return Result{Produced: produced, Elapsed: time.Since(start)}, err
				}
			}
		}
		m, ok, err := g.Next()
		if err != nil {
			firstErr = err
			break
		}
		if !ok {
			break
		}
		pm := &sarama.ProducerMessage{Topic: opts.Topic, Key: sarama.ByteEncoder(m.Key)}
		if m.Value != nil {
			pm.Value = sarama.ByteEncoder(m.Value)
		}
		if opts.Tracer != nil {
			startSpan(ctx, opts.Tracer, pm, m)
		}
		for queued := false; !queued; {
			select {
			case p.Input() <- pm:
				queued = true
				sent++
			case ack := <-p.Successes():
				settle(ack, nil)
			case perr := <-p.Errors():
				settle(perr.Msg, perr)
			case <-ctx.Done():
				return Result{Produced: produced, Elapsed: time.Since(start)}, ctx.Err()
			}
		}
	}
	for settled < sent {
		select {
		case ack := <-p.Successes():
			settle(ack, nil)
		case perr := <-p.Errors():
			settle(perr.Msg, perr)
		case <-ctx.Done():
			return Result{Produced: produced, Elapsed: time.Since(start)}, ctx.Err()
		}
	}
	res := Result{Produced: produced, Elapsed: time.Since(start)}
	if firstErr != nil {
		return res, fmt.Errorf("publish to %s: %w", opts.Topic, firstErr)
	}
	return res, nil
}

// waitFor waits for due while settling acknowledgements, so that a slow
// rate never leaves the producer blocked on an unread success.
func waitFor(ctx context.Context, due <-chan time.Time, p sarama.AsyncProducer, settle func(*sarama.ProducerMessage, error)) error {
	for {
		select {
		case <-due:
			return nil
		case ack := <-p.Successes():
			settle(ack, nil)
		case perr := <-p.Errors():
			settle(perr.Msg, perr)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// startSpan starts pm's producer span and injects its context into pm's
// headers; the span ends when the broker answers (endSpan).
func startSpan(ctx context.Context, tracer trace.Tracer, pm *sarama.ProducerMessage, m Message) {
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemKafka,
		semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationName("send"),
		semconv.MessagingDestinationName(pm.Topic),
		semconv.MessagingKafkaMessageKey(string(m.Key)),
	}
	if m.EventID != "" {
		attrs = append(attrs, semconv.MessagingMessageID(m.EventID))
	}
	ctx, span := tracer.Start(ctx, pm.Topic+" publish", trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	tracing.Propagator().Inject(ctx, kafka.ProducerHeaders{Msg: pm})
	pm.Metadata = span
}

func endSpan(pm *sarama.ProducerMessage, err error) {
	if pm == nil {
		return
	}
	span, ok := pm.Metadata.(trace.Span)
	if !ok {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "not acknowledged")
	}
	span.End()
}
