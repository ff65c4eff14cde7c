package consumer

// This file is how far one partition is finished, and how that reaches
// Kafka's committed offset: the commit rule (tracker), then one of two
// committers. In production a partition's committer saves its position in
// the database before it marks the offset for sarama's commit (Positions);
// the seed design's benchmark marks and commits each message at once.

import (
	"context"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/metrics"
)

// Positions keeps the consumer group's position in each partition in the
// database that holds the effects of the messages (dedup.Positions): Kafka's
// committed offset and billing's records are written separately, and a
// database that fails over to an asynchronous standby comes back without
// its last acknowledged commits while Kafka keeps the offsets committed
// after them. The messages in between would never be delivered again, and
// their charges, claims and outcome events would be gone.
//
// So a position is saved in the database first, and only then marked for
// Kafka's commit: Kafka's committed offset never passes the database's
// position, and a database position below what this process saved is the
// database having lost commits. The partition is then consumed again from
// the database's position (rewind).
type Positions interface {
	// Save raises each partition's saved position of topic to the given
	// offset (never lowering one) and returns the positions held before,
	// absent for a partition that had none.
	Save(ctx context.Context, topic string, offsets map[int32]int64) (before map[int32]int64, err error)
}

// Commit is how a Consumer commits what its partitions finished: the
// committer each partition gets.
type Commit struct {
	positions Positions
	each      bool
}

// SavePositions is production's commit: each partition's position is
// saved in the database (positions) every second, and at once when the
// partition has nothing left in flight, and only then marked for sarama's
// commit, which follows within a second (and at once after an idle save).
func SavePositions(positions Positions) Commit { return Commit{positions: positions} }

// CommitEach marks and commits each finished message synchronously, with
// no position in the database: the seed design's commit, for the
// benchmark (a binary built with -tags seeddesign).
func CommitEach() Commit { return Commit{each: true} }

// The zero Commit marks each finished prefix at once for sarama's
// commit, with no position in the database: the consumer's own tests.

// committer records which offsets of one partition were taken off the
// claim and which finished, and commits the finished prefix.
type committer interface {
	// add records an offset taken off the claim.
	add(offset int64)
	// finish records offset as finished.
	finish(offset int64)
	// stepTo moves the finished prefix to to, which follows only
	// transaction markers and aborted records (markers.go), when nothing
	// taken is unfinished.
	stepTo(to int64)
	// idle returns the end of the finished prefix, -1 before the first,
	// and whether every offset taken is finished.
	idle() (int64, bool)
	unfinished() int
	// run commits in the background until ctx ends.
	run(ctx context.Context)
	// close commits what finished when the claim ends; run has returned.
	close(ctx context.Context)
	// rewound is closed when the partition must be consumed again from
	// the database's position (nil: never).
	rewound() <-chan struct{}
}

func (c *Consumer) newCommitter(p *partition) committer {
	switch {
	case c.opts.Commit.positions != nil:
		s := &saving{sess: p.sess, topic: p.topic, id: p.id, positions: c.opts.Commit.positions, window: c.opts.ReplayWindow,
			client: c.client, metrics: c.metrics, log: c.log, saveFailed: c.saveFailed,
			saved: -1, poke: make(chan struct{}, 1), lost: make(chan struct{})}
		s.end.Store(-1)
		if p.initial >= 0 {
			s.saved = p.initial
		}
		return s
	default:
		m := &marking{sess: p.sess, topic: p.topic, id: p.id, commit: c.opts.Commit.each}
		m.end.Store(-1)
		return m
	}
}

// marking marks the finished prefix as soon as it moves, and commits it at
// once when commit is set.
type marking struct {
	tracker
	sess   sarama.ConsumerGroupSession
	topic  string
	id     int32
	commit bool
}

func (m *marking) finish(offset int64) {
	if next, ok := m.tracker.finish(offset); ok {
		m.mark(next)
	}
}

func (m *marking) stepTo(to int64) {
	if m.tracker.stepTo(to) {
		m.mark(to)
	}
}

func (m *marking) mark(next int64) {
	m.sess.MarkOffset(m.topic, m.id, next, "")
	if m.commit {
		m.sess.Commit()
	}
}

func (m *marking) run(ctx context.Context)  { <-ctx.Done() }
func (m *marking) close(context.Context)    {}
func (m *marking) rewound() <-chan struct{} { return nil }

