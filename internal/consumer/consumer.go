// Package consumer is billing's consumer of the order topic: a member of
// the consumer group that takes each partition's messages to billing (the
// Processor, package billing), one key at a time, and commits a partition's
// offsets only up to the first message not yet finished (in production,
// once the database holds that position), so that a crash redelivers and
// never skips. It confirms its own membership with the group coordinator,
// so that a member cut off from the brokers starts no new work, and parks
// what cannot be processed through a Parker (package dlq). It reaches
// Kafka through sarama, with the configuration, offset reads and trace
// headers of package kafka.
package consumer

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/cenkalti/backoff/v5"
	"go.opentelemetry.io/otel/trace"

	"example.com/billing/internal/billing"
	"example.com/billing/internal/dlq/reason"
	"example.com/billing/internal/kafkaacl"
	"example.com/billing/internal/metrics"
)

// Processor takes a message's event through billing (billing.Processor):
// Handle returns what became of it, Pending (with why) when it must be
// retried; ctx ends when the message is given up (its partition drained).
type Processor interface {
	Handle(ctx context.Context, m billing.Message) (billing.Result, error)
}

// Parker parks a message in the dead-letter topic (package dlq): it
// returns once the broker acknowledged it, with the reason it was parked
// under. Close fails a Park in progress.
type Parker interface {
	Park(m *sarama.ConsumerMessage, why reason.Reason) (reason.Reason, error)
	Close() error
}

// Options tune a Consumer.
type Options struct {
	Topic string
	Group string
	// MaxInFlight bounds messages taken off partitions and not yet finished,
	// across all partitions of this instance: back-pressure on fetching.
	// Every key's oldest unfinished message is with billing at once; a
	// key's later ones wait behind it, holding their slots.
	MaxInFlight int
	// MaxInFlightBytes bounds the same messages in bytes of keys and
	// values; one message larger than it is still taken, alone. 0 means
	// no bound.
	MaxInFlightBytes int64
	// DrainTimeout bounds how long in-flight work may go on after a
	// partition is revoked or the consumer stops.
	DrainTimeout time.Duration
	// Commit is how finished messages are committed: SavePositions in
	// production, CommitEach for the seed design's benchmark; the zero
	// value marks them at once for sarama's commit (the consumer's tests).
	Commit Commit
	// ReplayWindow bounds how far back a partition is consumed again
	// after the database lost commits: the provider's idempotency window.
	ReplayWindow time.Duration
}

// stopGrace is how long, beyond the drain timeout, Run waits for sarama to
// leave the group after ctx is done.
const stopGrace = 5 * time.Second

// Consumer consumes the order topic in a consumer group.
type Consumer struct {
	client  sarama.Client
	group   sarama.ConsumerGroup
	proc    Processor
	dlq     Parker
	opts    Options
	metrics *metrics.Metrics
	tracer  trace.Tracer
	log     *slog.Logger

	tokens chan struct{} // one per message in flight
	bytes  atomic.Int64  // keys and values of the messages in flight
	ready  atomic.Bool   // holds a group session
	member *membership   // whether the coordinator still counts it

	saveWarn   sync.Mutex // guards saveWarned
	saveWarned time.Time  // when a failed save of positions was last logged

	// pausing guards paused, so that a claim that begins and a change of
	// the charging state apply in one order.
	pausing sync.Mutex
	paused  bool // fetching is paused: charging is (SetPaused)

	mu    sync.Mutex
	owned map[int32]*partition // partitions being consumed, for lag
}

