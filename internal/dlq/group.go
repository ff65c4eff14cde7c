package dlq

// This file is a replay as a member of its consumer group: progress is
// committed only after the broker acknowledged what was republished.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/kafka"
)

// run replays the ranges as a member of Group, until every partition is
// done, Max is reached, or something fails.
func (r *replayer) run(ctx context.Context, ranges map[int32]replayRange) error {
	// The producer has a client of its own, so that a republish never
	// waits behind the consumer's fetches on a shared connection.
	pcfg, err := replayProducerConfig(r.kafka)
	if err != nil {
		return err
	}
	producer, err := sarama.NewSyncProducer(r.kafka.Brokers, pcfg)
	if err != nil {
		return fmt.Errorf("dlq replay: producer: %w", err)
	}
	defer producer.Close()
	group, err := sarama.NewConsumerGroupFromClient(r.opts.Group, r.client)
	if err != nil {
		return fmt.Errorf("dlq replay: consumer group %s: %w", r.opts.Group, err)
	}
	var wg sync.WaitGroup
	defer func() {
		// Closing the group leaves it and ends group.Errors().
		_ = group.Close()
		wg.Wait()
	}()

	// replaying ends with the replay (its cause says how); ctx outlives
	// it for the last look at the commits.
	replaying, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	h := &replayHandler{r: r, producer: producer, ranges: ranges, done: map[int32]bool{}, progress: make(chan struct{}, 1), fail: cancel}

	wg.Go(func() {
		for err := range group.Errors() {
			r.log.Warn("replay consumer group error", "group", r.opts.Group, "err", err)
		}
	})
	wg.Go(func() { h.watch(replaying, cancel) })

	for replaying.Err() == nil {
		// A session ends on a rebalance (another replay joined or left);
		// join again and go on from the committed offsets.
		if err := group.Consume(replaying, []string{r.opts.DLQTopic}, h); err != nil && replaying.Err() == nil {
			if errors.Is(err, sarama.ErrClosedConsumerGroup) {
				return fmt.Errorf("dlq replay: consumer group %s: %w", r.opts.Group, err)
			}
			r.log.Warn("replay consumer group session failed; joining again", "group", r.opts.Group, "err", err)
			select {
			case <-replaying.Done():
			case <-time.After(time.Second):
			}
		}
	}
	switch cause := context.Cause(replaying); {
	case errors.Is(cause, errReplayFinished), errors.Is(cause, errReplayMaxReached):
	case cause != nil:
		return cause
	}
	// The commits are the replay's memory; make sure they arrived.
	committed, err := kafka.CommittedOffsets(ctx, r.client, r.opts.Group, r.opts.DLQTopic)
	if err != nil {
		return fmt.Errorf("dlq replay: %w", err)
	}
	for p, rg := range ranges {
		if h.isDone(p) && committed[p] < rg.end {
			return fmt.Errorf("dlq replay: group %s committed %s/%d up to %d, not %d: a rerun republishes the rest again (billing skips them as duplicates)",
				r.opts.Group, r.opts.DLQTopic, p, committed[p], rg.end)
		}
	}
	return nil
}

// replayHandler is the consumer group handler of a replay.
type replayHandler struct {
	r        *replayer
	producer sarama.SyncProducer
	ranges   map[int32]replayRange
	fail     context.CancelCauseFunc
	progress chan struct{} // a partition got done

	mu   sync.Mutex
	done map[int32]bool // partitions replayed up to their end and committed
}

func (h *replayHandler) Setup(sarama.ConsumerGroupSession) error { return nil }

func (h *replayHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *replayHandler) isDone(p int32) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.done[p]
}

// allDone reports whether every partition is done, here or, judging by the
// committed offsets (nil: not read), by another member of the group.
func (h *replayHandler) allDone(committed map[int32]int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for p, rg := range h.ranges {
		if c, ok := committed[p]; ok && c >= rg.end {
			h.done[p] = true
		}
		if !h.done[p] {
			return false
		}
	}
	return true
}

