package embeddedkafka

import (
	"context"
	"fmt"
	"time"

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
	var out []*sarama.ConsumerMessage
	for p, e := range end {
		start, err := client.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			return nil, fmt.Errorf("start offset of %s/%d: %w", topic, p, err)
		}
		msgs, err := ReadPartition(ctx, client, topic, p, start, e)
		if err != nil {
			return nil, err
		}
		out = append(out, msgs...)
	}
	return out, nil
}

// ReadPartition reads the records of partition p of topic from start up to
// end (exclusive) that client's isolation level hands out. Offsets have
// gaps (transaction markers, aborted records, compaction), and the last
// ones before end may be markers: when nothing arrives for a moment, a
// look past the last record read says whether only those remain.
func ReadPartition(ctx context.Context, client sarama.Client, topic string, p int32, start, end int64) ([]*sarama.ConsumerMessage, error) {
	if start >= end {
		return nil, nil // empty, or every message deleted by retention
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", topic, err)
	}
	defer consumer.Close()
	pc, err := consumer.ConsumePartition(topic, p, start)
	if err != nil {
		return nil, fmt.Errorf("read %s/%d: %w", topic, p, err)
	}
	defer pc.Close()
	var out []*sarama.ConsumerMessage
	next := start
	for next < end {
		select {
		case m := <-pc.Messages():
			if m.Offset < end {
				out = append(out, m)
			}
			next = m.Offset + 1
		case <-time.After(100 * time.Millisecond):
			if r, err := kafka.FirstReadable(client, topic, p, next); err == nil && r >= end {
				return out, nil
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("read %s/%d: at offset %d of %d: %w", topic, p, next, end, context.Cause(ctx))
		}
	}
	return out, nil
}
