package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"
)

// membership knows whether the group coordinator still counts this process
// as a member of the group, and so whether the partitions it consumes are
// still its own.
//
// A process cut off from the brokers but not from PostgreSQL and the
// provider (a network partition: a zombie) is evicted by the coordinator
// after the session timeout, and its partitions go to other members, while
// sarama here still believes in the session: its heartbeat waits up to
// Net.ReadTimeout (30 s), several times, before it gives up. The consumer would
// meanwhile go on charging what was fetched. That cannot double-charge —
// every event is claimed in the database, which decides between the zombie
// and the new owner — but a zombie should stop acting on a belief it cannot
// check. So the consumer confirms its membership itself: a heartbeat of its
// own to the coordinator every confirmInterval, on a connection of its own
// with a short timeout. A heartbeat the coordinator answered as a member's
// (or with a rebalance in progress) confirms the membership from the
// moment it was sent: the coordinator cannot evict the member before that
// moment plus the session timeout. Past that, the membership has lapsed:
// no new message goes to billing, and billing sends no charge for the
// messages already handed out (the partitions' fence, partition.Holds: a
// charge waiting for a provider slot stays pending, for the partition's
// next owner to complete under the same key; one already sent is answered
// and settled), readiness says so, and an error is logged. A later
// confirmation resumes the work (the coordinator had only moved, say); an
// eviction ends the session through sarama as usual, and the abandoned
// work is not marked. A session that ends (a rebalance, a shutdown) is no
// lapse.
type membership struct {
	client  sarama.Client
	group   string
	timeout time.Duration // the session timeout
	// onLapse and onAgain are called, with the membership's lock held,
	// when it lapses and when it is confirmed again; onTick every
	// confirmInterval with the time since the last confirmation.
	onLapse, onAgain, onTick func(unconfirmed time.Duration)
	// onGeneration is called every confirmInterval, with the lock held,
	// with the generation of the session (which a cooperative rebalance
	// raises without a new session) while there is one.
	onGeneration func(generation int32)

	mu        sync.Mutex
	session   sarama.ConsumerGroupSession // nil between sessions
	confirmed time.Time                   // when the last confirmed heartbeat was sent (or the session began)
	lapsed    bool
	changed   chan struct{} // closed and replaced when lapsed changes
	conn      *sarama.Broker
}

// confirmInterval is how often the consumer confirms its membership.
const confirmInterval = time.Second

func newMembership(client sarama.Client, group string) *membership {
	m := &membership{
		client:    client,
		group:     group,
		timeout:   client.Config().Consumer.Group.Session.Timeout,
		confirmed: time.Now(),
		changed:   make(chan struct{}),
	}
	return m
}

// begin starts confirming sess, which sarama just set up: joining it is a
// confirmation.
func (m *membership) begin(sess sarama.ConsumerGroupSession) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.session = sess
	m.confirm(time.Now())
}

// end stops confirming: the session is over, and with it its work and its
// lapse.
func (m *membership) end() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.session = nil
	m.closeConn()
	if m.lapsed {
		m.lapsed = false
		close(m.changed)
		m.changed = make(chan struct{})
	}
}

// confirm records a confirmation sent at, and ends a lapse. m.mu is held.
func (m *membership) confirm(at time.Time) {
	if at.After(m.confirmed) {
		m.confirmed = at
	}
	if m.lapsed {
		m.lapsed = false
		close(m.changed)
		m.changed = make(chan struct{})
		if m.onAgain != nil {
			m.onAgain(time.Since(at))
		}
	}
}

// holds reports whether the membership is confirmed (not lapsed).
func (m *membership) holds() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return !m.lapsed
}

// changes returns a channel closed when the membership next lapses or is
// confirmed again.
func (m *membership) changes() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed
}

