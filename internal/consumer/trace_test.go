package consumer_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"example.com/billing/internal/billing"
	"example.com/billing/internal/consumer"
	"example.com/billing/internal/dedup"
	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/dlq"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/order"
	"example.com/billing/internal/payment"
	"example.com/billing/internal/payment/contract"
	"example.com/billing/internal/testenv/dbtest"
	"example.com/billing/internal/testenv/kafkatest"
	"example.com/billing/internal/tracing"
)

// One event, produced inside a producer span, yields the span tree an
// operator follows at 3 a.m.: producer → consumer "process" (same trace) →
// the database transaction and the payment call, and the payment request
// carries the trace onward to the provider.
func TestTracing_OneEventYieldsTheSpanTreeOfItsProducer(t *testing.T) {
	b := kafkatest.Start(t, 1)
	client := kafkatest.Client(t, b.Addr())
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))

	// The provider records the traceparent it receives.
	var mu sync.Mutex
	var received []string
	psp := fakepsp.New(fakepsp.Options{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			mu.Lock()
			received = append(received, r.Header.Get("traceparent"))
			mu.Unlock()
		}
		psp.ServeHTTP(w, r)
	}))
	defer srv.Close()

	db, _ := dbtest.New(t)
	m := metrics.New(prometheus.NewRegistry())
	payer := payment.New(contract.New(srv.URL, ""), payment.Config{Timeout: 5 * time.Second, MaxConcurrency: 4, TracerProvider: tp}, m)
	defer payer.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	proc := billing.NewProcessor(db, dedup.NewStore(b.Group), payer,
		billing.Horizon{Retention: 7 * 24 * time.Hour, MaxFutureSkew: time.Hour, ProviderWindow: 24 * time.Hour}, m, tp, log)

	// Produce inside a producer span, as `billing produce` does.
	ev, err := order.New(4242, 7, order.Money{Minor: 1999, Currency: "EUR"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	value, err := ev.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	ctx, producerSpan := tp.Tracer("test").Start(context.Background(), "orders.confirmed publish", trace.WithSpanKind(trace.SpanKindProducer))
	pm := &sarama.ProducerMessage{Topic: b.Topic, Key: sarama.StringEncoder("4242"), Value: sarama.ByteEncoder(value)}
	tracing.Propagator().Inject(ctx, kafka.ProducerHeaders{Msg: pm})
	// An invalid message of the same trace: parked with its trace headers.
	bad := &sarama.ProducerMessage{Topic: b.Topic, Key: sarama.StringEncoder("x"), Value: sarama.StringEncoder("{")}
	tracing.Propagator().Inject(ctx, kafka.ProducerHeaders{Msg: bad})
	producerSpan.End()
	msgs := make([]kafkatest.Message, 0, 2)
	for _, p := range []*sarama.ProducerMessage{pm, bad} {
		v, _ := p.Value.Encode()
		k, _ := p.Key.Encode()
		msgs = append(msgs, kafkatest.Message{Key: k, Value: v, Headers: p.Headers})
	}
	kafkatest.Produce(t, client, b.Topic, msgs...)

	k := kafkaConfig(b, "")
	cfg, err := kafka.ConsumerConfig(k)
	if err != nil {
		t.Fatal(err)
	}
	cclient, err := sarama.NewClient(k.Brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cclient.Close()
	pcfg, _ := kafka.ProducerConfig(k)
	producer, err := sarama.NewSyncProducer(k.Brokers, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	opts := options()
	opts.Topic, opts.Group = b.Topic, b.Group
	c, err := consumer.NewConsumer(cclient, proc, dlq.NewWriter(producer, b.DLQTopic, b.Group, 0, m), opts, m, tp, log)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	writers := make(chan struct{})
	go func() { proc.Run(runCtx); close(writers) }()
	go func() { done <- c.Run(runCtx) }()
	kafkatest.WaitCaughtUp(t, client, b.Group, b.Topic, 30*time.Second)
	stop()
	<-done
	<-writers

	want := producerSpan.SpanContext()
	spans := map[string][]tracetest.SpanStub{}
	for _, s := range exporter.GetSpans() {
		spans[s.Name] = append(spans[s.Name], s)
	}
	process := spans[b.Topic+" process"]
	if len(process) != 2 {
		t.Fatalf("%d process spans, want 2 (one per message): %v", len(process), names(spans))
	}
	var charged tracetest.SpanStub
	for _, s := range process {
		if s.SpanContext.TraceID() != want.TraceID() || s.Parent.SpanID() != want.SpanID() {
			t.Errorf("process span %s is not a child of the producer span %s", s.SpanContext.SpanID(), want.SpanID())
		}
		if s.SpanKind != trace.SpanKindConsumer || len(s.Links) != 1 || s.Links[0].SpanContext.SpanID() != want.SpanID() {
			t.Errorf("process span: kind %v, links %v; want a consumer span linked to the producer", s.SpanKind, s.Links)
		}
		attrs := attrMap(s.Attributes)
		for key, val := range map[string]string{
			"messaging.system": "kafka", "messaging.destination.name": b.Topic,
			"messaging.destination.partition.id": "0", "messaging.consumer.group.name": b.Group,
			"messaging.operation.type": "process",
		} {
			if attrs[key] != val {
				t.Errorf("process span %s = %q, want %q", key, attrs[key], val)
			}
		}
		if attrs["messaging.message.id"] == ev.ID.String() {
			charged = s
		}
	}
	if !charged.SpanContext.IsValid() {
		t.Fatalf("no process span carries messaging.message.id = %s", ev.ID)
	}
	for _, name := range []string{"billing claim", "billing settle", "payment charge"} {
		if len(spans[name]) != 1 {
			t.Fatalf("%d %q spans, want 1: %v", len(spans[name]), name, names(spans))
		}
		s := spans[name][0]
		if s.Parent.SpanID() != charged.SpanContext.SpanID() || s.SpanContext.TraceID() != want.TraceID() {
			t.Errorf("%q is not a child of the event's process span", name)
		}
	}
	pay := spans["payment charge"][0]
	if len(received) != 1 || !strings.Contains(received[0], want.TraceID().String()) || !strings.Contains(received[0], pay.SpanContext.SpanID().String()) {
		t.Errorf("provider received traceparent %v, want trace %s from span %s", received, want.TraceID(), pay.SpanContext.SpanID())
	}

	parked := kafkatest.ReadAll(t, client, b.DLQTopic)
	if len(parked) != 1 || !strings.Contains(kafkatest.Header(parked[0], "traceparent"), want.TraceID().String()) {
		t.Errorf("the parked message lost its trace headers")
	}
}

func attrMap(kvs []attribute.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.String()
	}
	return m
}

func names(spans map[string][]tracetest.SpanStub) []string {
	var out []string
	for n, s := range spans {
		out = append(out, n+"×"+string(rune('0'+len(s))))
	}
	return out
}