// watch ends the run once every partition is done.
func (h *replayHandler) watch(ctx context.Context, cancel context.CancelCauseFunc) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.progress:
		case <-tick.C:
		}
		var committed map[int32]int64
		if !h.allDone(nil) {
			// Partitions another replay holds: their committed offsets say
			// whether it finished them.
			c, err := kafka.CommittedOffsets(ctx, h.r.client, h.r.opts.Group, h.r.opts.DLQTopic)
			if err != nil {
				h.r.log.Warn("replay: cannot read the group's offsets", "err", err)
				continue
			}
			committed = c
		}
		if h.allDone(committed) {
			cancel(errReplayFinished)
			return
		}
	}
}

// finish marks partition p done up to its end and commits.
func (h *replayHandler) finish(sess sarama.ConsumerGroupSession, p int32) {
	sess.MarkOffset(h.r.opts.DLQTopic, p, h.ranges[p].end, "")
	sess.Commit()
	h.mu.Lock()
	h.done[p] = true
	h.mu.Unlock()
	select {
	case h.progress <- struct{}{}:
	default:
	}
}

// commitEvery bounds the messages acknowledged but not committed, which a
// crash would make the next run republish.
const commitEvery = 100

// ConsumeClaim republishes one partition's messages up to its end offset
// as of the start. It does not return when done: in sarama, a handler that
// returns ends the session for every partition.
func (h *replayHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	p := claim.Partition()
	rg, ok := h.ranges[p]
	// Marks are made only after an acknowledgement, so whatever is marked
	// may be committed when the claim ends, however it ends.
	defer sess.Commit()
	if !ok || h.isDone(p) {
		<-sess.Context().Done()
		return nil
	}
	if off := claim.InitialOffset(); off >= rg.end {
		h.finish(sess, p)
		<-sess.Context().Done()
		return nil
	}
	uncommitted := 0
	for {
		var m *sarama.ConsumerMessage
		select {
		case <-sess.Context().Done():
			return nil
		case m, ok = <-claim.Messages():
			if !ok {
				return nil
			}
		}
		if m.Offset >= rg.end {
			h.finish(sess, p)
			<-sess.Context().Done()
			return nil
		}
		switch h.r.judge(m) {
		case replayStop:
			h.fail(errReplayMaxReached)
			return nil
		case replayTake:
			if err := h.republish(sess.Context(), m); err != nil {
				h.r.uncount()
				h.fail(err)
				return nil
			}
		}
		sess.MarkMessage(m, "")
		uncommitted++
		if m.Offset+1 >= rg.end {
			h.finish(sess, p)
			<-sess.Context().Done()
			return nil
		}
		// Commit in batches, and whenever the fetched messages run out.
		if uncommitted >= commitEvery || len(claim.Messages()) == 0 {
			sess.Commit()
			uncommitted = 0
		}
	}
}

// republish sends m back and returns once the broker acknowledged it. A
// reference is resolved first: its original is republished, or, when the
// source topic no longer holds it, reported as gone and passed over.
func (h *replayHandler) republish(ctx context.Context, m *sarama.ConsumerMessage) error {
	topic, partition, err := h.r.destination(m)
	if err != nil {
		return err
	}
	reason := Header(m.Headers, HeaderReason)
	body := m
	if isReference(m) {
		original, err := h.r.original(ctx, m)
		var gone *goneError
		if errors.As(err, &gone) {
			h.r.countGone()
			h.r.log.Error("cannot replay a message parked as a reference: its original is gone", "dlq_partition", m.Partition,
				"dlq_offset", m.Offset, "err", err)
			h.r.report(Replayed{DLQPartition: m.Partition, DLQOffset: m.Offset, Key: m.Key, Reason: reason, Topic: topic, Partition: partition, Gone: gone.Error()})
			return nil
		}
		if err != nil {
			return err
		}
		body = original
	}
	if _, _, err := h.producer.SendMessage(republished(body, m, topic, partition, h.r.action)); err != nil {
		return fmt.Errorf("dlq replay: republish %s/%d@%d to %s/%d: %w", m.Topic, m.Partition, m.Offset, topic, partition, err)
	}
	h.r.log.Info("replayed", "dlq_partition", m.Partition, "dlq_offset", m.Offset, "key", string(m.Key),
		"reason", reason, "topic", topic, "partition", partition)
	h.r.report(Replayed{DLQPartition: m.Partition, DLQOffset: m.Offset, Key: m.Key, Reason: reason, Topic: topic, Partition: partition})
	return nil
}
