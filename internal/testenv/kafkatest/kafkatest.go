// Package kafkatest gives tests a real broker and helps them talk to it
// through sarama, the way billing does: produce events, read topics back,
// and compare a group's committed offsets with the partitions' end offsets.
//
// The broker is chosen by KAFKA_TEST_BROKER: a real Apache Kafka cluster
// that the tests start themselves (apache, the default where Java and Maven
// are installed), the embedded kfake broker (kfake), or a cluster someone
// else runs (host:port). See Start and Choose.
package kafkatest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/dev/embeddedkafka"
	"example.com/billing/internal/dlq"
	"example.com/billing/internal/kafka"
)

// The contract's default names; Start gives each test names of its own
// that begin with them.
const (
	Topic        = "orders.confirmed"
	DLQTopic     = "orders.confirmed.dlq"
	OutcomeTopic = "payments.settled"
	Group        = "billing-order-confirmed"
)

func config() *sarama.Config {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_6_0_0
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Idempotent = true
	cfg.Net.MaxOpenRequests = 1
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	// Tests read topics as billing does: committed records only.
	cfg.Consumer.IsolationLevel = sarama.ReadCommitted
	return cfg
}

// Client returns a sarama client of addrs (comma-separated, as
// KAFKA_BROKERS), closed when the test ends.
func Client(t testing.TB, addrs string) sarama.Client {
	t.Helper()
	c, err := sarama.NewClient(strings.Split(addrs, ","), config())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Message is a record to produce to an explicit partition.
type Message struct {
	Partition int32
	Key       []byte
	Value     []byte
	Headers   []sarama.RecordHeader
	// Timestamp is the record's create time; zero: when it is produced.
	Timestamp time.Time
}

// Produce writes msgs to topic, each to its own partition, and waits for
// the broker's acknowledgements.
func Produce(t testing.TB, client sarama.Client, topic string, msgs ...Message) {
	t.Helper()
	p, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	pms := make([]*sarama.ProducerMessage, len(msgs))
	for i, m := range msgs {
		pm := &sarama.ProducerMessage{Topic: topic, Partition: m.Partition, Headers: m.Headers, Timestamp: m.Timestamp}
		if m.Key != nil {
			pm.Key = sarama.ByteEncoder(m.Key)
		}
		if m.Value != nil {
			pm.Value = sarama.ByteEncoder(m.Value)
		}
		pms[i] = pm
	}
	if err := p.SendMessages(pms); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// Offsets maps partition to offset.
type Offsets map[int32]int64

// EndOffsets returns every partition's high-water mark.
func EndOffsets(t testing.TB, client sarama.Client, topic string) Offsets {
	t.Helper()
	end, err := kafka.EndOffsets(client, topic)
	if err != nil {
		t.Fatal(err)
	}
	return end
}

// Committed returns group's committed offset of every partition of topic,
// -1 where nothing is committed.
func Committed(t testing.TB, client sarama.Client, group, topic string) Offsets {
	t.Helper()
	committed, err := kafka.CommittedOffsets(t.Context(), client, group, topic)
	if err != nil {
		t.Fatal(err)
	}
	return committed
}

// WaitCaughtUp waits until group has committed every partition of topic up
// to its end, and fails the test after timeout.
func WaitCaughtUp(t testing.TB, client sarama.Client, group, topic string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		end := EndOffsets(t, client, topic)
		committed := Committed(t, client, group, topic)
		done := true
		for p, e := range end {
			if e > 0 && committed[p] != e {
				done = false
			}
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("group %s did not catch up on %s within %s: end %v, committed %v", group, topic, timeout, end, committed)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ReadAll reads every message of topic that exists now, from all partitions,
// and fails the test when it cannot within 30 seconds.
func ReadAll(t testing.TB, client sarama.Client, topic string) []*sarama.ConsumerMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msgs, err := embeddedkafka.ReadTopic(ctx, client, topic)
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

// Header returns the value of header key of m, or "".
func Header(m *sarama.ConsumerMessage, key string) string { return dlq.Header(m.Headers, key) }

// ResetOffsets commits offset for every partition of topic on behalf of
// group, as if the group's earlier commits had been lost. The group must
// have no active member.
func ResetOffsets(t testing.TB, client sarama.Client, group, topic string, offset int64) {
	t.Helper()
	om, err := sarama.NewOffsetManagerFromClient(group, client)
	if err != nil {
		t.Fatal(err)
	}
	parts, err := client.Partitions(topic)
	if err != nil {
		t.Fatal(err)
	}
	var poms []sarama.PartitionOffsetManager
	for _, p := range parts {
		pom, err := om.ManagePartition(topic, p)
		if err != nil {
			t.Fatal(err)
		}
		pom.ResetOffset(offset, "")
		poms = append(poms, pom)
	}
	om.Commit()
	for _, pom := range poms {
		if err := pom.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := om.Close(); err != nil {
		t.Fatal(err)
	}
	for p, o := range Committed(t, client, group, topic) {
		if o != offset {
			t.Fatalf("reset %s/%d to %d: committed is %d", topic, p, offset, o)
		}
	}
}