// NewConsumer joins group opts.Group through client when Run is called.
func NewConsumer(client sarama.Client, proc Processor, dlq Parker, opts Options, m *metrics.Metrics, tp trace.TracerProvider, log *slog.Logger) (*Consumer, error) {
	group, err := sarama.NewConsumerGroupFromClient(opts.Group, client)
	if err != nil {
		return nil, err
	}
	if opts.MaxInFlightBytes <= 0 {
		opts.MaxInFlightBytes = math.MaxInt64
	}
	// The processing spans keep package kafka's instrumentation scope
	// (the tracer's name): a trace backend that selects them by it still
	// finds them.
	c := &Consumer{
		client:  client,
		group:   group,
		proc:    proc,
		dlq:     dlq,
		opts:    opts,
		metrics: m,
		tracer:  tp.Tracer("example.com/billing/internal/kafka"),
		log:     log,
		tokens:  make(chan struct{}, opts.MaxInFlight),
		member:  newMembership(client, opts.Group),
		owned:   make(map[int32]*partition),
	}
	c.member.onTick = func(d time.Duration) { m.HeartbeatAge.Set(d.Seconds()) }
	c.member.onGeneration = func(g int32) { m.Generation.Set(float64(g)) }
	c.member.onLapse = func(d time.Duration) {
		log.Error("the group coordinator has not confirmed this member for longer than the session timeout (cut off from the brokers?): its partitions may be another member's by now, so it starts no new work until the coordinator confirms it again; work in flight is decided by the database",
			"unconfirmed_for", d, "session_timeout", c.member.timeout, "partitions", c.ownedPartitions())
	}
	c.member.onAgain = func(d time.Duration) {
		log.Warn("the group coordinator confirms this member again; resuming work", "unconfirmed_for", d)
	}
	return c, nil
}

// Ready reports whether the consumer holds a group session that the
// coordinator confirms.
func (c *Consumer) Ready() bool { return c.ready.Load() && c.member.holds() }

// SetPaused pauses fetching from every partition this member consumes, now
// and in its later sessions, or resumes it. A paused member stays in the
// group: it heartbeats, keeps its partitions and is ready, so nothing is
// rebalanced and the generation stays; the messages it had fetched still
// go to billing, whose charges wait for the resume (payment.Client). It is
// how serve follows an operator's pause of charging (internal/fleet).
func (c *Consumer) SetPaused(paused bool) {
	c.pausing.Lock()
	defer c.pausing.Unlock()
	if c.paused == paused {
		return
	}
	c.paused = paused
	if paused {
		c.group.PauseAll()
		c.log.Info("fetching paused, as charging is; the member stays in the group, its partitions and readiness unchanged", "partitions", c.ownedPartitions())
		return
	}
	c.group.ResumeAll()
	c.log.Info("fetching resumed, as charging is", "partitions", c.ownedPartitions())
}

// pauseClaim pauses a claim that begins while fetching is paused: sarama's
// PauseAll pauses the partitions consumed when it is called, not those a
// later session assigns.
func (c *Consumer) pauseClaim(claim sarama.ConsumerGroupClaim) {
	c.pausing.Lock()
	defer c.pausing.Unlock()
	if c.paused {
		c.group.Pause(map[string][]int32{claim.Topic(): {claim.Partition()}})
	}
}

// Run consumes until ctx is done, then drains in-flight work (within the
// drain timeout), commits the marked offsets and leaves the group.
func (c *Consumer) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		for err := range c.group.Errors() {
			c.log.Warn("consumer group error", "err", err)
		}
	})
	lagCtx, stopLag := context.WithCancel(ctx)
	defer stopLag()
	wg.Go(func() { c.reportLag(lagCtx) })
	wg.Go(func() { c.stepOverMarkers(lagCtx) })
	wg.Go(func() { c.member.run(lagCtx) })

	// sarama does not watch ctx while it joins the group, so a SIGTERM
	// during a rebalance would wait for the rebalance (up to its timeout, or
	// for a broker that never answers) and could outlive the pod's grace
	// period. Past the drain time, closing the connection ends it; offsets
	// not yet committed then only cost skipped duplicates later.
	returned := make(chan struct{})
	defer close(returned)
	wg.Go(func() {
		select {
		case <-returned:
			return
		case <-ctx.Done():
		}
		select {
		case <-returned:
		case <-time.After(c.opts.DrainTimeout + stopGrace):
			c.log.Warn("the consumer group did not stop within the drain timeout (a rebalance or a dead-letter write in progress?); closing the broker connections")
			_ = c.dlq.Close() // a Park blocked on an unreachable broker fails; its message stays unmarked
			_ = c.client.Close()
		}
	})

	// A failed join is retried within 2s at most: on Apache Kafka the group
	// coordinator's broker dying leaves no coordinator until the controller
	// fences it (broker.session.timeout.ms, 9s), and a backoff grown to 10s
	// by then kept the whole group idle for seconds after the new
	// coordinator was ready (measured in the chaos suite's
	// coordinator-kill-9). A join attempt to a dead or absent coordinator is
	// cheap; this costs one warning per process every 2s of an outage.
	retry := backoff.NewExponentialBackOff()
	retry.MaxInterval = 2 * time.Second
	for ctx.Err() == nil {
		// Consume returns when the session ends: on shutdown, or after an
		// eager rebalance or a lost session; then join again.
		err := c.group.Consume(ctx, []string{c.opts.Topic}, c)
		if ctx.Err() != nil {
			break
		}
		if err == nil {
			retry.Reset()
			continue
		}
		if errors.Is(err, sarama.ErrClosedConsumerGroup) {
			return err
		}
		wait := retry.NextBackOff()
		c.log.Warn("consumer group session failed; joining again", "err", kafkaacl.NameDenied(err, "Read on Topic "+c.opts.Topic, "Read on Group "+c.opts.Group), "retry_in", wait)
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	return c.group.Close()
}

