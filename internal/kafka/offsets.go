package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/cenkalti/backoff/v5"
)

// EndOffsets returns the last stable offset of every partition of topic,
// as the leaders have it now: the end a read_committed consumer, such as
// billing, reaches. It is the high-water mark unless a transaction is
// open on the partition.
func EndOffsets(client sarama.Client, topic string) (map[int32]int64, error) {
	if err := client.RefreshMetadata(topic); err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	parts, err := client.Partitions(topic)
	if err != nil {
		return nil, fmt.Errorf("partitions of %s: %w", topic, err)
	}
	ends, err := PartitionEnds(client, topic, parts)
	if err != nil {
		return nil, err
	}
	out := make(map[int32]int64, len(ends))
	for p, e := range ends {
		out[p] = e.Stable
	}
	return out, nil
}

// Ends are the two ends of a partition. High is the high-water mark, one
// past the last record written (a transaction's marker included). Stable
// is the last stable offset: one past the last record a read_committed
// consumer may read, the first record of the oldest transaction still
// open, or High when none is.
type Ends struct {
	Stable, High int64
}

// PartitionEnds returns the ends of parts of topic, asked of their leaders
// now (two ListOffsets requests per leader, one per isolation level).
func PartitionEnds(client sarama.Client, topic string, parts []int32) (map[int32]Ends, error) {
	// The admin shares the client; closing it would close the client.
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return nil, err
	}
	newest := make(map[int32]int64, len(parts))
	for _, p := range parts {
		newest[p] = sarama.OffsetNewest
	}
	query := map[string]map[int32]int64{topic: newest}
	out := make(map[int32]Ends, len(parts))
	for _, level := range []sarama.IsolationLevel{sarama.ReadCommitted, sarama.ReadUncommitted} {
		res, err := admin.ListOffsets(query, &sarama.ListOffsetsOptions{IsolationLevel: level})
		if err == nil {
			err = partitionError(res[topic], parts)
		}
		if err != nil {
			// A leader that moved answers NOT_LEADER: the next call asks
			// the new one.
			_ = client.RefreshMetadata(topic)
			return nil, fmt.Errorf("end offsets of %s: %w", topic, err)
		}
		for _, p := range parts {
			e := out[p]
			if level == sarama.ReadCommitted {
				e.Stable = res[topic][p].Offset
			} else {
				e.High = res[topic][p].Offset
			}
			out[p] = e
		}
	}
	return out, nil
}

// partitionError is the first error ListOffsets answered for one of parts.
func partitionError(res map[int32]*sarama.OffsetResult, parts []int32) error {
	for _, p := range parts {
		r, ok := res[p]
		switch {
		case !ok:
			return fmt.Errorf("partition %d: %w", p, sarama.ErrIncompleteResponse)
		case r.Err != nil && !errors.Is(r.Err, sarama.ErrNoError):
			return fmt.Errorf("partition %d: %w", p, r.Err)
		}
	}
	return nil
}

// CommittedOffsets returns group's committed offset of every partition of
// topic, read from the broker: -1 where nothing is committed, also when the
// group has never committed at all. While the group's coordinator moves or
// loads its offsets (after a broker restart, or when leaders move back to
// their preferred replicas) it asks again, until ctx is done: the answer
// comes within seconds, and an error meanwhile would fail a replay or a
// check on a healthy cluster.
func CommittedOffsets(ctx context.Context, client sarama.Client, group, topic string) (map[int32]int64, error) {
	retry := backoff.NewExponentialBackOff()
	retry.InitialInterval = 100 * time.Millisecond
	retry.MaxInterval = time.Second
	var busy error // the coordinator's last answer, when ctx ends the wait
	out, err := backoff.Retry(ctx, func() (map[int32]int64, error) {
		out, err := committedOffsets(client, group, topic)
		if err != nil && !coordinatorBusy(err) {
			return nil, backoff.Permanent(err)
		}
		busy = err
		return out, err
	}, backoff.WithBackOff(retry), backoff.WithMaxElapsedTime(0))
	if err != nil && busy != nil && !errors.Is(err, busy) {
		return nil, fmt.Errorf("%w: %w", busy, err)
	}
	return out, err
}

// coordinatorBusy reports whether err says the group's coordinator is
// moving or loading its offsets, which passes.
func coordinatorBusy(err error) bool {
	return errors.Is(err, sarama.ErrOffsetsLoadInProgress) ||
		errors.Is(err, sarama.ErrNotCoordinatorForConsumer) ||
		errors.Is(err, sarama.ErrConsumerCoordinatorNotAvailable)
}

func committedOffsets(client sarama.Client, group, topic string) (map[int32]int64, error) {
	parts, err := client.Partitions(topic)
	if err != nil {
		return nil, fmt.Errorf("partitions of %s: %w", topic, err)
	}
	// The admin shares the client; closing it would close the client.
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return nil, err
	}
	out := make(map[int32]int64, len(parts))
	for _, p := range parts {
		out[p] = -1
	}
	resp, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: parts})
	if errors.Is(err, sarama.ErrGroupIDNotFound) {
		return out, nil
	}
	if err != nil {
		// sarama looks the coordinator up again on "not coordinator" only;
		// when the coordinator's broker died (Kafka moves the group to
		// another one) the cached one would be asked for ever.
		_ = client.RefreshCoordinator(group)
		return nil, fmt.Errorf("committed offsets of %s: %w", group, err)
	}
	if resp.Err != sarama.ErrNoError && resp.Err != sarama.ErrGroupIDNotFound {
		return nil, fmt.Errorf("committed offsets of %s: %w", group, resp.Err)
	}
	for _, p := range parts {
		if b := resp.GetBlock(topic, p); b != nil {
			// A partition's own error (e.g. the group is loading) would
			// read as "nothing committed": a lag, a replay or a check
			// from the start.
			if b.Err != sarama.ErrNoError {
				return nil, fmt.Errorf("committed offset of %s on %s/%d: %w", group, topic, p, b.Err)
			}
			out[p] = b.Offset
		}
	}
	return out, nil
}
