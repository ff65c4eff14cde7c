package kafka

import (
	"context"
	"sync/atomic"
	"time"
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

// positionInterval is how often positions are saved and then marked; sarama
// commits what is marked every second.
const positionInterval = time.Second

// position is a partition's progress, as the tracker and the database know
// it.
type position struct {
	// done is the next offset to read after the finished prefix (what the
	// commit rule allows to mark), -1 before the first.
	done atomic.Int64
	// saved is the position the database acknowledged last (or, at first,
	// the offset the claim started at), -1 when unknown; guarded by
	// Consumer.posMu.
	saved int64
	// rewinding: the database lost this partition's position; nothing of
	// it is saved or marked any more, and its claim ends.
	rewinding atomic.Bool
	rewound   chan struct{} // closed when rewinding starts
}

func newPosition(initial int64) *position {
	p := &position{saved: -1, rewound: make(chan struct{})}
	p.done.Store(-1)
	if initial >= 0 {
		p.saved = initial
	}
	return p
}

// keepPositions saves the owned partitions' positions every
// positionInterval until ctx ends.
func (c *Consumer) keepPositions(ctx context.Context) {
	t := time.NewTicker(positionInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		ps := make([]*partition, 0, len(c.owned))
		for _, p := range c.owned {
			ps = append(ps, p)
		}
		c.mu.Unlock()
		c.savePositions(ctx, ps)
	}
}

// savePositions saves the positions of ps in the database and then marks
// them for Kafka's commit. Every owned partition is saved each time, moved
// or not, so that an idle one also notices a database that lost its
// position. A partition whose database position is below what this
// process saved is rewound.
func (c *Consumer) savePositions(ctx context.Context, ps []*partition) {
	c.posMu.Lock()
	defer c.posMu.Unlock()
	offsets := make(map[int32]int64, len(ps))
	for _, p := range ps {
		if p.pos.rewinding.Load() {
			continue
		}
		if at := max(p.pos.done.Load(), p.pos.saved); at >= 0 {
			offsets[p.id] = at
		}
	}
	if len(offsets) == 0 {
		return
	}
	before, err := c.positions.Save(ctx, c.opts.Topic, offsets)
	if err != nil {
		// Nothing is marked meanwhile: a crash redelivers more, which
		// deduplication skips.
		c.log.Warn("cannot save the partitions' positions in the database; Kafka's committed offsets wait for it", "err", err)
		return
	}
	for _, p := range ps {
		at, ok := offsets[p.id]
		if !ok {
			continue
		}
		if had, found := before[p.id]; found && p.pos.saved >= 0 && had < p.pos.saved {
			c.rewind(ctx, p, had)
			continue
		}
		p.pos.saved = at
		p.sess.MarkOffset(p.topic, p.id, at, "")
	}
}

// rewind consumes p again from to, the position the database still has,
// after it lost the commits of what this process had finished up to
// p.pos.saved. It resets p's offset to it, commits that, and ends p's claim,
// which ends the session: the next one consumes p from there.
// Deduplication skips what the database still has, and the provider
// answers the charges it already made from its idempotency store (same
// key, same body).
//
// Not beyond the provider's idempotency window: a message older than that
// (by its Kafka timestamp, which precedes its first charge) may have been
// charged under a key the provider has forgotten, and charging it again
// could charge twice. Those are reported for reconciliation instead, and
// the database's position is raised past them.
func (c *Consumer) rewind(ctx context.Context, p *partition, to int64) {
	p.pos.rewinding.Store(true)
	close(p.pos.rewound)
	from := p.pos.saved
	replayFrom := to
	if w := c.opts.ReplayWindow; w > 0 {
		if recent, err := c.client.GetOffset(p.topic, p.id, time.Now().Add(-w).UnixMilli()); err == nil && recent > to {
			replayFrom = min(recent, from)
		}
	}
	c.metrics.Rewinds.Inc()
	c.metrics.RewoundMessages.Add(float64(from - replayFrom))
	c.log.Error("the database lost commits (a failover to a standby that lacked them, a restored backup): its position of the partition is behind what this process saved, and the messages in between may have lost their claims, charge records and outcome events; consuming them again (deduplication skips what the database still has; the provider answers charges it made from its idempotency store)",
		"topic", p.topic, "partition", p.id, "database_position", to, "saved_position", from, "consume_again_from", replayFrom, "messages", from-replayFrom)
	if replayFrom > to {
		c.log.Error("messages older than the provider's idempotency window are not consumed again: the provider may have forgotten their keys, so asking again could charge twice; reconcile these offsets with the provider (billing reconcile)",
			"topic", p.topic, "partition", p.id, "from_offset", to, "to_offset", replayFrom, "window", c.opts.ReplayWindow)
		if _, err := c.positions.Save(ctx, p.topic, map[int32]int64{p.id: replayFrom}); err != nil {
			c.log.Warn("cannot raise the partition's position past the reported messages; it is rewound again next time", "partition", p.id, "err", err)
		}
	}
	p.sess.ResetOffset(p.topic, p.id, replayFrom, "")
	p.sess.Commit()
}
