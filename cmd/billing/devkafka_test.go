//go:build dev

package main

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/testenv/kafkatest"
)

var brokerAddrLine = regexp.MustCompile(`devkafka listening on (127\.0\.0\.1:\d+)`)

func TestDevkafka_DataDirKeepsTopicsMessagesAndOffsetsAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	args := []string{"devkafka", "--port", "0", "--partitions", "2", "--data-dir", dir}

	first := startCommand(t, nil, args...)
	addr := first.waitOutput(t, brokerAddrLine, 10*time.Second)
	client := kafkatest.Client(t, addr)
	kafkatest.Produce(t, client, kafkatest.Topic,
		kafkatest.Message{Partition: 0, Key: []byte("1"), Value: []byte("one")},
		kafkatest.Message{Partition: 0, Key: []byte("2"), Value: []byte("two")},
		kafkatest.Message{Partition: 1, Key: []byte("3"), Value: []byte("three")},
		kafkatest.Message{Partition: 1, Key: []byte("4"), Value: []byte("four")},
	)
	kafkatest.Produce(t, client, kafkatest.DLQTopic, kafkatest.Message{Partition: 1, Key: []byte("9"), Value: []byte("parked")})
	consumeAndCommit(t, addr, "persisted-group", kafkatest.Topic, 4)
	for p, o := range kafkatest.Committed(t, client, "persisted-group", kafkatest.Topic) {
		if o != 2 {
			t.Fatalf("before restart the committed offset of partition %d is %d, want 2", p, o)
		}
	}
	client.Close() // before the broker goes; closing again at cleanup is harmless
	if err := first.stop(t); err != nil {
		t.Fatalf("devkafka exited with %v", err)
	}

	second := startCommand(t, nil, args...)
	client = kafkatest.Client(t, second.waitOutput(t, brokerAddrLine, 10*time.Second))
	for _, topic := range []string{kafkatest.Topic, kafkatest.DLQTopic} {
		if parts, err := client.Partitions(topic); err != nil || len(parts) != 2 {
			t.Errorf("after restart %s has partitions %v (%v), want 2", topic, parts, err)
		}
	}
	var values []string
	for _, m := range kafkatest.ReadAll(t, client, kafkatest.Topic) {
		values = append(values, string(m.Key)+"="+string(m.Value))
	}
	slices.Sort(values)
	if want := []string{"1=one", "2=two", "3=three", "4=four"}; !slices.Equal(values, want) {
		t.Errorf("after restart the topic holds %v, want %v", values, want)
	}
	if dlq := kafkatest.ReadAll(t, client, kafkatest.DLQTopic); len(dlq) != 1 || string(dlq[0].Value) != "parked" {
		t.Errorf("after restart the dead-letter topic holds %d messages, want the parked one", len(dlq))
	}
	for p, o := range kafkatest.Committed(t, client, "persisted-group", kafkatest.Topic) {
		if o != 2 {
			t.Errorf("after restart the committed offset of partition %d is %d, want 2", p, o)
		}
	}
}

func TestDevkafka_InMemoryByDefaultWithTopicsFromTheEnvironment(t *testing.T) {
	env := map[string]string{"KAFKA_TOPIC": "shop.orders", "KAFKA_DLQ_TOPIC": "shop.orders.parked"}
	first := startCommand(t, env, "devkafka", "--port", "0", "--partitions", "3")
	out := first.stdout
	client := kafkatest.Client(t, first.waitOutput(t, brokerAddrLine, 10*time.Second))
	for _, topic := range []string{"shop.orders", "shop.orders.parked"} {
		if parts, err := client.Partitions(topic); err != nil || len(parts) != 3 {
			t.Errorf("%s has partitions %v (%v), want 3", topic, parts, err)
		}
	}
	if !strings.Contains(out.String(), "not Apache Kafka") || !strings.Contains(out.String(), "in memory") {
		t.Errorf("devkafka does not say it is an in-memory development broker:\n%s", out.String())
	}
	kafkatest.Produce(t, client, "shop.orders", kafkatest.Message{Partition: 0, Value: []byte("gone")})
	if err := first.stop(t); err != nil {
		t.Fatalf("devkafka exited with %v", err)
	}

	second := startCommand(t, env, "devkafka", "--port", "0")
	client = kafkatest.Client(t, second.waitOutput(t, brokerAddrLine, 10*time.Second))
	if got := kafkatest.ReadAll(t, client, "shop.orders"); len(got) != 0 {
		t.Errorf("without --data-dir a restart kept %d messages", len(got))
	}
}

func TestDevkafka_HelpAndBadFlags(t *testing.T) {
	var stdout syncBuffer
	if err := run(t.Context(), []string{"billing", "devkafka", "-h"}, nil, nil, &stdout, &stdout); err != nil {
		t.Fatalf("devkafka -h: %v", err)
	}
	for _, want := range []string{"not Apache Kafka", "in-memory", "-data-dir", "-partitions", "-port"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("help lacks %q:\n%s", want, stdout.String())
		}
	}
	for _, args := range [][]string{
		{"--port", "70000"},
		{"--partitions", "0"},
		{"--nope"},
		{"extra"},
	} {
		err := run(t.Context(), append([]string{"billing", "devkafka"}, args...), nil, nil, &syncBuffer{}, &syncBuffer{})
		if err == nil {
			t.Errorf("devkafka %v succeeded", args)
		}
	}
	err := run(t.Context(), []string{"billing", "devkafka"}, map[string]string{"KAFKA_TOPIC": "bad topic"}, nil, &syncBuffer{}, &syncBuffer{})
	if err == nil || !strings.Contains(err.Error(), "KAFKA_TOPIC") {
		t.Errorf("devkafka with a bad KAFKA_TOPIC returned %v, want an error naming it", err)
	}
}

// consumeAndCommit joins group, consumes n messages of topic, marks them
// and leaves, which commits the marked offsets.
func consumeAndCommit(t *testing.T, addr, group, topic string, n int) {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_6_0_0
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cg, err := sarama.NewConsumerGroup([]string{addr}, group, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	h := &markingHandler{done: cancel}
	h.left.Store(int64(n))
	for ctx.Err() == nil {
		if err := cg.Consume(ctx, []string{topic}, h); err != nil && ctx.Err() == nil {
			t.Fatal(err)
		}
	}
	if err := cg.Close(); err != nil {
		t.Fatal(err)
	}
	if h.left.Load() > 0 {
		t.Fatalf("consumed %d of %d messages within 30s", int64(n)-h.left.Load(), n)
	}
}

type markingHandler struct {
	left atomic.Int64
	done context.CancelFunc
}

func (h *markingHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *markingHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (h *markingHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for {
		select {
		case m, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			sess.MarkMessage(m, "")
			if h.left.Add(-1) == 0 {
				h.done()
			}
		case <-sess.Context().Done():
			return nil
		}
	}
}
