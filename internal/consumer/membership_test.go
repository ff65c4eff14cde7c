package consumer_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"example.com/billing/internal/billing"
	"example.com/billing/internal/testenv/kafkatest"
	"example.com/billing/internal/testenv/nettest"
	"example.com/billing/internal/testenv/wait"
)

// A member cut off from the brokers but not from its database and provider
// (a network partition: a zombie) is evicted by the coordinator after the
// session timeout, while sarama, whose requests wait 30s each, still
// believes in its session. It must start no new work once the coordinator
// can no longer have confirmed it, say so (not ready, the heartbeat age),
// and after the heal rejoin and finish everything. Before, it went on
// through everything it had fetched.
func TestConsumer_AMemberCutOffFromTheBrokersStartsNoNewWork(t *testing.T) {
	nettest.PacketFilter(t)
	b := kafkatest.Start(t, 1)
	client := kafkatest.Client(t, b.Addr())
	const total = 300
	var msgs []kafkatest.Message
	for i := range total {
		msgs = append(msgs, kafkatest.Message{Key: []byte(strconv.Itoa(i)), Value: event("v" + strconv.Itoa(i))})
	}
	kafkatest.Produce(t, client, b.Topic, msgs...)

	// Slow work: what the member has taken off the partition at the cut
	// (about a hundred messages) lasts well past the session timeout.
	rec := newRecorder()
	rec.delay.Store(int64(time.Second))
	starts := &startLog{proc: rec}
	net := &forwardingDialer{t: t, to: map[string]*net.TCPAddr{}}
	const session = 6 * time.Second
	m := startMemberWith(t, b, starts, nil, options(), "", func(cfg *sarama.Config) {
		cfg.Net.Proxy.Enable, cfg.Net.Proxy.Dialer = true, net
		cfg.Consumer.Group.Session.Timeout = session
	})
	wait.For(t, 20*time.Second, "the member at work", func() bool { return m.consumer.Ready() && starts.count() >= 10 })

	cut := time.Now()
	heal := net.cut()
	time.Sleep(session + 7*time.Second) // long enough for two more rounds of batches
	// The lapse is declared within a second of the session timeout.
	bound := session + time.Second + 500*time.Millisecond
	if last := starts.last(); last.Sub(cut) > bound {
		t.Errorf("the cut-off member started work %s after the cut, want none after %s (session timeout + 1.5s)", last.Sub(cut).Round(10*time.Millisecond), bound)
	}
	if m.consumer.Ready() {
		t.Error("the cut-off member is ready")
	}
	if age := testutil.ToFloat64(m.metrics.HeartbeatAge); age < session.Seconds() {
		t.Errorf("billing_consumer_heartbeat_age_seconds = %v while cut off for %s", age, time.Since(cut).Round(time.Second))
	}
	t.Logf("last work started %s after the cut; heartbeat age %.1fs", starts.last().Sub(cut).Round(10*time.Millisecond), testutil.ToFloat64(m.metrics.HeartbeatAge))

	rec.delay.Store(0)
	heal()
	kafkatest.WaitCaughtUp(t, client, b.Group, b.Topic, 90*time.Second)
	wait.For(t, 20*time.Second, "the member ready again", m.consumer.Ready)
	for i := range total {
		if v := "v" + strconv.Itoa(i); rec.finishedCount(v) == 0 {
			t.Fatalf("message %s was never processed", v)
		}
	}
}

// startLog records when each call of proc started.
type startLog struct {
	proc   *recorder
	mu     sync.Mutex
	starts []time.Time
}

func (s *startLog) Handle(ctx context.Context, m billing.Message) (billing.Result, error) {
	s.mu.Lock()
	s.starts = append(s.starts, time.Now())
	s.mu.Unlock()
	return s.proc.Handle(ctx, m)
}

func (s *startLog) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.starts)
}

func (s *startLog) last() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.starts[len(s.starts)-1]
}

// forwardingDialer is sarama's proxy dialer for a client whose every
// connection goes through a forwarder of its own (nettest.Forward), so
// that the test can cut that client off the brokers, and only it.
type forwardingDialer struct {
	t  *testing.T
	mu sync.Mutex
	to map[string]*net.TCPAddr // broker address → its forwarder
}

func (d *forwardingDialer) Dial(network, addr string) (net.Conn, error) {
	d.mu.Lock()
	f, ok := d.to[addr]
	if !ok {
		f = nettest.Forward(d.t, addr)
		d.to[addr] = f
	}
	d.mu.Unlock()
	return net.DialTimeout(network, f.String(), 5*time.Second)
}

// cut drops every packet of the client's connections until heal.
func (d *forwardingDialer) cut() (heal func()) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var heals []func()
	for _, f := range d.to {
		heals = append(heals, nettest.Cut(d.t, f.Port))
	}
	if len(heals) == 0 {
		d.t.Fatal(fmt.Errorf("the client has no connection to cut"))
	}
	return func() {
		for _, h := range heals {
			h()
		}
	}
}
