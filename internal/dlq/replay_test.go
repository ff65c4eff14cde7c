package dlq_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"

	"example.com/billing/internal/config"
	"example.com/billing/internal/dlq"
	"example.com/billing/internal/dlq/reason"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/testenv/kafkatest"
)

// replayWorld is a broker with the order topic and its DLQ, and a client
// configured as `billing dlq replay` configures its own.
type replayWorld struct {
	t      *testing.T
	b      *kafkatest.Broker
	client sarama.Client // the tests' own: manual partitioner
	dlq    *dlq.Writer
}

func newReplayWorld(t *testing.T, partitions int32) *replayWorld {
	t.Helper()
	b := kafkatest.Start(t, partitions)
	w := &replayWorld{t: t, b: b, client: kafkatest.Client(t, b.Addr())}
	pcfg, err := kafka.ProducerConfig(w.kafka())
	if err != nil {
		t.Fatal(err)
	}
	producer, err := sarama.NewSyncProducer(b.Addrs, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	w.dlq = dlq.NewWriter(producer, b.DLQTopic, b.Group, 0, metrics.New(prometheus.NewRegistry()))
	t.Cleanup(func() { w.dlq.Close() })
	return w
}

// kafka is the configuration billing reads from KAFKA_*.
func (w *replayWorld) kafka() config.Kafka {
	return config.Kafka{Brokers: w.b.Addrs, Version: "3.6.0", ClientID: "replay-test"}
}

// parked is an original message and why it was parked.
type parked struct {
	msg    kafkatest.Message
	reason string
}

// park publishes the originals to the order topic, reads them back and parks
// each with its reason, as billing serve would. It returns the originals as
// read, in the order given.
func (w *replayWorld) park(ps ...parked) []*sarama.ConsumerMessage {
	w.t.Helper()
	before := kafkatest.EndOffsets(w.t, w.client, w.b.Topic)
	for _, p := range ps {
		kafkatest.Produce(w.t, w.client, w.b.Topic, p.msg)
	}
	var originals []*sarama.ConsumerMessage
	for _, m := range kafkatest.ReadAll(w.t, w.client, w.b.Topic) {
		if m.Offset >= before[m.Partition] {
			originals = append(originals, m)
		}
	}
	// ReadAll reads partition by partition: put them in the order given.
	var out []*sarama.ConsumerMessage
	for _, p := range ps {
		for _, m := range originals {
			if m.Partition == p.msg.Partition && bytes.Equal(m.Key, p.msg.Key) && !slices.Contains(out, m) {
				out = append(out, m)
				if _, err := w.dlq.Park(m, reason.Parse(p.reason)); err != nil {
					w.t.Fatal(err)
				}
				break
			}
		}
	}
	if len(out) != len(ps) {
		w.t.Fatalf("parked %d of %d", len(out), len(ps))
	}
	return out
}

func (w *replayWorld) run(opts dlq.ReplayOptions) (dlq.ReplayReport, []dlq.Replayed, error) {
	w.t.Helper()
	opts.DLQTopic, opts.Topic = w.b.DLQTopic, w.b.Topic
	if opts.Group == "" {
		opts.Group = w.b.Group + ".replay"
	}
	var listed []dlq.Replayed
	opts.OnMessage = func(r dlq.Replayed) { listed = append(listed, r) }
	rep, err := dlq.Replay(context.Background(), w.kafka(), opts, slog.New(slog.NewTextHandler(io.Discard, nil)))
	return rep, listed, err
}

// republishedSince returns the order topic's messages after before.
func (w *replayWorld) republishedSince(before kafkatest.Offsets) []*sarama.ConsumerMessage {
	w.t.Helper()
	var out []*sarama.ConsumerMessage
	for _, m := range kafkatest.ReadAll(w.t, w.client, w.b.Topic) {
		if m.Offset >= before[m.Partition] {
			out = append(out, m)
		}
	}
	return out
}

func headers(m *sarama.ConsumerMessage) []string {
	var out []string
	for _, h := range m.Headers {
		out = append(out, string(h.Key)+"="+string(h.Value))
	}
	return out
}

func msg(partition int32, key, value string, hdrs ...string) kafkatest.Message {
	m := kafkatest.Message{Partition: partition, Key: []byte(key)}
	if value != "" {
		m.Value = []byte(value)
	}
	for i := 0; i+1 < len(hdrs); i += 2 {
		m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(hdrs[i]), Value: []byte(hdrs[i+1])})
	}
	return m
}

