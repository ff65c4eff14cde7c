//go:build chaos

package chaos_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/dev/embeddedkafka"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/testenv/apachekafka"
	"example.com/billing/internal/testenv/kafkatest"
)

// The brokers the suite runs on, chosen by CHAOS_BROKER.
const (
	// brokerApache is a three-node Apache Kafka cluster in KRaft mode (three
	// voters, replication factor 3, min.insync.replicas 2), started once for
	// the whole suite from the jars Maven resolves; each scenario gets
	// topics and a group of its own on it.
	brokerApache = "apache"
	// brokerKfake is the embedded kfake broker, in this process, a fresh
	// one per scenario, so that kfake's Fault API can fail requests.
	brokerKfake = "kfake"
)

// chooseBroker returns CHAOS_BROKER, else apache where Java and Maven are
// installed (and always under CI=true, so that CI fails rather than falls
// back), else kfake with a line that says so.
func chooseBroker() (string, error) {
	switch b := os.Getenv("CHAOS_BROKER"); b {
	case brokerApache, brokerKfake:
		return b, nil
	case "":
	default:
		return "", fmt.Errorf("CHAOS_BROKER=%q: want apache or kfake", b)
	}
	if os.Getenv("CI") == "true" {
		return brokerApache, nil
	}
	if err := apachekafka.Available(); err != nil {
		fmt.Printf("chaos: %v: running on the embedded kfake broker (CHAOS_BROKER=apache to insist)\n", err)
		return brokerKfake, nil
	}
	return brokerApache, nil
}

// startApache starts the suite's three-node cluster in dir.
func startApache(dir string) (*apachekafka.Cluster, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	jars, err := apachekafka.PinnedJars(ctx)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// Beside the plaintext listener every scenario uses, a SASL_SSL one
	// (and the others of apachekafka.Security) with the authorizer on, for
	// secured-cluster's least-privilege users: one cluster, not a second
	// one of three more JVMs. The plaintext principal, User:ANONYMOUS, is
	// a super user: the other scenarios, the suite's producer and checks
	// and the nodes themselves are unaffected (a test-only convenience; a
	// production cluster has no unauthenticated listener).
	return apachekafka.Start(ctx, apachekafka.Options{Nodes: 3, Dir: dir, Jars: jars,
		Security: &apachekafka.Security{CAFile: suite.pki.CAFile, CertFile: suite.pki.ServerCertFile, KeyFile: suite.pki.ServerKeyFile,
			Authorizer: true}})
}

// setUpKafka gives the run its broker, topics and group: on kfake a fresh
// embedded broker with the contract's names; on Apache Kafka, once the
// shared cluster is healthy again, topics and a group of the scenario's own.
func (r *run) setUpKafka() error {
	if suite.kafka == nil {
		b, err := embeddedkafka.Start(embeddedkafka.Options{Topics: []string{kafkatest.Topic, kafkatest.DLQTopic, kafkatest.OutcomeTopic}, Partitions: partitions})
		if err != nil {
			return err
		}
		r.t.Cleanup(b.Close)
		r.embedded = b
		r.brokers = b.Addr()
		r.topic, r.dlqTopic, r.outcomeTopic, r.group = kafkatest.Topic, kafkatest.DLQTopic, kafkatest.OutcomeTopic, kafkatest.Group
		r.client = kafkatest.Client(r.t, r.brokers)
		return r.openProbe()
	}

	// A scenario that failed half way may have left a broker down or
	// paused: bring it back and wait until every partition is fully
	// replicated, so that each scenario starts from a healthy cluster.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	restored, err := suite.kafka.Restore(ctx, 2*time.Minute)
	if len(restored) > 0 {
		r.t.Logf("Apache Kafka: restarted or continued node(s) %v left down by an earlier scenario", restored)
	}
	if err != nil {
		return fmt.Errorf("apache kafka not healthy before the scenario: %w\n%s", err, suite.kafka.LogTail(30))
	}
	r.brokers = strings.Join(suite.kafka.Addrs(), ",")
	suffix := r.sc.name + "." + randomHex(3)
	r.topic = kafkatest.Topic + ".chaos." + suffix
	r.dlqTopic = r.topic + ".dlq"
	r.outcomeTopic = kafkatest.OutcomeTopic + ".chaos." + suffix
	r.group = kafkatest.Group + ".chaos." + suffix
	r.client = kafkatest.Client(r.t, r.brokers)
	if err := r.openProbe(); err != nil {
		return err
	}
	admin, err := sarama.NewClusterAdminFromClient(r.client)
	if err != nil {
		return err
	}
	// Not closed: that would close the shared client.
	for _, name := range []string{r.topic, r.dlqTopic, r.outcomeTopic} {
		detail := &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 3,
			ConfigEntries: map[string]*string{"min.insync.replicas": new("2")}}
		if err := admin.CreateTopic(name, detail, false); err != nil {
			return fmt.Errorf("create topic %s: %w", name, err)
		}
	}
	r.t.Cleanup(func() {
		// Fewer partitions on the cluster keep the next scenarios'
		// failovers and health checks alike; a failed scenario's topics
		// stay, with the cluster's files, for a post-mortem.
		if r.t.Failed() {
			return
		}
		if err := admin.DeleteTopic(r.topic); err != nil {
			r.t.Logf("delete topic %s: %v", r.topic, err)
		}
		if err := admin.DeleteTopic(r.dlqTopic); err != nil {
			r.t.Logf("delete topic %s: %v", r.dlqTopic, err)
		}
		if err := admin.DeleteTopic(r.outcomeTopic); err != nil {
			r.t.Logf("delete topic %s: %v", r.outcomeTopic, err)
		}
	})
	if err := suite.kafka.WaitHealthy(ctx, time.Minute); err != nil {
		return fmt.Errorf("topics %s, %s not fully replicated: %w", r.topic, r.dlqTopic, err)
	}
	r.t.Logf("Apache Kafka: topics %s and %s (%d partitions, RF 3, min.insync.replicas 2), group %s", r.topic, r.dlqTopic, partitions, r.group)
	return nil
}