// Setup implements sarama.ConsumerGroupHandler.
func (c *Consumer) Setup(sess sarama.ConsumerGroupSession) error {
	c.member.begin(sess)
	c.ready.Store(true)
	c.log.Info("joined consumer group", "member_id", sess.MemberID(), "generation", sess.GenerationID(), "claims", sess.Claims())
	return nil
}

// Cleanup implements sarama.ConsumerGroupHandler.
func (c *Consumer) Cleanup(sess sarama.ConsumerGroupSession) error {
	c.ready.Store(false)
	c.member.end()
	c.log.Info("left consumer group session", "member_id", sess.MemberID(), "generation", sess.GenerationID())
	return nil
}

// ConsumeClaim implements sarama.ConsumerGroupHandler. It hands the
// partition's messages to a goroutine per key (one key's messages in
// offset order, every key at once), and returns when the claim ends
// (revoked, or the session is over), after the work in flight finished or
// was abandoned.
func (c *Consumer) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	c.pauseClaim(claim)
	p := c.newPartition(sess, claim)
	c.mu.Lock()
	c.owned[claim.Partition()] = p
	c.mu.Unlock()
	c.metrics.Rebalances.WithLabelValues("assigned").Inc()
	c.log.Info("partition assigned", "topic", claim.Topic(), "partition", claim.Partition(), "offset", claim.InitialOffset())

	committing, stopCommitting := context.WithCancel(context.Background())
	var committer sync.WaitGroup
	committer.Go(func() { p.commit.run(committing) })
	p.run(claim.Messages())
	stopCommitting()
	committer.Wait()
	// What finished since the last commit is committed with the session's
	// end (once the database has it, with SavePositions); a key still busy
	// past the drain marks nothing more.
	p.release()
	ctx, cancel := context.WithTimeout(context.Background(), stopGrace)
	p.commit.close(ctx)
	cancel()

	c.mu.Lock()
	delete(c.owned, claim.Partition())
	c.mu.Unlock()
	c.metrics.Lag.DeleteLabelValues(partitionLabel(claim.Partition()))
	c.metrics.StableOffsetHeld.DeleteLabelValues(partitionLabel(claim.Partition()))
	c.metrics.Rebalances.WithLabelValues("revoked").Inc()
	c.log.Info("partition released", "topic", claim.Topic(), "partition", claim.Partition(), "unfinished", p.commit.unfinished())
	return nil
}

// ownedPartitions lists the partitions being consumed.
func (c *Consumer) ownedPartitions() []int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]int32, 0, len(c.owned))
	for id := range c.owned {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// traceID is the trace id of a message's span, "" when it has none.
func traceID(span trace.Span) string {
	if sc := span.SpanContext(); sc.HasTraceID() {
		return sc.TraceID().String()
	}
	return ""
}
