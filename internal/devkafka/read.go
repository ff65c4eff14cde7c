package devkafka

import (
	"context"
	"fmt"

	"github.com/IBM/sarama"

	"example.com/billing/internal/kafka"
)

// ReadTopic reads every message of topic that exists now, on any broker
// (this package's or Apache Kafka): from each partition's oldest retained
// offset to its end offset at the call. It is for the demo's summary and
// the tests' checks, which read a whole small topic; a partition that
// stops delivering before its end fails the read when ctx ends.
func ReadTopic(ctx context.Context, client sarama.Client, topic string) ([]*sarama.ConsumerMessage, error) {
	end, err := kafka.EndOffsets(client, topic)
	if err != nil {
		return nil, err
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", topic, err)
	}
	defer consumer.Close()
	var out []*sarama.ConsumerMessage
	for p, e := range end {
		start, err := client.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			return nil, fmt.Errorf("start offset of %s/%d: %w", topic, p, err)
		}
		if start >= e {
			continue // empty, or every message deleted by retention
		}
		msgs, err := readPartition(ctx, consumer, topic, p, start, e)
		if err != nil {
			return nil, err
		}
		out = append(out, msgs...)
	}
	return out, nil
}

// readPartition reads partition p of topic from start until the message
// before end. Offsets can have gaps (transaction markers, compaction), so
// it stops at the first message at or past end-1.
func readPartition(ctx context.Context, consumer sarama.Consumer, topic string, p int32, start, end int64) ([]*sarama.ConsumerMessage, error) {
	pc, err := consumer.ConsumePartition(topic, p, start)
	if err != nil {
		return nil, fmt.Errorf("read %s/%d: %w", topic, p, err)
	}
	defer pc.Close()
	var out []*sarama.ConsumerMessage
	for {
		select {
		case m := <-pc.Messages():
			out = append(out, m)
			if m.Offset+1 >= end {
				return out, nil
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("read %s/%d: at offset %d of %d: %w", topic, p, start+int64(len(out)), end, context.Cause(ctx))
		}
	}
}