const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestReplay_FiltersByReasonAndRepublishesUnchanged(t *testing.T) {
	w := newReplayWorld(t, 3)
	originals := w.park(
		parked{msg(0, "1", `{"n":1}`, "traceparent", traceparent, "x-custom", "a"), "provider-rejected: the Idempotency-Key was already used"},
		parked{msg(1, "2", `{"n":2}`), "invalid-event: currency: \"eur\" is not an ISO 4217 code"},
		parked{msg(2, "3", `{"n":3}`, "traceparent", traceparent), "provider-rejected: the Idempotency-Key was already used"},
		parked{msg(1, "4", ""), "invalid-event: no value (tombstone)"},
	)
	dlqEnd := kafkatest.EndOffsets(t, w.client, w.b.DLQTopic)
	topicEnd := kafkatest.EndOffsets(t, w.client, w.b.Topic)

	// A dry run lists, and publishes and commits nothing.
	rep, listed, err := w.run(dlq.ReplayOptions{Reason: "provider-rejected", DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Replayed != 2 || rep.Skipped != 2 || len(listed) != 2 {
		t.Fatalf("dry run: %+v, listed %d; want 2 replayed, 2 skipped", rep, len(listed))
	}
	for _, l := range listed {
		if l.Topic != w.b.Topic || !strings.HasPrefix(l.Reason, "provider-rejected: ") {
			t.Errorf("dry run listed %+v", l)
		}
	}
	if got := w.republishedSince(topicEnd); len(got) != 0 {
		t.Fatalf("dry run published %d messages", len(got))
	}
	for p, o := range kafkatest.Committed(t, w.client, w.b.Group+".replay", w.b.DLQTopic) {
		if o != -1 {
			t.Errorf("dry run committed %d on partition %d", o, p)
		}
	}

	// The real run republishes the provider-rejected ones to their
	// partitions, key, value and headers kept, the DLQ's headers dropped.
	rep, listed, err = w.run(dlq.ReplayOptions{Reason: "provider-rejected"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Replayed != 2 || rep.Skipped != 2 || rep.MaxReached || len(listed) != 2 {
		t.Fatalf("replay: %+v, listed %d; want 2 replayed, 2 skipped", rep, len(listed))
	}
	got := w.republishedSince(topicEnd)
	if len(got) != 2 {
		t.Fatalf("republished %d messages, want 2", len(got))
	}
	dlqMsgs := kafkatest.ReadAll(t, w.client, w.b.DLQTopic)
	for _, orig := range []*sarama.ConsumerMessage{originals[0], originals[2]} {
		var m *sarama.ConsumerMessage
		for _, g := range got {
			if bytes.Equal(g.Key, orig.Key) {
				m = g
			}
		}
		if m == nil {
			t.Fatalf("key %s not republished", orig.Key)
		}
		if m.Partition != orig.Partition || !bytes.Equal(m.Value, orig.Value) {
			t.Errorf("key %s: republished to %d with %q, want %d with %q", orig.Key, m.Partition, m.Value, orig.Partition, orig.Value)
		}
		var from string
		for _, d := range dlqMsgs {
			if bytes.Equal(d.Key, orig.Key) {
				from = fmt.Sprintf("%d/%d", d.Partition, d.Offset)
			}
		}
		want := append(headers(orig), dlq.HeaderReplayedFrom+"="+from)
		if !slices.Equal(headers(m), want) {
			t.Errorf("key %s: headers %v, want %v", orig.Key, headers(m), want)
		}
	}
	for p, o := range kafkatest.Committed(t, w.client, w.b.Group+".replay", w.b.DLQTopic) {
		if e := dlqEnd[p]; e > 0 && o != e {
			t.Errorf("partition %d committed %d, want the end %d", p, o, e)
		}
	}

	// A second run finds nothing left.
	end := kafkatest.EndOffsets(t, w.client, w.b.Topic)
	rep, _, err = w.run(dlq.ReplayOptions{Reason: "provider-rejected"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Replayed != 0 || len(w.republishedSince(end)) != 0 {
		t.Fatalf("second replay republished %d", rep.Replayed)
	}

	// Another group sees everything again; a tombstone stays a tombstone.
	rep, _, err = w.run(dlq.ReplayOptions{Group: "another"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Replayed != 4 || rep.Skipped != 0 {
		t.Fatalf("unfiltered replay: %+v, want 4 replayed", rep)
	}
	tombstones := 0
	for _, m := range w.republishedSince(end) {
		if m.Value == nil {
			tombstones++
		}
	}
	if tombstones != 1 {
		t.Errorf("republished %d tombstones, want 1", tombstones)
	}
}

func TestReplay_MaxAndResume(t *testing.T) {
	w := newReplayWorld(t, 1)
	var ps []parked
	for i := range 5 {
		ps = append(ps, parked{msg(0, fmt.Sprint(i), fmt.Sprintf(`{"n":%d}`, i)), "invalid-event: x"})
	}
	w.park(ps...)
	end := kafkatest.EndOffsets(t, w.client, w.b.Topic)

	rep, _, err := w.run(dlq.ReplayOptions{Max: 2, DryRun: true})
	if err != nil || rep.Replayed != 2 || !rep.MaxReached {
		t.Fatalf("dry run --max 2: %+v, %v", rep, err)
	}
	for _, want := range []struct {
		replayed int
		max      bool
	}{{2, true}, {2, true}, {1, false}, {0, false}} {
		rep, _, err := w.run(dlq.ReplayOptions{Max: 2})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Replayed != want.replayed || rep.MaxReached != want.max {
			t.Fatalf("replay --max 2: %+v, want %d replayed, max reached %v", rep, want.replayed, want.max)
		}
	}
	var keys []string
	for _, m := range w.republishedSince(end) {
		keys = append(keys, string(m.Key))
	}
	if want := []string{"0", "1", "2", "3", "4"}; !slices.Equal(keys, want) {
		t.Errorf("republished %v, want %v (each once, in order)", keys, want)
	}
}

func TestReplay_FailureIsResumedWithoutRepublishing(t *testing.T) {
	w := newReplayWorld(t, 1)
	w.park(parked{msg(0, "1", `{"n":1}`), "provider-rejected: x"})
	// A parked message whose origin no longer exists stops the run.
	kafkatest.Produce(t, w.client, w.b.DLQTopic, msg(0, "2", `{"n":2}`,
		dlq.HeaderReason, "provider-rejected: x", dlq.HeaderOriginalTopic, "gone"))
	end := kafkatest.EndOffsets(t, w.client, w.b.Topic)

	for range 2 {
		rep, _, err := w.run(dlq.ReplayOptions{})
		if err == nil || !strings.Contains(err.Error(), "gone") {
			t.Fatalf("err = %v, want the missing topic named", err)
		}
		_ = rep
	}
	if got := w.republishedSince(end); len(got) != 1 {
		t.Errorf("republished %d messages over two failed runs, want 1: the first, once", len(got))
	}
}

func TestReplay_ConcurrentRunsRepublishEachOnce(t *testing.T) {
	w := newReplayWorld(t, 4)
	var ps []parked
	for i := range 40 {
		ps = append(ps, parked{msg(int32(i%4), fmt.Sprint(i), fmt.Sprintf(`{"n":%d}`, i)), "invalid-event: x"})
	}
	w.park(ps...)
	end := kafkatest.EndOffsets(t, w.client, w.b.Topic)

	var wg sync.WaitGroup
	reps := make([]dlq.ReplayReport, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() { reps[i], _, errs[i] = w.run(dlq.ReplayOptions{}) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	got := w.republishedSince(end)
	seen := map[string]int{}
	for _, m := range got {
		seen[string(m.Key)]++
	}
	if len(seen) != 40 {
		t.Errorf("republished %d distinct messages, want 40", len(seen))
	}
	// A rebalance between the two may hand over a partition between an
	// acknowledgement and its commit: such a message is republished twice
	// (and deduplicated by billing). It must stay rare.
	if len(got) > 40+2 {
		t.Errorf("republished %d messages for 40 parked (runs: %+v, %+v)", len(got), reps[0], reps[1])
	}
}

func TestReasonParse(t *testing.T) {
	for in, want := range map[string]reason.Reason{
		"provider-rejected: key reused": {Code: reason.ProviderRejected, Detail: "key reused"},
		"invalid-event":                 {Code: reason.InvalidEvent},
		" stale-event : x: y":           {Code: reason.StaleEvent, Detail: "x: y"},
		"":                              {},
	} {
		if got := reason.Parse(in); got != want {
			t.Errorf("Parse(%q) = %+v, want %+v", in, got, want)
		}
	}
	if got := (reason.Reason{Code: reason.Oversize, Detail: "a: b"}).String(); got != "oversize: a: b" {
		t.Errorf("String() = %q", got)
	}
}
