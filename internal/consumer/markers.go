package consumer

// An idle partition whose last records are transaction markers or records
// of aborted transactions would stay one short of its end for ever under
// the commit rule: those offsets are handed to no consumer. Package kafka
// reads how far they go (kafka.FirstReadable, where the reasons are told);
// here the consumer looks at its idle partitions and steps their finished
// prefix over them.

import (
	"context"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/kafka"
)

// markerInterval is how often idle partitions are looked at.
const markerInterval = time.Second

// look is one look at a partition: from where, and up to which high-water
// mark. The same look again finds the same.
type look struct{ from, high int64 }

// stepOverMarkers marks every idle partition past the markers and aborted
// records that follow its finished prefix, every markerInterval until ctx
// ends.
func (c *Consumer) stepOverMarkers(ctx context.Context) {
	t := time.NewTicker(markerInterval)
	defer t.Stop()
	looked := map[*partition]look{}
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
		seen := make(map[*partition]look, len(ps))
		for _, p := range ps {
			from, ok := c.idleAt(p)
			if !ok {
				continue
			}
			l := look{from: from, high: p.claim.HighWaterMarkOffset()}
			if from >= l.high {
				continue // at the end
			}
			seen[p] = l
			if looked[p] == l {
				continue // a fetch found nothing to step over, and nothing changed since
			}
			to, err := kafka.FirstReadable(c.client, p.topic, p.id, from)
			if err != nil {
				c.log.Debug("look past a partition's finished messages", "partition", p.id, "offset", from, "err", err)
				delete(seen, p)
				continue
			}
			if to > from {
				p.stepTo(to)
			}
		}
		looked = seen
	}
}

// idleAt returns where p's finished prefix ends when every message read
// off its claim is finished, and false while some is not.
func (c *Consumer) idleAt(p *partition) (int64, bool) {
	from, idle := p.commit.idle()
	if !idle {
		return 0, false
	}
	if from >= 0 {
		return from, true
	}
	// Nothing finished yet in this claim: it starts where the group's
	// committed offset is, or at the oldest record for a new group.
	if p.initial >= 0 {
		return p.initial, true
	}
	oldest, err := c.client.GetOffset(p.topic, p.id, sarama.OffsetOldest)
	if err != nil {
		return 0, false
	}
	return oldest, true
}