// run confirms the membership every confirmInterval until ctx ends, and
// declares it lapsed once nothing confirmed a session for the session
// timeout (within confirmInterval of it).
// One heartbeat is in flight at a time: over a cut network it waits for
// its read timeout while the lapse is declared on time.
func (m *membership) run(ctx context.Context) {
	tick := time.NewTicker(confirmInterval)
	defer tick.Stop()
	var beating sync.WaitGroup
	defer beating.Wait()
	inFlight := false
	answered := make(chan struct{}, 1)
	for {
		select {
		case <-ctx.Done():
			m.end()
			return
		case <-answered:
			inFlight = false
			continue // the next heartbeat goes at the next tick, not now
		case <-tick.C:
		}
		m.mu.Lock()
		sess := m.session
		if m.onTick != nil {
			m.onTick(time.Since(m.confirmed))
		}
		if sess != nil && m.onGeneration != nil {
			m.onGeneration(sess.GenerationID())
		}
		if sess != nil && !m.lapsed && time.Since(m.confirmed) > m.timeout {
			m.lapsed = true // no new charge is sent
			close(m.changed)
			m.changed = make(chan struct{})
			if m.onLapse != nil {
				m.onLapse(time.Since(m.confirmed))
			}
		}
		m.mu.Unlock()
		if sess == nil || inFlight {
			continue
		}
		inFlight = true
		beating.Go(func() {
			sent := time.Now()
			if err := m.beat(sess); err == nil {
				m.mu.Lock()
				if m.session == sess {
					m.confirm(sent)
				}
				m.mu.Unlock()
			}
			answered <- struct{}{}
		})
	}
}

// errNotConfirmed: the coordinator answered, but not as to a member (it
// moved, or the member was evicted or fenced).
var errNotConfirmed = errors.New("the coordinator did not confirm the membership")

// beat sends one heartbeat for sess to the group coordinator and returns
// nil when the coordinator counts the member.
func (m *membership) beat(sess sarama.ConsumerGroupSession) error {
	conn, err := m.connection()
	if err != nil {
		return err
	}
	cfg := m.client.Config()
	req := &sarama.HeartbeatRequest{GroupId: m.group, MemberId: sess.MemberID(), GenerationId: sess.GenerationID()}
	// The versions sarama's own heartbeat uses.
	switch {
	case cfg.Version.IsAtLeast(sarama.V2_4_0_0):
		req.Version = 4
	case cfg.Version.IsAtLeast(sarama.V2_3_0_0):
		req.Version = 3
	case cfg.Version.IsAtLeast(sarama.V2_0_0_0):
		req.Version = 2
	case cfg.Version.IsAtLeast(sarama.V0_11_0_0):
		req.Version = 1
	}
	if req.Version >= 3 && cfg.Consumer.Group.InstanceId != "" {
		id := cfg.Consumer.Group.InstanceId
		req.GroupInstanceId = &id
	}
	resp, err := conn.Heartbeat(req)
	if err != nil {
		m.dropConn(conn)
		return fmt.Errorf("heartbeat: %w", err)
	}
	switch resp.Err {
	case sarama.ErrNoError, sarama.ErrRebalanceInProgress:
		return nil
	case sarama.ErrNotCoordinatorForConsumer, sarama.ErrConsumerCoordinatorNotAvailable:
		m.dropConn(conn)
		_ = m.client.RefreshCoordinator(m.group)
	}
	return fmt.Errorf("%w: %w", errNotConfirmed, resp.Err)
}

// connection returns the connection to the coordinator, opening one. It
// is not sarama's own: a request there waits up to Net.ReadTimeout (30 s)
// and behind sarama's requests, and a confirmation that late is useless.
func (m *membership) connection() (*sarama.Broker, error) {
	m.mu.Lock()
	conn := m.conn
	m.mu.Unlock()
	if conn != nil {
		return conn, nil
	}
	coord, err := m.client.Coordinator(m.group)
	if err != nil {
		return nil, fmt.Errorf("find the group coordinator: %w", err)
	}
	cfg := *m.client.Config()
	cfg.Net.DialTimeout, cfg.Net.ReadTimeout, cfg.Net.WriteTimeout = m.timeout/4, m.timeout/4, m.timeout/4
	conn = sarama.NewBroker(coord.Addr())
	if err := conn.Open(&cfg); err != nil {
		return nil, fmt.Errorf("connect to the group coordinator: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.conn = conn // run sends one heartbeat at a time: nobody opened another
	return conn, nil
}

// dropConn closes conn, so that the next heartbeat finds the coordinator
// anew.
func (m *membership) dropConn(conn *sarama.Broker) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.conn == conn {
		m.closeConn()
	}
}

// closeConn closes the connection; m.mu is held.
func (m *membership) closeConn() {
	if m.conn != nil {
		_ = m.conn.Close()
		m.conn = nil
	}
}
