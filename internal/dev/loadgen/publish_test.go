package loadgen_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"example.com/billing/internal/config"
	"example.com/billing/internal/dev/loadgen"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/testenv/kafkatest"
)

func newProducer(t *testing.T, addr string) sarama.AsyncProducer {
	t.Helper()
	k := config.Kafka{Brokers: []string{addr}, ClientID: "loadgen-test", Version: "3.6.0"}
	cfg, err := kafka.ProducerConfig(k)
	if err != nil {
		t.Fatal(err)
	}
	p, err := sarama.NewAsyncProducer(k.Brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func TestPublish_EveryMessageReachesTheTopicInOrder(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the embedded broker")
	}
	broker := kafkatest.Start(t, 3)
	g, err := loadgen.New(loadgen.Options{Count: 400, Duplicates: 0.2, Invalid: 0.05, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	// A second generator with the same seed gives the same keys in the
	// same order.
	ref, _ := loadgen.New(loadgen.Options{Count: 400, Duplicates: 0.2, Invalid: 0.05, Seed: 2})
	var acked atomic.Int64
	res, err := loadgen.Publish(t.Context(), newProducer(t, broker.Addr()), g,
		loadgen.PublishOptions{Topic: broker.Topic, Acked: &acked})
	if err != nil {
		t.Fatal(err)
	}
	if res.Produced != 400 || acked.Load() != 400 {
		t.Fatalf("Produced %d, Acked %d, want 400", res.Produced, acked.Load())
	}

	client := kafkatest.Client(t, broker.Addr())
	got := kafkatest.ReadAll(t, client, broker.Topic)
	if len(got) != 400 {
		t.Fatalf("topic holds %d messages, want 400", len(got))
	}
	// Per partition, offsets follow the generation order of its keys.
	byPartition := map[int32][][]byte{}
	for _, m := range got {
		byPartition[m.Partition] = append(byPartition[m.Partition], m.Key)
	}
	part := sarama.NewHashPartitioner(broker.Topic)
	pos := map[int32]int{}
	for {
		m, ok, err := ref.Next()
		if err != nil || !ok {
			break
		}
		p, err := part.Partition(&sarama.ProducerMessage{Key: sarama.ByteEncoder(m.Key)}, 3)
		if err != nil {
			t.Fatal(err)
		}
		keys := byPartition[p]
		if pos[p] >= len(keys) || !bytes.Equal(keys[pos[p]], m.Key) {
			t.Fatalf("partition %d message %d is not key %s", p, pos[p], m.Key)
		}
		pos[p]++
	}
}

func TestPublish_RateSpacesTheMessages(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the embedded broker")
	}
	broker := kafkatest.Start(t, 1)
	g, err := loadgen.New(loadgen.Options{Count: 21})
	if err != nil {
		t.Fatal(err)
	}
	res, err := loadgen.Publish(t.Context(), newProducer(t, broker.Addr()), g,
		loadgen.PublishOptions{Topic: broker.Topic, Rate: 100})
	if err != nil {
		t.Fatal(err)
	}
	// 21 messages at 100/s: the last one is due 200ms after the first.
	if res.Produced != 21 || res.Elapsed < 200*time.Millisecond {
		t.Errorf("published %d in %s, want 21 in at least 200ms", res.Produced, res.Elapsed)
	}
}

func TestPublish_StopsWhenTheContextEnds(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the embedded broker")
	}
	broker := kafkatest.Start(t, 1)
	g, err := loadgen.New(loadgen.Options{Count: 1000})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var acked atomic.Int64
	done := make(chan error, 1)
	go func() {
		_, err := loadgen.Publish(ctx, newProducer(t, broker.Addr()), g,
			loadgen.PublishOptions{Topic: broker.Topic, Rate: 50, Acked: &acked})
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for acked.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("no message acknowledged within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Publish returned %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Publish still running 5s after its context ended")
	}
	if g.Remaining() == 0 {
		t.Error("every message was generated although the context ended early")
	}
}

func TestPublish_TracedMessagesCarryTheirProducerSpan(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the embedded broker")
	}
	broker := kafkatest.Start(t, 1)
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	g, err := loadgen.New(loadgen.Options{Count: 20, Duplicates: 0.2, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := loadgen.Publish(t.Context(), newProducer(t, broker.Addr()), g,
		loadgen.PublishOptions{Topic: broker.Topic, Tracer: tp.Tracer("test")}); err != nil {
		t.Fatal(err)
	}
	spans := map[string]bool{}
	for _, s := range exporter.GetSpans() {
		if s.SpanKind != trace.SpanKindProducer || s.Name != broker.Topic+" publish" {
			t.Errorf("span %q of kind %v", s.Name, s.SpanKind)
		}
		spans[s.SpanContext.TraceID().String()+"-"+s.SpanContext.SpanID().String()] = true
	}
	got := kafkatest.ReadAll(t, kafkatest.Client(t, broker.Addr()), broker.Topic)
	if len(spans) != len(got) || len(got) != 20 {
		t.Fatalf("%d ended producer spans for %d messages, want 20 each", len(spans), len(got))
	}
	for _, m := range got {
		tp := strings.Split(kafkatest.Header(m, "traceparent"), "-") // version-trace-span-flags
		if len(tp) != 4 || !spans[tp[1]+"-"+tp[2]] {
			t.Errorf("message at offset %d has traceparent %q, not one of the producer spans", m.Offset, kafkatest.Header(m, "traceparent"))
		}
	}
}