// openProbe opens r.probe, closed when the test ends.
func (r *run) openProbe() error {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_6_0_0
	cfg.ClientID = "chaos-probe"
	cfg.Net.DialTimeout = 2 * time.Second
	cfg.Net.ReadTimeout = 3 * time.Second
	cfg.Net.WriteTimeout = 3 * time.Second
	cfg.Metadata.Retry.Max = 1
	cfg.Metadata.Retry.Backoff = 100 * time.Millisecond
	c, err := sarama.NewClient(strings.Split(r.brokers, ","), cfg)
	if err != nil {
		return fmt.Errorf("probe client: %w", err)
	}
	r.probe = c
	r.t.Cleanup(func() { c.Close() })
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// --- Apache Kafka's faults ---

// node returns the cluster's node with broker id id.
func (r *run) node(id int32) (*apachekafka.Node, error) {
	n := suite.kafka.Node(id)
	if n == nil {
		return nil, fmt.Errorf("no node with broker id %d", id)
	}
	return n, nil
}

// busiestLeader returns the partition of the order topic that holds the
// most messages now, and the broker that leads it.
func (r *run) busiestLeader() (int32, int32, error) {
	end, err := kafka.EndOffsets(r.probe, r.topic)
	if err != nil {
		return 0, 0, err
	}
	busiest := int32(-1)
	for p, e := range end {
		if busiest < 0 || e > end[busiest] || (e == end[busiest] && p < busiest) {
			busiest = p
		}
	}
	leader, err := r.probe.Leader(r.topic, busiest)
	if err != nil {
		return 0, 0, fmt.Errorf("leader of %s/%d: %w", r.topic, busiest, err)
	}
	return busiest, leader.ID(), nil
}

// coordinator returns the broker id of the group's coordinator, asked
// afresh.
func (r *run) coordinator() (int32, error) {
	if err := r.probe.RefreshCoordinator(r.group); err != nil {
		return 0, fmt.Errorf("find the coordinator of %s: %w", r.group, err)
	}
	b, err := r.probe.Coordinator(r.group)
	if err != nil {
		return 0, fmt.Errorf("find the coordinator of %s: %w", r.group, err)
	}
	return b.ID(), nil
}

// killBroker kills node id with SIGKILL, as a crash does, waits down
// (meanwhile logging when moved reports that the cluster moved the
// killed node's role elsewhere), and starts it again from its own log dir.
func (r *run) killBroker(kind string, id int32, role string, down time.Duration, moved func() (bool, string)) {
	n, err := r.node(id)
	if err != nil {
		r.t.Errorf("%s: %v", kind, err)
		return
	}
	r.fault(kind, "broker %d (%s, pid %d) killed with SIGKILL; restart in %s", id, role, n.Pid(), down.Round(100*time.Millisecond))
	killed := time.Now()
	n.Kill()
	watched := r.watchMove(kind, killed, down, moved)
	time.Sleep(time.Until(killed.Add(down)))
	r.restartBroker(kind, n)
	<-watched
}

// pauseBroker stops node id with SIGSTOP for hold, as a long GC pause or a
// frozen VM does (it keeps its connections open and answers nothing), then
// continues it with SIGCONT.
func (r *run) pauseBroker(id int32, role string, hold time.Duration, moved func() (bool, string)) {
	n, err := r.node(id)
	if err != nil {
		r.t.Errorf("broker-pause: %v", err)
		return
	}
	r.fault("broker-pause", "broker %d (%s, pid %d) stopped with SIGSTOP for %s", id, role, n.Pid(), hold.Round(100*time.Millisecond))
	paused := time.Now()
	n.Pause()
	watched := r.watchMove("broker-pause", paused, hold, moved)
	time.Sleep(time.Until(paused.Add(hold)))
	n.Resume()
	<-watched
	r.faultOver()
	r.t.Logf("[+%s] broker %d continued with SIGCONT after %s", r.elapsed(), id, time.Since(paused).Round(100*time.Millisecond))
}

// watchMove polls moved, in the background until since+within, and logs
// when the cluster has moved the failed broker's role (leadership, the group
// coordinator) to another broker: the failover kfake cannot show. A role
// that has not moved by then is logged, not failed: the broker may come
// back first. The returned channel is closed when the watch is over; a poll
// in progress at the deadline (at most the probe's timeouts) may outlast it
// a little.
func (r *run) watchMove(kind string, since time.Time, within time.Duration, moved func() (bool, string)) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		deadline := since.Add(within)
		for time.Now().Before(deadline) {
			if ok, what := moved(); ok {
				r.t.Logf("[+%s] %s: %s %s after the fault", r.elapsed(), kind, what, time.Since(since).Round(100*time.Millisecond))
				return
			}
			time.Sleep(250 * time.Millisecond)
		}
		r.t.Logf("[+%s] %s: the role had not moved within %s", r.elapsed(), kind, within.Round(100*time.Millisecond))
	}()
	return done
}

