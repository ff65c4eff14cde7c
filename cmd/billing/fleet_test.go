package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/order"
	"example.com/billing/internal/testenv/wait"
)

// arrivals notes when each charge request reached the provider.
type arrivals struct {
	mu sync.Mutex
	at []time.Time
}

func (a *arrivals) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			a.mu.Lock()
			a.at = append(a.at, time.Now())
			a.mu.Unlock()
		}
		next.ServeHTTP(w, r)
	})
}

// between counts the arrivals in [from, to) and returns the last of them.
func (a *arrivals) between(from, to time.Time) (n int, last time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, t := range a.at {
		if !t.Before(from) && t.Before(to) {
			n, last = n+1, t
		}
	}
	return n, last
}

func (a *arrivals) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.at)
}

// generation is the group's generation a serve's session is in.
func (s *service) generation(t *testing.T) float64 {
	t.Helper()
	return s.metric(t, "billing_consumer_group_generation")
}

// owned is how many partitions a serve's session holds.
func (s *service) owned(t *testing.T) float64 {
	t.Helper()
	return s.metric(t, `billing_partitions_rebalanced_total{change="assigned"}`) - s.metric(t, `billing_partitions_rebalanced_total{change="revoked"}`)
}

// billingCmd runs a billing command in-process and returns its standard
// output.
func billingCmd(env map[string]string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), append([]string{"billing"}, args...), env, nil, &stdout, &stderr)
	if err != nil {
		return stdout.String(), fmt.Errorf("billing %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// publishStream publishes n events of orders first.. at rate per second,
// round robin over partitions, and returns when they are all acknowledged.
func publishStream(client sarama.Client, topic string, partitions int32, first, n int64, rate float64) error {
	p, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		return err
	}
	defer p.Close()
	every := time.Duration(float64(time.Second) / rate)
	next := time.Now()
	for i := range n {
		orderID := first + i
		ev, err := order.New(orderID, 1000+orderID, order.Money{Minor: 1234, Currency: "EUR"}, time.Now().UTC())
		if err != nil {
			return err
		}
		value, err := ev.MarshalJSON()
		if err != nil {
			return err
		}
		msg := &sarama.ProducerMessage{Topic: topic, Partition: int32(orderID % int64(partitions)), Key: sarama.StringEncoder(strconv.FormatInt(orderID, 10)), Value: sarama.ByteEncoder(value)}
		if _, _, err := p.SendMessage(msg); err != nil {
			return fmt.Errorf("publish order %d: %w", orderID, err)
		}
		next = next.Add(every)
		time.Sleep(time.Until(next))
	}
	return nil
}

// Mid-stream, billing pause stops every replica's requests within 5 s
// (none from then until billing resume), without a rebalance: the group's
// generation stays, /readyz stays 200, billing_charging_paused is 1. A
// replica started while paused sends nothing either. After billing
// resume every event is charged, once. The replicas share a budget of 100
// requests a second meanwhile.
func TestServe_PauseAndResume(t *testing.T) {
	const partitions, events = 4, 600
	h := newHarness(t, partitions)
	h.psp.SetOptions(fakepsp.Options{Seed: 1, Latency: 20 * time.Millisecond})
	var arrived arrivals
	psp := httptest.NewServer(arrived.wrap(h.psp))
	t.Cleanup(psp.Close)
	env := func() map[string]string {
		return h.environ("PAYMENT_BASE_URL", psp.URL, "PAYMENT_ACCOUNT_MAX_RPS", "100", "LOG_LEVEL", "info")
	}
	a, b := h.serve(env()), h.serve(env())
	commands := map[string]string{"DATABASE_URL": h.dsn, "KAFKA_GROUP_ID": h.broker.Group}

	// The pause is the subject, not the start: the stream begins once the
	// group settled (a loaded machine can take seconds for the rebalance
	// that B's join starts), and the pause once charges flow.
	wait.For(t, 30*time.Second, "the group settled: both replicas in one generation, each owning partitions", func() bool {
		return a.generation(t) > 0 && a.generation(t) == b.generation(t) && a.owned(t) > 0 && b.owned(t) > 0 && a.owned(t)+b.owned(t) == partitions
	})
	published := make(chan error, 1)
	go func() { published <- publishStream(h.client, h.broker.Topic, partitions, 1, events, 50) }()
	wait.For(t, 15*time.Second, "the stream's first charge at the provider", func() bool { return arrived.count() > 0 })
	time.Sleep(time.Second)

	paused := time.Now()
	out, err := billingCmd(commands, "pause", "--reason", "test: the provider double-charges", "--by", "tester")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("billing pause printed:\n%s", out)
	if !strings.Contains(out, "paused since") || !strings.Contains(out, "2 of 2 live replicas apply it") {
		t.Errorf("billing pause printed %q, want the state and 2 of 2 replicas", out)
	}
	// Read every second: wait for the generation of the last rebalance.
	wait.For(t, 10*time.Second, "both replicas in the same generation", func() bool {
		return a.generation(t) > 0 && a.generation(t) == b.generation(t)
	})
	before := a.generation(t)
	revoked := a.metric(t, `billing_partitions_rebalanced_total{change="revoked"}`) + b.metric(t, `billing_partitions_rebalanced_total{change="revoked"}`)

	time.Sleep(time.Until(paused.Add(5 * time.Second)))
	quiet := time.Now()
	for _, s := range []*service{a, b} {
		if code, body := get(s.addr, "/readyz"); code != http.StatusOK {
			t.Errorf("%s /readyz = %d while paused, want 200: %s", s.addr, code, body)
		}
		if got := s.metric(t, "billing_charging_paused"); got != 1 {
			t.Errorf("%s billing_charging_paused = %v, want 1", s.addr, got)
		}
	}
	// The stream goes on meanwhile: the events wait.
	time.Sleep(4 * time.Second)
	if n, _ := arrived.between(quiet, time.Now()); n != 0 {
		t.Errorf("%d requests reached the provider from 5 s after the pause on", n)
	}
	after := a.generation(t)
	if after != before || b.generation(t) != before {
		t.Errorf("the group's generation changed while paused: A %v, B %v, was %v", after, b.generation(t), before)
	}
	if got := a.metric(t, `billing_partitions_rebalanced_total{change="revoked"}`) + b.metric(t, `billing_partitions_rebalanced_total{change="revoked"}`); got != revoked {
		t.Errorf("partitions revoked while paused: %v, were %v", got, revoked)
	}

	// A replica that starts while paused starts paused: it joins (that
	// rebalance is its own) and sends nothing.
	c := h.serve(env())
	if got := c.metric(t, "billing_charging_paused"); got != 1 {
		t.Errorf("the replica started while paused: billing_charging_paused = %v, want 1", got)
	}
	time.Sleep(3 * time.Second)
	// A replica stopped while paused does not wait for the resume: its
	// charges waiting for it are given up (pending, for the partitions'
	// next owners) and it exits within its drain.
	stopping := time.Now()
	b.stop(t)
	stopTook := time.Since(stopping)
	if stopTook >= 5*time.Second {
		t.Errorf("a replica stopped while paused took %s to exit, its whole DRAIN_TIMEOUT of 5s", stopTook)
	}
	resumed := time.Now()
	if n, _ := arrived.between(quiet, resumed); n != 0 {
		t.Errorf("%d requests reached the provider after the third replica started, while paused", n)
	}
	pausedRequests, last := arrived.between(paused, resumed)
	if _, err := billingCmd(commands, "resume", "--reason", "test: the provider is fixed", "--by", "tester"); err != nil {
		t.Fatal(err)
	}
	if err := <-published; err != nil {
		t.Fatal(err)
	}

	h.waitCaughtUp()
	wait.For(t, 30*time.Second, "every event charged", func() bool {
		return h.count(`SELECT count(*) FROM charge WHERE status = 'succeeded'`) == events
	})
	st := h.psp.Stats()
	if st.ChargesCreated != events || st.OrdersChargedTwice != 0 {
		t.Errorf("provider: %d charges created, %d orders charged twice; want %d and 0", st.ChargesCreated, st.OrdersChargedTwice, events)
	}
	if n := h.count(`SELECT count(DISTINCT order_id) FROM charge WHERE status = 'succeeded'`); n != events {
		t.Errorf("%d orders charged, want %d", n, events)
	}
	for _, s := range []*service{a, c} {
		if got := s.metric(t, "billing_charging_paused"); got != 0 {
			t.Errorf("%s billing_charging_paused = %v after the resume, want 0", s.addr, got)
		}
		if got := s.metric(t, "billing_payment_account_budget"); got != 100 {
			t.Errorf("%s billing_payment_account_budget = %v, want 100", s.addr, got)
		}
	}
	lastAfter := time.Duration(0)
	if !last.IsZero() {
		lastAfter = last.Sub(paused)
	}
	t.Logf("pause: %d requests reached the provider after billing pause began, the last %s after it; 0 from 5 s after it until billing resume %s later; the group's generation %v at the pause, %v 9 s later (before a third replica joined); a replica stopped while paused exited in %s; busiest second %d requests",
		pausedRequests, lastAfter.Round(time.Millisecond), resumed.Sub(paused).Round(100*time.Millisecond), before, after, stopTook.Round(100*time.Millisecond), st.PeakPerSecond)
}
