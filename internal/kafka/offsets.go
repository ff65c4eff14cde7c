package kafka

import (
	"errors"
	"fmt"

	"github.com/IBM/sarama"
)

// EndOffsets returns the high-water mark of every partition of topic, as
// the broker has it now.
func EndOffsets(client sarama.Client, topic string) (map[int32]int64, error) {
	if err := client.RefreshMetadata(topic); err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	parts, err := client.Partitions(topic)
	if err != nil {
		return nil, fmt.Errorf("partitions of %s: %w", topic, err)
	}
	out := make(map[int32]int64, len(parts))
	for _, p := range parts {
		if out[p], err = client.GetOffset(topic, p, sarama.OffsetNewest); err != nil {
			return nil, fmt.Errorf("end offset of %s/%d: %w", topic, p, err)
		}
	}
	return out, nil
}

// CommittedOffsets returns group's committed offset of every partition of
// topic, read from the broker: -1 where nothing is committed, also when the
// group has never committed at all.
func CommittedOffsets(client sarama.Client, group, topic string) (map[int32]int64, error) {
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
