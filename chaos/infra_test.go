//go:build chaos

package chaos_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

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

// committedTotal is the sum of the group's committed offsets (the
// messages it finished, counting from 0 in each partition).
func (r *run) committedTotal() (int64, error) {
	committed, err := kafka.CommittedOffsets(r.probe, r.group, r.topic)
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

// logLine is one line of serve's JSON log, the fields the suite reads.
type logLine struct {
	Time       time.Time `json:"time"`
	Level      string    `json:"level"`
	Msg        string    `json:"msg"`
	Generation int32     `json:"generation"`
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

// within returns the lines logged in [from, to].
func within(lines []logLine, from, to time.Time) []logLine {
	var out []logLine
	for _, l := range lines {
		if !l.Time.Before(from) && !l.Time.After(to) {
			out = append(out, l)
		}
	}
	return out
}

// watchReadyz polls c's /readyz every second until stop is closed and
// returns how many answers there were and which were not want, with the
// longest time an answer took (an unanswered probe takes httpClient's 5s
// and counts as status 0).
func watchReadyz(c *consumer, want int, stop <-chan struct{}) (answers int, wrong []string, slowest time.Duration) {
	for {
		sent := time.Now()
		code, body := c.getBody("/readyz")
		took := time.Since(sent)
		slowest = max(slowest, took)
		answers++
		if code != want {
			wrong = append(wrong, fmt.Sprintf("%d after %s %s", code, took.Round(10*time.Millisecond), strings.TrimSpace(body)))
		}
		select {
		case <-stop:
			return
		case <-time.After(time.Second - min(took, time.Second)):
		}
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
