//go:build chaos

package chaos_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/kafka"
	"example.com/billing/internal/metrics"
)

// Helpers of the scenarios that break infrastructure between the parts
// (issue 22): network partitions, a lossy network, PostgreSQL failovers, a
// full disk.

// serve's settings the bounds of these scenarios derive from.
const (
	// sessionTimeout is serve's consumer group session timeout (sarama's
	// default, which billing keeps without KAFKA_INSTANCE_ID).
	sessionTimeout = 10 * time.Second
	// paymentTimeout is the PAYMENT_TIMEOUT the suite gives serve.
	paymentTimeout = 2 * time.Second
)

// brokerPorts returns the ports of the run's brokers (KAFKA_BROKERS).
func (r *run) brokerPorts() ([]int, error) {
	var ports []int
	for _, addr := range strings.Split(r.brokers, ",") {
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		n, err := strconv.Atoi(p)
		if err != nil {
			return nil, err
		}
		ports = append(ports, n)
	}
	return ports, nil
}

// inSlot returns the serve process running in slot, nil when none does.
func (r *run) inSlot(slot int) *consumer {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.consumers[slot]
}

// backlogOf returns the partitions of the order topic the group assigned to
// the member of client id clientID, as its coordinator says, and how many
// of their messages the group has not committed: the work that member
// holds or has still to fetch.
func (r *run) backlogOf(clientID string) ([]int32, int64, error) {
	// Not closed: that would close the shared probe client.
	admin, err := sarama.NewClusterAdminFromClient(r.probe)
	if err != nil {
		return nil, 0, err
	}
	groups, err := admin.DescribeConsumerGroups([]string{r.group})
	if err != nil || len(groups) == 0 {
		return nil, 0, fmt.Errorf("describe group %s: %v", r.group, err)
	}
	var owned []int32
	for _, m := range groups[0].Members {
		if m.ClientId != clientID {
			continue
		}
		a, err := m.GetMemberAssignment()
		if err != nil {
			return nil, 0, err
		}
		owned = append(owned, a.Topics[r.topic]...)
	}
	end, err := kafka.EndOffsets(r.probe, r.topic)
	if err != nil {
		return nil, 0, err
	}
	committed, err := committedOffsets(r.probe, r.group, r.topic)
	if err != nil {
		return nil, 0, err
	}
	var lag int64
	for _, p := range owned {
		lag += end[p] - max(committed[p], 0)
	}
	return owned, lag, nil
}

// committedOffsets reads the group's committed offsets, waiting up to
// 10 s for a coordinator that moves or loads them: the brokers move
// leaders back to their preferred replicas after an earlier scenario's
// broker faults.
func committedOffsets(client sarama.Client, group, topic string) (map[int32]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return kafka.CommittedOffsets(ctx, client, group, topic)
}

// committedTotal is the sum of the group's committed offsets (the
// messages it finished, counting from 0 in each partition).
func (r *run) committedTotal() (int64, error) {
	committed, err := committedOffsets(r.probe, r.group, r.topic)
	if err != nil {
		return 0, err
	}
	var n int64
	for p := range int32(partitions) {
		n += max(committed[p], 0)
	}
	return n, nil
}

// metricSum scrapes every running consumer's /metrics and sums the series
// of metric whose labels contain every one of labels (name="value").
func (r *run) metricSum(metric string, labels ...string) (float64, error) {
	var sum float64
	for _, c := range r.running() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		snap, err := metrics.Scrape(ctx, "http://"+c.addr+"/metrics")
		cancel()
		if err != nil {
			return 0, fmt.Errorf("%s: %w", c.name, err)
		}
		for series, v := range snap.Values {
			name, rest, _ := strings.Cut(series, "{")
			if name != metric {
				continue
			}
			all := true
			for _, l := range labels {
				all = all && strings.Contains(rest, l)
			}
			if all {
				sum += v
			}
		}
	}
	return sum, nil
}

// rebalance is one rebalance of the run's group, as its coordinator
// logged it.
type rebalance struct {
	at     time.Time
	reason string
}

// coordinatorLog matches Apache Kafka's group coordinator starting a
// rebalance: "[2026-12-04 17:14:36,292] INFO [GroupCoordinator ...]
// Preparing to rebalance group G in state S with old generation N
// (reason: ...)".
var coordinatorLog = regexp.MustCompile(`^\[([0-9-]+ [0-9:]+,[0-9]+)\] INFO .*Preparing to rebalance group (\S+) in state \S+ with old generation ([0-9]+) \(reason: (.*)\)\.? \(org\.apache\.kafka\.[A-Za-z.]+\)$`)

