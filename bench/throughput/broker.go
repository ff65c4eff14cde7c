package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/dev/embeddedkafka"
	"example.com/billing/internal/testenv/apachekafka"
)

// chooseBrokers reads -broker: unset, both brokers where Apache Kafka can
// run here, else kfake alone, said on stderr.
func chooseBrokers(flagValue string) ([]string, error) {
	switch flagValue {
	case "kfake", "apache":
		return []string{flagValue}, nil
	case "both":
		return []string{"kfake", "apache"}, nil
	case "":
	default:
		return nil, fmt.Errorf("-broker %q: want kfake, apache or both", flagValue)
	}
	if err := apachekafka.Available(); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v: the embedded kfake broker only (-broker apache to insist)\n", err)
		return []string{"kfake"}, nil
	}
	return []string{"kfake", "apache"}, nil
}

// broker is a Kafka the scenarios run on.
type broker struct {
	name    string // for the tables: kfake, or apache with its node count
	cluster *apachekafka.Cluster
	dir     string
	seq     int // scenarios run on it, for unique topic names
}

func startBroker(kind string, nodes int) (*broker, error) {
	if kind == "kfake" {
		return &broker{name: "kfake"}, nil
	}
	started := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	jars, err := apachekafka.PinnedJars(ctx)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "billing-bench-kafka-")
	if err != nil {
		return nil, err
	}
	c, err := apachekafka.Start(ctx, apachekafka.Options{Nodes: nodes, Dir: dir, Jars: jars})
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("apache kafka (-broker kfake runs without it): %w", err)
	}
	b := &broker{name: fmt.Sprintf("apache ×%d", nodes), cluster: c, dir: dir}
	fmt.Printf("Apache Kafka %d node(s), KRaft, on %s: started in %s\n", nodes, strings.Join(c.Addrs(), ","), time.Since(started).Round(100*time.Millisecond))
	// A JVM broker uses CPU while idle too (GC, the KRaft quorum's
	// heartbeats); over a slow scenario that is a good part of its CPU per
	// event, so say how much.
	time.Sleep(3 * time.Second)
	cpu0, err := b.cpu()
	if err != nil {
		b.close()
		return nil, err
	}
	const sample = 5 * time.Second
	time.Sleep(sample)
	cpu1, err := b.cpu()
	if err != nil {
		b.close()
		return nil, err
	}
	fmt.Printf("Apache Kafka idle: %d ms of CPU per second (all nodes)\n", ((cpu1 - cpu0) * time.Second / sample).Milliseconds())
	return b, nil
}

func (b *broker) close() {
	if b.cluster != nil {
		b.cluster.Close()
		os.RemoveAll(b.dir)
	}
}

// kafkaNames are one scenario's topic, dead-letter topic, outcome topic
// and group.
type kafkaNames struct{ topic, dlq, outcome, group string }

// prepare gives a scenario its topics on b: on kfake a fresh broker with
// the contract's names, on Apache Kafka fresh topics (deleted by the
// returned function) and a group on the running cluster. The outcome topic
// has outcomePartitions partitions, the others partitions.
func (b *broker) prepare(partitions, outcomePartitions int32) (addrs []string, n kafkaNames, cleanup func(), err error) {
	if b.cluster == nil {
		n = kafkaNames{topic: "orders.confirmed", dlq: "orders.confirmed.dlq", outcome: "payments.settled", group: "billing-order-confirmed"}
		dev, err := embeddedkafka.Start(embeddedkafka.Options{Topics: []string{n.topic, n.dlq}, Partitions: partitions})
		if err != nil {
			return nil, n, nil, err
		}
		if err := dev.CreateTopic(n.outcome, outcomePartitions, nil); err != nil {
			dev.Close()
			return nil, n, nil, err
		}
		return []string{dev.Addr()}, n, dev.Close, nil
	}
	b.seq++
	suffix := fmt.Sprintf("bench.%d.%d", os.Getpid(), b.seq)
	n = kafkaNames{topic: "orders.confirmed." + suffix, dlq: "orders.confirmed.dlq." + suffix, outcome: "payments.settled." + suffix,
		group: "billing-order-confirmed." + suffix}
	addrs = b.cluster.Addrs()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_6_0_0
	admin, err := sarama.NewClusterAdmin(addrs, cfg)
	if err != nil {
		return nil, n, nil, err
	}
	rf := int16(min(3, len(addrs)))
	for t, p := range map[string]int32{n.topic: partitions, n.dlq: partitions, n.outcome: outcomePartitions} {
		detail := &sarama.TopicDetail{NumPartitions: p, ReplicationFactor: rf}
		if err := admin.CreateTopic(t, detail, false); err != nil {
			admin.Close()
			return nil, n, nil, fmt.Errorf("create topic %s: %w", t, err)
		}
	}
	cleanup = func() {
		_ = admin.DeleteTopic(n.topic)
		_ = admin.DeleteTopic(n.dlq)
		_ = admin.DeleteTopic(n.outcome)
		admin.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := b.cluster.WaitHealthy(ctx, time.Minute); err != nil {
		cleanup()
		return nil, n, nil, err
	}
	return addrs, n, cleanup, nil
}

// cpu is the CPU time Apache Kafka's nodes have used so far, 0 on kfake.
func (b *broker) cpu() (time.Duration, error) {
	if b.cluster == nil {
		return 0, nil
	}
	var total time.Duration
	for _, n := range b.cluster.Nodes() {
		t, err := cpuTime(n.Pid())
		if err != nil {
			return 0, fmt.Errorf("node %d: %w", n.ID, err)
		}
		total += t
	}
	return total, nil
}
