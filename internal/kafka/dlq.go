package kafka

import (
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/IBM/sarama"
)

// Dead-letter headers: why a message was parked and where it came from.
const (
	HeaderReason            = "x-dlq-reason"
	HeaderOriginalTopic     = "x-original-topic"
	HeaderOriginalPartition = "x-original-partition"
	HeaderOriginalOffset    = "x-original-offset"
	HeaderConsumerGroup     = "x-consumer-group"
)

// maxReason bounds x-dlq-reason: it is for a human, and must not make a
// parked message larger than the topic accepts.
const maxReason = 1024

// DLQ parks messages that cannot be processed as they are in the
// dead-letter topic, unchanged, with headers that say why.
type DLQ struct {
	producer  sarama.SyncProducer
	topic     string
	group     string
	closeOnce sync.Once
	closeErr  error
}

// NewDLQ returns a DLQ that writes to topic through producer, which must be
// idempotent and wait for all in-sync replicas (DLQProducerConfig).
func NewDLQ(producer sarama.SyncProducer, topic, group string) *DLQ {
	return &DLQ{producer: producer, topic: topic, group: group}
}

// Park writes m to the dead-letter topic and returns once the broker
// acknowledged it. Key, value and the original headers (trace context among
// them) are kept; dead-letter headers of an earlier parking are replaced.
func (d *DLQ) Park(m *sarama.ConsumerMessage, reason string) error {
	if len(reason) > maxReason {
		reason = strings.ToValidUTF8(reason[:maxReason], "")
	}
	headers := make([]sarama.RecordHeader, 0, len(m.Headers)+5)
	for _, h := range m.Headers {
		if h == nil || isDLQHeader(string(h.Key)) {
			continue
		}
		headers = append(headers, *h)
	}
	headers = append(headers,
		sarama.RecordHeader{Key: []byte(HeaderReason), Value: []byte(reason)},
		sarama.RecordHeader{Key: []byte(HeaderOriginalTopic), Value: []byte(m.Topic)},
		sarama.RecordHeader{Key: []byte(HeaderOriginalPartition), Value: []byte(strconv.FormatInt(int64(m.Partition), 10))},
		sarama.RecordHeader{Key: []byte(HeaderOriginalOffset), Value: []byte(strconv.FormatInt(m.Offset, 10))},
		sarama.RecordHeader{Key: []byte(HeaderConsumerGroup), Value: []byte(d.group)},
	)
	msg := &sarama.ProducerMessage{Topic: d.topic, Headers: headers, Timestamp: m.Timestamp}
	// nil stays nil: a tombstone is parked as a tombstone.
	if m.Key != nil {
		msg.Key = sarama.ByteEncoder(m.Key)
	}
	if m.Value != nil {
		msg.Value = sarama.ByteEncoder(m.Value)
	}
	if _, _, err := d.producer.SendMessage(msg); err != nil {
		return fmt.Errorf("park %s/%d@%d in %s: %w", m.Topic, m.Partition, m.Offset, d.topic, err)
	}
	return nil
}

// Close closes the producer.
// Close closes the producer, which fails a Park in progress; it may be
// called more than once.
func (d *DLQ) Close() error {
	d.closeOnce.Do(func() { d.closeErr = d.producer.Close() })
	return d.closeErr
}

func isDLQHeader(k string) bool {
	return k == HeaderReason || strings.HasPrefix(k, "x-original-") || k == HeaderConsumerGroup
}
