package postgres_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"example.com/billing/internal/testenv/dbtest"
	"example.com/billing/internal/testenv/nettest"
)

// A network that drops packets between billing and PostgreSQL (a
// partition; an address that stopped answering after a failover) must fail
// a query in seconds. Without TCP timeouts the query waits for the
// server's answer through 15 minutes of retransmissions, whatever its
// context says, and so does the claim, the readiness check or the shutdown
// waiting for it.
func TestOpen_AQueryOnADroppedNetworkFailsInSeconds(t *testing.T) {
	t.Parallel()
	proxy := nettest.Forward(t, serverAddr(t))
	db := dbtest.Open(t, withURL(t, func(u *url.URL) { u.Host = proxy.String() }), 1)
	if _, err := db.Exec(`SELECT 1`); err != nil {
		t.Fatal(err)
	}

	// The connection in the pool now neither answers nor fails.
	nettest.Cut(t, proxy.Port)

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

// serverAddr is the host:port of the test server.
func serverAddr(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(dbtest.ServerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}
