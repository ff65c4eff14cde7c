package kafka

import (
	"context"
	"strconv"
	"time"

	"github.com/IBM/sarama"
)

// lagInterval is how often consumer lag is read from the broker.
const lagInterval = 5 * time.Second

func partitionLabel(p int32) string { return strconv.FormatInt(int64(p), 10) }

// reportLag sets billing_consumer_lag for the owned partitions from the
// broker's high-water marks and the group's committed offsets, read from the
// broker rather than from what this process believes it committed, and
// refreshed while a partition is idle too.
func (c *Consumer) reportLag(ctx context.Context) {
	t := time.NewTicker(lagInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		parts := make([]int32, 0, len(c.owned))
		for id := range c.owned {
			parts = append(parts, id)
		}
		c.mu.Unlock()
		if len(parts) == 0 {
			continue
		}
		committed, err := CommittedOffsets(c.client, c.opts.Group, c.opts.Topic)
		if err != nil {
			c.log.Debug("read committed offsets", "err", err)
			continue
		}
		for _, id := range parts {
			hwm, err := c.client.GetOffset(c.opts.Topic, id, sarama.OffsetNewest)
			if err != nil {
				continue
			}
			from := committed[id]
			if from < 0 { // nothing committed yet: the group starts at the oldest offset
				if from, err = c.client.GetOffset(c.opts.Topic, id, sarama.OffsetOldest); err != nil {
					continue
				}
			}
			c.mu.Lock()
			_, still := c.owned[id]
			if still {
				c.metrics.Lag.WithLabelValues(partitionLabel(id)).Set(float64(max(hwm-from, 0)))
			}
			c.mu.Unlock()
		}
	}
}
