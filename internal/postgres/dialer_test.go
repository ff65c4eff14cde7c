package postgres_test

import (
	"context"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"example.com/billing/internal/dbtest"
)

// A network that drops packets between billing and PostgreSQL (a
// partition; an address that stopped answering after a failover) must fail
// a query in seconds. Without TCP timeouts the query waits for the
// server's answer through 15 minutes of retransmissions, whatever its
// context says, and so does the lane, the readiness check or the shutdown
// waiting for it.
func TestOpen_AQueryOnADroppedNetworkFailsInSeconds(t *testing.T) {
	t.Parallel()
	iptables := needPacketFilter(t)
	proxy := forward(t, serverAddr(t))
	db := open(t, withURL(t, func(u *url.URL) { u.Host = proxy.String() }), 1)
	if _, err := db.Exec(`SELECT 1`); err != nil {
		t.Fatal(err)
	}

	// Drop every packet to and from the proxy's port: the connection in
	// the pool neither answers nor fails.
	port := strconv.Itoa(proxy.Port)
	rules := [][]string{
		{"INPUT", "-i", "lo", "-p", "tcp", "--dport", port, "-j", "DROP"},
		{"INPUT", "-i", "lo", "-p", "tcp", "--sport", port, "-j", "DROP"},
	}
	for _, r := range rules {
		if out, err := exec.Command(iptables, append([]string{"-I"}, r...)...).CombinedOutput(); err != nil {
			t.Fatalf("iptables -I %v: %v\n%s", r, err, out)
		}
		t.Cleanup(func() { _ = exec.Command(iptables, append([]string{"-D"}, r...)...).Run() })
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	started := time.Now()
	failed := make(chan error, 1)
	go func() { _, err := db.ExecContext(ctx, `SELECT 1`); failed <- err }()
	select {
	case err := <-failed:
		took := time.Since(started)
		if err == nil {
			t.Fatal("the query succeeded through a network that drops every packet")
		}
		if took > 25*time.Second {
			t.Errorf("the query failed after %s, want within the TCP user timeout (15s)", took.Round(time.Second))
		}
		t.Logf("the query failed after %s: %v", took.Round(100*time.Millisecond), err)
	case <-time.After(60 * time.Second):
		t.Fatal("the query still waits 60s after the network started dropping its packets (its context ended after 1s)")
	}
}

// needPacketFilter returns the path of iptables, or skips the test where
// it cannot drop packets (not root, no iptables); under CI=true, where
// .ci/run installs it and runs as root, it fails instead.
func needPacketFilter(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("iptables")
	why := ""
	switch {
	case os.Geteuid() != 0:
		why = "dropping packets needs root"
	case err != nil:
		why = "dropping packets needs iptables (apt-get install iptables)"
	}
	if why == "" {
		return path
	}
	if os.Getenv("CI") == "true" {
		t.Fatal(why)
	}
	t.Skip(why)
	return ""
}

// serverAddr is the host:port of the test server.
func serverAddr(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(dbtest.ServerURL())
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// forward relays TCP connections from a port on 127.0.0.1 to target until
// the test ends, and returns its address.
func forward(t *testing.T, target string) *net.TCPAddr {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(out, in); out.Close() })
			wg.Go(func() { _, _ = io.Copy(in, out); in.Close() })
		}
	})
	return ln.Addr().(*net.TCPAddr)
}