// saving saves the partition's position in the database before it marks
// it (Positions): every positionInterval, moved or not, so that an idle
// partition also notices a database that lost its position; and as soon
// as the partition has nothing in flight, at most every idleSaveGap, with
// a commit, so that a partition whose work is done is committed within
// milliseconds, not seconds (its lag reads 0 and a rebalance or a crash
// then redelivers nothing). A database position below what this
// committer saved before is the database having lost commits: the
// partition is consumed again from there (rewind).
type saving struct {
	tracker
	sess  sarama.ConsumerGroupSession
	topic string
	id    int32
	// What the committer uses of its Consumer and partition, given at
	// construction: it runs on a goroutine of its own, and reaches them
	// through nothing else (none of these changes while the claim lasts).
	positions  Positions     // the consumer's Commit
	window     time.Duration // the consumer's ReplayWindow
	client     sarama.Client // for the offsets within the window
	metrics    *metrics.Metrics
	log        *slog.Logger
	saveFailed func(error) // Consumer.saveFailed: one warning for all partitions
	// saved is the position the database acknowledged last (or, at first,
	// the offset the claim started at), -1 when unknown; only run and then
	// close touch it.
	saved     int64
	lastSave  time.Time
	poke      chan struct{} // the partition became idle
	rewinding atomic.Bool
	lost      chan struct{} // closed when rewinding starts
}

// positionInterval is how often a position is saved and then marked while
// the partition works; sarama commits what is marked every second.
// idleSaveGap bounds the saves of a partition that keeps running dry.
const (
	positionInterval = time.Second
	idleSaveGap      = 200 * time.Millisecond
)

func (s *saving) finish(offset int64) {
	if _, ok := s.tracker.finish(offset); ok && s.tracker.unfinished() == 0 {
		s.nudge()
	}
}

func (s *saving) stepTo(to int64) {
	if !s.rewinding.Load() && s.tracker.stepTo(to) {
		s.nudge()
	}
}

func (s *saving) idle() (int64, bool) {
	if s.rewinding.Load() {
		return 0, false
	}
	return s.tracker.idle()
}

func (s *saving) nudge() {
	select {
	case s.poke <- struct{}{}:
	default:
	}
}

func (s *saving) rewound() <-chan struct{} { return s.lost }

func (s *saving) run(ctx context.Context) {
	tick := time.NewTicker(positionInterval)
	defer tick.Stop()
	for {
		commit := false
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-s.poke:
			if wait := idleSaveGap - time.Since(s.lastSave); wait > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
			}
			commit = true
		}
		if s.rewinding.Load() {
			return
		}
		s.save(ctx, commit)
	}
}

func (s *saving) close(ctx context.Context) {
	if !s.rewinding.Load() {
		s.save(ctx, false) // sarama commits it with the session's end
	}
}

// save saves the partition's position and marks it, committing at once
// when commit is set and the position moved.
func (s *saving) save(ctx context.Context, commit bool) {
	at := max(s.end.Load(), s.saved)
	if at < 0 {
		return
	}
	s.lastSave = time.Now()
	before, err := s.positions.Save(ctx, s.topic, map[int32]int64{s.id: at})
	if err != nil {
		// Nothing is marked meanwhile: a crash redelivers more, which
		// deduplication skips.
		s.saveFailed(err)
		return
	}
	if had, found := before[s.id]; found && s.saved >= 0 && had < s.saved {
		s.rewind(ctx, had)
		return
	}
	moved := at != s.saved
	s.saved = at
	s.sess.MarkOffset(s.topic, s.id, at, "")
	if commit && moved {
		s.sess.Commit()
	}
}

// saveFailed warns that positions cannot be saved, once a second at most
// for all partitions: an outage fails every partition's save.
func (c *Consumer) saveFailed(err error) {
	c.saveWarn.Lock()
	defer c.saveWarn.Unlock()
	if now := time.Now(); now.Sub(c.saveWarned) >= time.Second {
		c.saveWarned = now
		c.log.Warn("cannot save the partitions' positions in the database; Kafka's committed offsets wait for it", "err", err)
	}
}