// leaderMoved reports whether partition p of the order topic has a leader
// other than from.
func (r *run) leaderMoved(p, from int32) func() (bool, string) {
	return func() (bool, string) {
		if err := r.probe.RefreshMetadata(r.topic); err != nil {
			return false, ""
		}
		l, err := r.probe.Leader(r.topic, p)
		if err != nil || l.ID() == from {
			return false, ""
		}
		return true, fmt.Sprintf("partition %d led by broker %d", p, l.ID())
	}
}

// coordinatorMoved reports whether the group's coordinator is a broker
// other than from.
func (r *run) coordinatorMoved(from int32) func() (bool, string) {
	return func() (bool, string) {
		id, err := r.coordinator()
		if err != nil || id == from {
			return false, ""
		}
		return true, fmt.Sprintf("group coordinator is broker %d", id)
	}
}

// restartBroker starts node n again and counts the fault as over.
func (r *run) restartBroker(kind string, n *apachekafka.Node) {
	if err := n.Start(); err != nil {
		r.t.Errorf("%s: restart broker %d: %v", kind, n.ID, err)
		return
	}
	r.faultOver()
	r.t.Logf("[+%s] %s: broker %d started again (pid %d)", r.elapsed(), kind, n.ID, n.Pid())
}

// terminateBroker stops node n with SIGTERM (a controlled shutdown: it
// hands its leaderships over before it exits), as a rolling upgrade does.
func (r *run) terminateBroker(n *apachekafka.Node) {
	r.fault("broker-sigterm", "broker %d (pid %d) stopped with SIGTERM", n.ID, n.Pid())
	sent := time.Now()
	if err := n.Terminate(2 * time.Minute); err != nil {
		r.t.Errorf("broker %d: %v\n%s", n.ID, err, n.LogTail(30))
		return
	}
	r.t.Logf("[+%s] broker %d finished its controlled shutdown in %s", r.elapsed(), n.ID, time.Since(sent).Round(100*time.Millisecond))
}

// waitReplicated waits until no partition is under-replicated, as an
// operator does between two brokers of a rolling restart.
func (r *run) waitReplicated(timeout time.Duration) error {
	started := time.Now()
	var last error
	for time.Since(started) < timeout {
		n, err := suite.kafka.UnderReplicated()
		if err == nil && n == 0 {
			r.t.Logf("[+%s] 0 under-replicated partitions (%s after the restart)", r.elapsed(), time.Since(started).Round(100*time.Millisecond))
			return nil
		}
		last = errors.Join(err, fmt.Errorf("%d partitions under-replicated", n))
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("still under-replicated after %s: %w", timeout, last)
}