// rebalances returns the rebalances of the run's group that the brokers'
// group coordinators started in [from, to], in order. A member's own log
// cannot tell: with cooperative-sticky assignment, a rebalance that moves
// partitions to the members of a session does not start a new one.
func (r *run) rebalances(from, to time.Time) ([]rebalance, error) {
	if suite.kafka == nil {
		return nil, errors.New("the coordinator's log is Apache Kafka's")
	}
	var out []rebalance
	for _, n := range suite.kafka.Nodes() {
		f, err := os.Open(filepath.Join(n.Dir(), "server.log"))
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			m := coordinatorLog.FindStringSubmatch(sc.Text())
			if m == nil || m[2] != r.group {
				continue
			}
			// The JVM logs in the machine's time zone, as Go's Local.
			at, err := time.ParseInLocation("2006-01-02 15:04:05,000", m[1], time.Local)
			if err == nil && !at.Before(from) && !at.After(to) {
				out = append(out, rebalance{at: at, reason: fmt.Sprintf("generation %s→: %s", m[3], m[4])})
			}
		}
		f.Close()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out, nil
}

// logLine is one line of serve's JSON log, the fields the suite reads.
type logLine struct {
	Time  time.Time `json:"time"`
	Level string    `json:"level"`
	Msg   string    `json:"msg"`
}

// logLines returns the lines of every serve log of the run whose message
// is msg, by process name.
func (r *run) logLines(msg string) map[string][]logLine {
	r.mu.Lock()
	all := append([]*consumer(nil), r.all...)
	r.mu.Unlock()
	out := map[string][]logLine{}
	for _, c := range all {
		f, err := os.Open(c.logPath)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if !strings.Contains(sc.Text(), msg) {
				continue
			}
			var l logLine
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == msg {
				out[c.name] = append(out[c.name], l)
			}
		}
		f.Close()
	}
	return out
}

// probe is one /readyz answer: when it was asked, its status (0: no
// answer within httpClient's 5s), body and how long it took.
type probe struct {
	at   time.Time
	code int
	body string
	took time.Duration
}

func (p probe) String() string {
	return fmt.Sprintf("%d after %s %s", p.code, p.took.Round(10*time.Millisecond), strings.TrimSpace(p.body))
}

// watchReadyz asks c's /readyz every second until stop is closed and
// returns every answer.
func watchReadyz(c *consumer, stop <-chan struct{}) []probe {
	var out []probe
	for {
		p := probe{at: time.Now()}
		p.code, p.body = c.getBody("/readyz")
		p.took = time.Since(p.at)
		out = append(out, p)
		select {
		case <-stop:
			return out
		case <-time.After(time.Second - min(p.took, time.Second)):
		}
	}
}

// judgeReadyz fails the test for each answer of probes that is not want
// or took longer than slowest; what names the period for the message.
func (r *run) judgeReadyz(c *consumer, probes []probe, want int, slowest time.Duration, what string) {
	var wrong []string
	for _, p := range probes {
		if p.code != want || p.took > slowest {
			wrong = append(wrong, p.String())
		}
	}
	if len(wrong) > 0 {
		r.t.Errorf("%s /readyz %s: %d of %d answers not %d within %s (0: none within 5s), e.g. %s",
			c.name, what, len(wrong), len(probes), want, slowest, strings.Join(wrong[:min(3, len(wrong))], "; "))
	}
}

// waitReadyzBody waits until c's /readyz answers want with a body that
// contains one of words (case-insensitive), and returns how long that took
// and the last answer.
func waitReadyzBody(c *consumer, want int, within time.Duration, words ...string) (time.Duration, string, bool) {
	start := time.Now()
	var last string
	for time.Since(start) < within {
		code, body := c.getBody("/readyz")
		last = fmt.Sprintf("%d %s", code, strings.TrimSpace(body))
		if code == want {
			for _, w := range words {
				if strings.Contains(strings.ToLower(body), strings.ToLower(w)) {
					return time.Since(start), last, true
				}
			}
			if len(words) == 0 {
				return time.Since(start), last, true
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return time.Since(start), last, false
}

// sleepFor sleeps until d after t0.
func sleepFor(t0 time.Time, d time.Duration) {
	time.Sleep(time.Until(t0.Add(d)))
}
