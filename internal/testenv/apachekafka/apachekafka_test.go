package apachekafka_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/testenv/apachekafka"
)

func TestPinnedVersion(t *testing.T) {
	pom := filepath.Join(t.TempDir(), "pom.xml")
	if err := os.WriteFile(pom, []byte("<properties>\n  <kafka.version> 4.4.0 </kafka.version>\n</properties>"), 0o600); err != nil {
		t.Fatal(err)
	}
	if v, err := apachekafka.PinnedVersion(pom); err != nil || v != "4.4.0" {
		t.Fatalf("PinnedVersion = %q, %v; want 4.4.0", v, err)
	}
	if err := os.WriteFile(pom, []byte("<properties/>"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := apachekafka.PinnedVersion(pom); err == nil {
		t.Fatal("a pom without <kafka.version> was accepted")
	}
}

// A node stopped with SIGTERM (a controlled shutdown, as an upgrade does)
// starts again from its own log dir with its topics and messages.
func TestNode_TerminateAndStartKeepsItsData(t *testing.T) {
	if err := apachekafka.Available(); err != nil && os.Getenv("CI") != "true" {
		t.Skip(err)
	}
	ctx := context.Background()
	started := time.Now()
	c := startOne(t)
	t.Logf("one node answering metadata with a group coordinator after %s", time.Since(started).Round(100*time.Millisecond))

	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_6_0_0
	cfg.Producer.Return.Successes = true
	admin, err := sarama.NewClusterAdmin(c.Addrs(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.CreateTopic("kept", &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false); err != nil {
		t.Fatal(err)
	}
	admin.Close()
	producer, err := sarama.NewSyncProducer(c.Addrs(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := producer.SendMessage(&sarama.ProducerMessage{Topic: "kept", Value: sarama.StringEncoder("v")}); err != nil {
		t.Fatal(err)
	}
	producer.Close()

	node := c.Nodes()[0]
	if err := node.Terminate(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if node.Running() {
		t.Fatal("node still running after Terminate")
	}
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitHealthy(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	client, err := sarama.NewClient(c.Addrs(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if end, err := client.GetOffset("kept", 0, sarama.OffsetNewest); err != nil || end != 1 {
		t.Fatalf("after the restart the topic's end offset is %d (%v), want 1", end, err)
	}
}

// Restore continues a paused node and starts a killed one, and the cluster
// is healthy again: what the chaos suite relies on between scenarios.
func TestCluster_RestoreResumesAndRestarts(t *testing.T) {
	if err := apachekafka.Available(); err != nil && os.Getenv("CI") != "true" {
		t.Skip(err)
	}
	ctx := context.Background()
	c := startOne(t)
	node := c.Nodes()[0]

	node.Pause()
	if !node.Paused() || !node.Running() {
		t.Fatalf("after Pause: Paused %v, Running %v; want both", node.Paused(), node.Running())
	}
	if err := c.WaitHealthy(ctx, 3*time.Second); err == nil {
		t.Fatal("a paused node was reported healthy")
	}
	restored, err := c.Restore(ctx, time.Minute)
	if err != nil || len(restored) != 1 || restored[0] != node.ID {
		t.Fatalf("Restore after Pause = %v, %v; want [%d]", restored, err, node.ID)
	}
	if node.Paused() {
		t.Fatal("still paused after Restore")
	}

	node.Kill()
	if node.Running() {
		t.Fatal("running after Kill")
	}
	restored, err = c.Restore(ctx, time.Minute)
	if err != nil || len(restored) != 1 || restored[0] != node.ID {
		t.Fatalf("Restore after Kill = %v, %v; want [%d]", restored, err, node.ID)
	}
	if restored, err := c.Restore(ctx, time.Minute); err != nil || len(restored) != 0 {
		t.Fatalf("Restore of a healthy cluster = %v, %v; want nothing to do", restored, err)
	}
}

// startOne starts a one-node cluster that is stopped when the test ends.
func startOne(t *testing.T) *apachekafka.Cluster {
	t.Helper()
	ctx := context.Background()
	jars, err := apachekafka.PinnedJars(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, err := apachekafka.Start(ctx, apachekafka.Options{Nodes: 1, Dir: t.TempDir(), Jars: jars})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.LogTail(40))
		}
		c.Close()
	})
	return c
}
