//go:build linux

package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"example.com/billing/internal/testenv/dbtest"
)

// TestServe_BrokerThatDoesNotAnswer: with KAFKA_BROKERS pointing at a
// broker that never answers, serve says within 10 s which broker it waits
// for and for what, says it again later, and a SIGTERM still ends it within
// DRAIN_TIMEOUT + 5 s, with exit 0 and its last log line. (It used to log
// nothing about Kafka for 6 minutes, and to take 82 s to stop, past the
// pod's grace period, without its last line.)
//
// Linux only: the never-accepting broker relies on Linux dropping the
// connection attempts that a full accept queue cannot take.
func TestServe_BrokerThatDoesNotAnswer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		broker func(t *testing.T) string
	}{
		// A process that accepts connections and never answers: a hung
		// broker, or something else listening on the port.
		{"AcceptsAndNeverAnswers", acceptsAndNeverAnswers},
		// Connection attempts that are never answered, as behind a
		// firewall that drops packets: connect() hangs. (A closed port is
		// not that: it refuses at once, and serve says so at once.)
		{"NeverAccepts", neverAccepts},
	}
	const drain = 2 * time.Second
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			broker := tt.broker(t)
			_, dsn := dbtest.New(t)
			env := map[string]string{
				"KAFKA_BROKERS":    broker,
				"DATABASE_URL":     dsn,
				"PAYMENT_BASE_URL": "http://127.0.0.1:9", // never called
				"HTTP_ADDR":        freeAddr(t),
				"DRAIN_TIMEOUT":    drain.String(),
			}
			logs := &syncBuffer{}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			began := time.Now()
			go func() { done <- run(ctx, []string{"billing", "serve"}, env, nil, io.Discard, logs) }()

			waiting := func(l logLine) bool {
				return strings.HasPrefix(l.Msg, "waiting for Kafka") && slices.Contains(l.Brokers, broker) && l.WaitingFor != ""
			}
			first := waitLogLine(t, logs, done, 10*time.Second, waiting)
			t.Logf("after %s: %s", time.Since(began).Round(time.Millisecond), first.raw)
			// Said again, with backoff (5 s, then 10 s later): not once and
			// then silence.
			waitLogLines(t, logs, done, 30*time.Second, 2, waiting)

			cancel() // what SIGTERM does
			wantStopped(t, done, logs, drain)
		})
	}
}

// acceptsAndNeverAnswers returns the address of a listener that accepts
// every connection and never reads or writes.
func acceptsAndNeverAnswers(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
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
	return ln.Addr().String()
}

// neverAccepts returns the address of a listening socket whose accept queue
// is full and never drained: Linux drops every further connection attempt,
// so a client's connect hangs until its own timeout.
func neverAccepts(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	// net.Listen takes the system's backlog; 0 leaves room for one.
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	// Fill the queue until a connection attempt goes unanswered.
	for range 8 {
		c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return addr
			}
			t.Fatalf("fill the accept queue: %v", err)
		}
		t.Cleanup(func() { c.Close() })
	}
	t.Fatalf("%s still accepts after 8 connections; cannot make a listener that never accepts", addr)
	return ""
}

// logLine is a JSON log line of serve, with the attributes these tests
// read.
type logLine struct {
	Msg        string   `json:"msg"`
	Brokers    []string `json:"brokers"`
	WaitingFor string   `json:"waiting_for"`
	raw        string
}

func parseLogLines(t *testing.T, logs string) []logLine {
	t.Helper()
	var lines []logLine
	for raw := range strings.Lines(logs) {
		var l logLine
		if err := json.Unmarshal([]byte(raw), &l); err != nil {
			t.Fatalf("log line %q is not JSON: %v", raw, err)
		}
		l.raw = strings.TrimSpace(raw)
		lines = append(lines, l)
	}
	return lines
}

// waitLogLine waits until a line of logs satisfies match and returns it,
// failing when serve exits (done) or timeout passes first.
func waitLogLine(t *testing.T, logs *syncBuffer, done chan error, timeout time.Duration, match func(logLine) bool) logLine {
	t.Helper()
	return waitLogLines(t, logs, done, timeout, 1, match)[0]
}

// waitLogLines waits until n lines of logs satisfy match and returns them.
func waitLogLines(t *testing.T, logs *syncBuffer, done chan error, timeout time.Duration, n int, match func(logLine) bool) []logLine {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var found []logLine
		for _, l := range parseLogLines(t, logs.String()) {
			if match(l) {
				found = append(found, l)
			}
		}
		if len(found) >= n {
			return found
		}
		select {
		case err := <-done:
			t.Fatalf("serve exited (%v) before logging it\n%s", err, logs.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d matching log lines within %s, want %d\n%s", len(found), timeout, n, logs.String())
		}
	}
}
