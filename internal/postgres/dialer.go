package postgres

import (
	"context"
	"net"
	"strings"
	"syscall"
	"time"
)

// TCP settings of every connection to PostgreSQL. A query waits for the
// server's answer until the connection fails: cancelling its context only
// asks the server to cancel it, over a new connection. When the network
// drops packets instead of refusing them (a partition, a failed-over
// address that no longer answers), the operating system's defaults keep a
// connection with an unanswered request for 15 minutes of retransmissions,
// and an idle one for ever: a claim, a readiness check or a shutdown would
// wait that long. These bound it:
const (
	// tcpUserTimeout is how long data sent may stay unacknowledged before
	// the connection is closed (Linux's TCP_USER_TIMEOUT, which also ends
	// keepalive probing). A slow query is not affected: the server's
	// kernel acknowledges the request at once, however long it runs.
	tcpUserTimeout = 15 * time.Second
	// keepAlive probes an idle connection (one waiting for a long query's
	// answer included) after 5s of silence, every 5s.
	keepAliveIdle, keepAliveInterval, keepAliveCount = 5 * time.Second, 5 * time.Second, 3
	// dialTimeout bounds connecting when the URL sets no connect_timeout.
	dialTimeout = 10 * time.Second
)

// dialer is lib/pq's Dialer with those settings.
type dialer struct{ d net.Dialer }

func newDialer() dialer {
	return dialer{d: net.Dialer{
		Timeout: dialTimeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: keepAliveIdle, Interval: keepAliveInterval, Count: keepAliveCount,
		},
		Control: func(network, _ string, c syscall.RawConn) error {
			if !strings.HasPrefix(network, "tcp") {
				return nil // a Unix socket: nothing between us and the server
			}
			return setUserTimeout(c, tcpUserTimeout)
		},
	}}
}

func (d dialer) Dial(network, address string) (net.Conn, error) {
	return d.d.Dial(network, address)
}

func (d dialer) DialTimeout(network, address string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return d.d.DialContext(ctx, network, address)
}

func (d dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	return d.d.DialContext(ctx, network, address)
}