// rewind consumes the partition again from to, the position the database
// still has, after it lost the commits of what this process had finished
// up to s.saved. It resets the partition's offset to it, commits that, and
// ends the claim, which ends the session: the next one consumes the
// partition from there. Deduplication skips what the database still has,
// and the provider answers the charges it already made from its
// idempotency store (same key, same body).
//
// Not beyond the provider's idempotency window: a message older than that
// (by its Kafka timestamp, which precedes its first charge) may have been
// charged under a key the provider has forgotten, and charging it again
// could charge twice. Those are reported for reconciliation instead, and
// the database's position is raised past them.
func (s *saving) rewind(ctx context.Context, to int64) {
	s.rewinding.Store(true)
	close(s.lost)
	from := s.saved
	replayFrom := to
	if w := s.window; w > 0 {
		if recent, err := s.client.GetOffset(s.topic, s.id, time.Now().Add(-w).UnixMilli()); err == nil && recent > to {
			replayFrom = min(recent, from)
		}
	}
	s.metrics.Rewinds.Inc()
	s.metrics.RewoundMessages.Add(float64(from - replayFrom))
	s.log.Error("the database lost commits (a failover to a standby that lacked them, a restored backup): its position of the partition is behind what this process saved, and the messages in between may have lost their claims, charge records and outcome events; consuming them again (deduplication skips what the database still has; the provider answers charges it made from its idempotency store)",
		"topic", s.topic, "partition", s.id, "database_position", to, "saved_position", from, "consume_again_from", replayFrom, "messages", from-replayFrom)
	if replayFrom > to {
		s.log.Error("messages older than the provider's idempotency window are not consumed again: the provider may have forgotten their keys, so asking again could charge twice; reconcile these offsets with the provider (billing reconcile)",
			"topic", s.topic, "partition", s.id, "from_offset", to, "to_offset", replayFrom, "window", s.window)
		if _, err := s.positions.Save(ctx, s.topic, map[int32]int64{s.id: replayFrom}); err != nil {
			s.log.Warn("cannot raise the partition's position past the reported messages; it is rewound again next time", "partition", s.id, "err", err)
		}
	}
	s.sess.ResetOffset(s.topic, s.id, replayFrom, "")
	s.sess.Commit()
}

// tracker knows which offsets of one partition were taken off the claim and
// which of them are finished, and so how far the partition may be marked.
//
// Keys finish their messages out of offset order. An offset becomes
// committable only when it and every message before it are finished:
// sarama's MarkOffset never moves back, so marking a later offset early
// would lose an earlier, unfinished message on a crash.
//
// The partition's keys finish their messages from goroutines of their
// own, and the markers' look-ahead steps over markers from another: the
// end of the finished prefix moves under the tracker's lock, so that it
// never moves back.
type tracker struct {
	mu      sync.Mutex
	entries []entry // ascending offsets; entries[head:] are past the finished prefix
	head    int
	// end is the next offset after the finished prefix, -1 before the
	// first (the committers start it there); written under mu.
	end atomic.Int64
}

type entry struct {
	offset   int64
	finished bool
}

// add records an offset taken off the claim. Offsets arrive in ascending
// order (with gaps where the log was compacted or held transaction markers).
func (t *tracker) add(offset int64) {
	t.mu.Lock()
	t.entries = append(t.entries, entry{offset: offset})
	t.mu.Unlock()
}

// finish records offset as finished. When that completes a prefix, it
// returns the next offset to read (the value to mark) and true.
func (t *tracker) finish(offset int64) (int64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	pending := t.entries[t.head:]
	i := sort.Search(len(pending), func(i int) bool { return pending[i].offset >= offset })
	if i == len(pending) || pending[i].offset != offset {
		return 0, false
	}
	pending[i].finished = true

	start := t.head
	for t.head < len(t.entries) && t.entries[t.head].finished {
		t.head++
	}
	if t.head == start {
		return 0, false
	}
	next := t.entries[t.head-1].offset + 1
	t.end.Store(next)
	// Reuse the slice's space once most of it is marked.
	if t.head > 1024 && t.head*2 > len(t.entries) {
		t.entries = append(t.entries[:0], t.entries[t.head:]...)
		t.head = 0
	}
	return next, true
}

// stepTo moves the end of the finished prefix to to, which follows only
// transaction markers and aborted records (markers.go), when nothing taken
// is unfinished and to is further; it reports whether it moved.
func (t *tracker) stepTo(to int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.entries) > t.head || to <= t.end.Load() {
		return false
	}
	t.end.Store(to)
	return true
}

// idle returns the end of the finished prefix, -1 before the first, and
// whether every offset taken is finished.
func (t *tracker) idle() (int64, bool) { return t.end.Load(), t.unfinished() == 0 }

// unfinished returns how many offsets are taken but not yet committable.
func (t *tracker) unfinished() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.entries) - t.head
}
