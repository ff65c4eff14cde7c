package consumer

import (
	"context"
	"strconv"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/kafka"
)

// lagInterval is how often consumer lag is read from the broker.
const lagInterval = 5 * time.Second

// holdWarnAfter is how long a partition's last stable offset may stand
// still below its high-water mark before a warning is logged: longer than
// a healthy transaction lasts (Kafka Streams and Spring commit within
// seconds), much shorter than the broker's transaction.timeout.ms (60 s by
// default), after which the broker aborts it.
const holdWarnAfter = 15 * time.Second

func partitionLabel(p int32) string { return strconv.FormatInt(int64(p), 10) }

// hold is what reportLag knows of a partition whose readable end (the last
// stable offset) is below its high-water mark: a transaction is open.
type hold struct {
	stable int64     // the last stable offset seen
	since  time.Time // when it was first seen there
	warned bool
}

// reportLag sets billing_consumer_lag for the owned partitions from the
// partitions' last stable offsets (what billing, reading committed records
// only, can reach: after a transaction's marker it is the high-water mark)
// and the group's committed offsets, read from the broker rather than from
// what this process believes it committed, and refreshed while a partition
// is idle too. It also says how long each partition's last stable offset
// has stood still below its high-water mark
// (billing_consumer_stable_offset_held_seconds), and warns when a
// transaction holds a partition back for longer than holdWarnAfter: every
// later record of the partition waits for that producer.
func (c *Consumer) reportLag(ctx context.Context) {
	t := time.NewTicker(lagInterval)
	defer t.Stop()
	holds := map[int32]*hold{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		parts := c.ownedPartitions()
		for id := range holds {
			if !c.owns(id) {
				delete(holds, id)
			}
		}
		if len(parts) == 0 {
			continue
		}
		committed, err := kafka.CommittedOffsets(ctx, c.client, c.opts.Group, c.opts.Topic)
		if err != nil {
			c.log.Debug("read committed offsets", "err", err)
			continue
		}
		ends, err := kafka.PartitionEnds(c.client, c.opts.Topic, parts)
		if err != nil {
			c.log.Debug("read end offsets", "err", err)
			continue
		}
		now := time.Now()
		for _, id := range parts {
			e := ends[id]
			from := committed[id]
			if from < 0 { // nothing committed yet: the group starts at the oldest offset
				if from, err = c.client.GetOffset(c.opts.Topic, id, sarama.OffsetOldest); err != nil {
					continue
				}
			}
			held := c.held(holds, id, e, now)
			c.mu.Lock()
			if _, still := c.owned[id]; still {
				c.metrics.Lag.WithLabelValues(partitionLabel(id)).Set(float64(max(e.Stable-from, 0)))
				c.metrics.StableOffsetHeld.WithLabelValues(partitionLabel(id)).Set(held.Seconds())
			}
			c.mu.Unlock()
		}
	}
}

// held updates partition id's hold from its ends, seen at now, and returns
// how long its last stable offset has stood still below its high-water
// mark. A last stable offset that moved between two readings is held from
// the second.
func (c *Consumer) held(holds map[int32]*hold, id int32, e kafka.Ends, now time.Time) time.Duration {
	h := holds[id]
	if e.Stable >= e.High {
		if h != nil && h.warned {
			c.log.Info("the open transaction that held the partition back ended; its records are read again",
				"topic", c.opts.Topic, "partition", id, "held_for", now.Sub(h.since).Round(time.Second), "last_stable_offset", e.Stable)
		}
		delete(holds, id)
		return 0
	}
	if h == nil || h.stable != e.Stable {
		holds[id] = &hold{stable: e.Stable, since: now}
		return 0
	}
	d := now.Sub(h.since)
	if d >= holdWarnAfter && !h.warned {
		h.warned = true
		c.log.Warn("a producer's open transaction holds the partition back: billing reads committed records only, so every record after the transaction's first waits until its producer commits or aborts it, or the broker aborts it at the producer's transaction.timeout.ms (find it with kafka-transactions.sh describe-producers, see docs/operations.md)",
			"topic", c.opts.Topic, "partition", id, "last_stable_offset", e.Stable, "high_water_mark", e.High, "held_for", d.Round(time.Second))
	}
	return d
}

// owns reports whether the consumer consumes partition id.
func (c *Consumer) owns(id int32) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.owned[id]
	return ok
}
