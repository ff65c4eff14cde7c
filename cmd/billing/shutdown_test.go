package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/testenv/kafkatest"
	"example.com/billing/internal/testenv/wait"
)

// TestServe_StopsWhileTheDatabaseDoesNotAnswer: SIGTERM ends serve within
// DRAIN_TIMEOUT + 5 s, with exit 0 and its last log line, even when a
// transaction is stuck on a database that stopped answering (a network
// partition: connections stay open, nothing comes back), which neither
// context cancellation nor the drain timeout can cut short.
func TestServe_StopsWhileTheDatabaseDoesNotAnswer(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1)
	db := newFreezingProxy(t, h.dsn)
	const drain = 2 * time.Second
	env := h.environ("DATABASE_URL", db.dsn, "DRAIN_TIMEOUT", drain.String())

	logs := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"billing", "serve"}, env, nil, io.Discard, logs) }()
	wait.For(t, 60*time.Second, "/readyz 200", func() bool {
		code, _ := get(env["HTTP_ADDR"], "/readyz")
		return code == http.StatusOK
	})

	db.freeze()
	_, value := event(t, 7, 1500, "EUR")
	h.publish(0, "7", value)
	wait.For(t, 30*time.Second, "the event's transaction waiting on the database", func() bool { return db.stalled.Load() > 0 })

	cancel() // what SIGTERM does
	wantStopped(t, done, logs, drain)
}

// freezingProxy forwards TCP connections to a PostgreSQL server until
// frozen; then it forwards nothing more either way and answers no new
// connection, keeping every connection open: a database that stopped
// answering.
type freezingProxy struct {
	dsn     string // the server's URL, through the proxy
	frozen  chan struct{}
	once    sync.Once
	stalled atomic.Int64 // reads from clients held back since the freeze
}

func newFreezingProxy(t *testing.T, dsn string) *freezingProxy {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	upstream := u.Host
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.Host = ln.Addr().String()
	p := &freezingProxy{dsn: u.String(), frozen: make(chan struct{})}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	keep := func(c net.Conn) {
		mu.Lock()
		defer mu.Unlock()
		conns = append(conns, c)
	}
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			keep(client)
			if p.isFrozen() {
				go p.pipe(nil, client, true) // nothing is forwarded: no upstream
				continue
			}
			server, err := net.Dial("tcp", upstream)
			if err != nil {
				client.Close()
				continue
			}
			keep(server)
			go p.pipe(server, client, true)
			go p.pipe(client, server, false)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return p
}

func (p *freezingProxy) freeze() { p.once.Do(func() { close(p.frozen) }) }

func (p *freezingProxy) isFrozen() bool {
	select {
	case <-p.frozen:
		return true
	default:
		return false
	}
}

// pipe copies src to dst until either closes, holding back whatever it
// reads once the proxy is frozen. fromClient counts what clients send then.
func (p *freezingProxy) pipe(dst, src net.Conn, fromClient bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if p.isFrozen() {
				if fromClient {
					p.stalled.Add(1)
				}
				continue // dropped: the other side waits forever
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// wantStopped fails t unless serve, told to stop (SIGTERM, or its context
// cancelled), exits 0 within DRAIN_TIMEOUT + 5 s with "billing stopped" as
// its last log line: what the pod's grace period and an operator rely on.
func wantStopped(t *testing.T, done <-chan error, logs *syncBuffer, drain time.Duration) {
	t.Helper()
	stopping := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve exited with %v after SIGTERM, want exit 0", err)
		}
		t.Logf("stopped %s after SIGTERM", time.Since(stopping).Round(time.Millisecond))
	case <-time.After(drain + 5*time.Second):
		t.Fatalf("serve did not stop within DRAIN_TIMEOUT + 5s of SIGTERM\n%s", logs.String())
	}
	lines := parseLogLines(t, logs.String())
	if last := lines[len(lines)-1]; last.Msg != "billing stopped" {
		t.Errorf("last log line %s, want billing stopped", last.raw)
	}
}

// TestServe_SIGTERMLetsTheChargesInFlightAnswer: SIGTERM while provider
// requests are in flight (a provider taking 1 s, DRAIN_TIMEOUT 5 s) stops
// taking new work but lets every request already sent answer: the stopping
// process settles each of them, announces its outcome and commits its
// offset before it leaves the group and exits 0, so that the provider sees
// one request per event and the next owner asks nothing again.
func TestServe_SIGTERMLetsTheChargesInFlightAnswer(t *testing.T) {
	h := newHarness(t, 2)
	h.psp.SetOptions(fakepsp.Options{Seed: 1, Latency: time.Second})
	env := h.environ("DRAIN_TIMEOUT", "5s")
	s := h.serve(env)

	const n = 40
	for i := range int64(n) {
		orderID := 500 + i
		_, value := event(t, orderID, 1000+i, "EUR")
		h.publish(int32(i%2), strconv.FormatInt(orderID, 10), value)
	}
	wait.For(t, 20*time.Second, "every event's request at the provider", func() bool {
		return h.count(`SELECT count(*) FROM charge WHERE status = 'pending'`) == n && h.psp.Stats().Requests == n
	})
	stopping := time.Now()
	s.stop(t) // SIGTERM, with every request in flight
	took := time.Since(stopping)

	if got := h.count(`SELECT count(*) FROM charge WHERE status = 'succeeded'`); got != n {
		t.Errorf("%d charges settled by the stopping process, want all %d", got, n)
	}
	if got := h.count(`SELECT count(*) FROM outbox`) + h.published(); got != n {
		t.Errorf("%d outcome events recorded (waiting in the outbox or published), want %d", got, n)
	}
	if st := h.psp.Stats(); st.Requests != n || st.Replays != 0 {
		t.Errorf("provider saw %d requests and %d replays, want %d and none", st.Requests, st.Replays, n)
	}
	end := kafkatest.EndOffsets(t, h.client, h.broker.Topic)
	committed := kafkatest.Committed(t, h.client, h.broker.Group, h.broker.Topic)
	for p, e := range end {
		if committed[p] != e {
			t.Errorf("partition %d: committed %d, end %d: the settled messages were not committed before the exit", p, committed[p], e)
		}
	}
	if took < 500*time.Millisecond || took > 5*time.Second {
		t.Errorf("serve stopped %s after SIGTERM, want after the answers (~1 s) and within DRAIN_TIMEOUT", took.Round(time.Millisecond))
	}
	t.Logf("stopped %s after SIGTERM with %d requests in flight", took.Round(time.Millisecond), n)
}
