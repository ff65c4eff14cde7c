package main

import (
	"bytes"
	"context"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jmoiron/sqlx"

	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/order"
	"example.com/billing/internal/testenv/dbtest"
	"example.com/billing/internal/testenv/kafkatest"
	"example.com/billing/internal/testenv/wait"
)

// harness is the outside world of one `billing serve`: a real broker
// (embedded, over TCP), a real PostgreSQL database of the test's own, and a
// fake payment provider with idempotency and faults.
type harness struct {
	t      *testing.T
	broker *kafkatest.Broker
	client sarama.Client
	db     *sqlx.DB
	dsn    string
	psp    *fakepsp.Server
	pspURL string
}

func newHarness(t *testing.T, partitions int32, opts ...kafkatest.Option) *harness {
	t.Helper()
	h := &harness{t: t}
	h.broker = kafkatest.Start(t, partitions, opts...)
	h.client = kafkatest.Client(t, h.broker.Addr())
	h.db, h.dsn = dbtest.New(t)
	h.psp = fakepsp.New(fakepsp.Options{Seed: 1})
	srv := httptest.NewServer(h.psp)
	t.Cleanup(srv.Close)
	h.pspURL = srv.URL
	return h
}

// environ is serve's environment, with overrides applied.
func (h *harness) environ(overrides ...string) map[string]string {
	env := h.broker.Env()
	maps.Copy(env, map[string]string{
		"DATABASE_URL":     h.dsn,
		"PAYMENT_BASE_URL": h.pspURL,
		"PAYMENT_TIMEOUT":  "2s",
		"HTTP_ADDR":        freeAddr(h.t),
		"LOG_LEVEL":        "debug",
		"DRAIN_TIMEOUT":    "5s",
	})
	for i := 0; i+1 < len(overrides); i += 2 {
		env[overrides[i]] = overrides[i+1]
	}
	return env
}

// service is a running `billing serve`.
type service struct {
	addr   string
	cancel context.CancelFunc
	done   chan error
	logs   *syncBuffer

	stopOnce sync.Once
}

// serve starts `billing serve` in-process and waits for /readyz.
func (h *harness) serve(env map[string]string) *service {
	h.t.Helper()
	s := startServe(h.t, env)
	s.waitReady(h.t)
	return s
}

// startServe starts `billing serve` in-process and waits only for /healthz:
// for a service that is not expected to become ready. It is stopped when
// the test ends, and its logs shown if the test failed.
func startServe(t *testing.T, env map[string]string) *service {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &service{addr: env["HTTP_ADDR"], cancel: cancel, done: make(chan error, 1), logs: &syncBuffer{}}
	go func() { s.done <- run(ctx, []string{"billing", "serve"}, env, nil, io.Discard, s.logs) }()
	t.Cleanup(func() {
		s.stop(t)
		if t.Failed() {
			t.Logf("serve logs:\n%s", s.logs.String())
		}
	})
	wait.For(t, 20*time.Second, "/healthz", func() bool {
		select {
		case err := <-s.done:
			s.done <- err
			t.Fatalf("serve exited: %v\n%s", err, s.logs.String())
		default:
		}
		code, _ := get(s.addr, "/healthz")
		return code == http.StatusOK
	})
	return s
}

// waitLog waits until the logs contain substr.
func (s *service) waitLog(t *testing.T, substr string) {
	t.Helper()
	wait.For(t, 20*time.Second, "log "+substr, func() bool { return strings.Contains(s.logs.String(), substr) })
}

func (s *service) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-s.done:
			s.done <- err
			t.Fatalf("serve exited before ready: %v\n%s", err, s.logs.String())
		default:
		}
		if code, _ := get(s.addr, "/readyz"); code == http.StatusOK {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("serve not ready within 30s\n%s", s.logs.String())
}

// stop sends the equivalent of SIGTERM and waits for a clean exit; it may
// be called more than once.
func (s *service) stop(t *testing.T) {
	t.Helper()
	s.stopOnce.Do(func() {
		s.cancel()
		select {
		case err := <-s.done:
			if err != nil {
				t.Errorf("serve exited with %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("serve did not stop within 30s")
		}
	})
}

// metric returns the value of a counter or gauge series in /metrics, e.g.
// `billing_events_total{outcome="charged"}`, or a histogram's count; 0 when
// absent.
func (s *service) metric(t *testing.T, series string) float64 {
	t.Helper()
	snap := s.metrics(t)
	if h, ok := snap.Histograms[series]; ok {
		return h.Count
	}
	return snap.Values[series]
}

// metrics reads the whole of /metrics.
func (s *service) metrics(t *testing.T) metrics.Snapshot {
	t.Helper()
	snap, err := metrics.Scrape(t.Context(), "http://"+s.addr+"/metrics")
	if err != nil {
		t.Fatalf("read /metrics: %v", err)
	}
	return snap
}

// event builds a valid event of orderID for amount minor units of currency.
func event(t *testing.T, orderID int64, minor int64, currency string) (order.Event, []byte) {
	t.Helper()
	ev, err := order.New(orderID, 1000+orderID, order.Money{Minor: minor, Currency: currency}, time.Now().UTC())
	if err != nil {
		t.Fatal(err)
	}
	b, err := ev.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return ev, b
}

// publish writes value with the order id as key to partition.
func (h *harness) publish(partition int32, key string, value []byte) {
	h.t.Helper()
	kafkatest.Produce(h.t, h.client, h.broker.Topic, kafkatest.Message{Partition: partition, Key: []byte(key), Value: value})
}

// published is how many outcome events the outcome topic holds.
func (h *harness) published() int {
	h.t.Helper()
	n := 0
	for _, e := range kafkatest.EndOffsets(h.t, h.client, h.broker.OutcomeTopic) {
		n += int(e)
	}
	return n
}

func (h *harness) waitCaughtUp() {
	h.t.Helper()
	kafkatest.WaitCaughtUp(h.t, h.client, h.broker.Group, h.broker.Topic, 60*time.Second)
}

// count runs a count(*) query.
func (h *harness) count(query string, args ...any) int {
	h.t.Helper()
	var n int
	if err := h.db.Get(&n, query, args...); err != nil {
		h.t.Fatalf("%s: %v", query, err)
	}
	return n
}

func get(addr, path string) (int, string) {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// freeAddr returns a loopback address that is free now and that it never
// returned before in this test binary.
func freeAddr(t *testing.T) string {
	t.Helper()
	handedOut.mu.Lock()
	defer handedOut.mu.Unlock()
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		// The kernel may give a port it gave a moment ago once that
		// listener closed: two addresses of one serve (HTTP_ADDR and
		// DEBUG_PPROF_ADDR) were once the same.
		if !handedOut.addrs[addr] {
			handedOut.addrs[addr] = true
			return addr
		}
	}
}

// handedOut is every address freeAddr returned in this test binary.
var handedOut = struct {
	mu    sync.Mutex
	addrs map[string]bool
}{addrs: map[string]bool{}}

// syncBuffer collects logs written from many goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// postCharge posts one charge request and returns the status, 0 when the
// connection failed.
func postCharge(t *testing.T, base, apiKey string, orderID int, key string) int {
	t.Helper()
	body := `{"orderId":` + strconv.Itoa(orderID) + `,"customerId":7,"amount":1999,"currency":"EUR"}`
	req, err := http.NewRequest(http.MethodPost, base+"/v1/charges", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
