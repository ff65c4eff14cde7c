package kafka

import (
	"strconv"

	"github.com/IBM/sarama"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

// ConsumerHeaders reads trace context from a consumed record's headers:
// the consumer (package consumer) extracts the producer's span context
// through it, to parent a message's processing span.
type ConsumerHeaders []*sarama.RecordHeader

// Get implements propagation.TextMapCarrier.
func (h ConsumerHeaders) Get(key string) string {
	for _, r := range h {
		if r != nil && string(r.Key) == key {
			return string(r.Value)
		}
	}
	return ""
}

// Set implements propagation.TextMapCarrier: a consumed record is not
// written to.
func (ConsumerHeaders) Set(string, string) {}

// Keys implements propagation.TextMapCarrier.
func (h ConsumerHeaders) Keys() []string {
	keys := make([]string, 0, len(h))
	for _, r := range h {
		if r != nil {
			keys = append(keys, string(r.Key))
		}
	}
	return keys
}

// ProducerHeaders writes trace context into a record about to be produced.
type ProducerHeaders struct{ Msg *sarama.ProducerMessage }

// Get implements propagation.TextMapCarrier.
func (h ProducerHeaders) Get(key string) string {
	for _, r := range h.Msg.Headers {
		if string(r.Key) == key {
			return string(r.Value)
		}
	}
	return ""
}

// Set implements propagation.TextMapCarrier.
func (h ProducerHeaders) Set(key, value string) {
	h.Msg.Headers = append(h.Msg.Headers, sarama.RecordHeader{Key: []byte(key), Value: []byte(value)})
}

// Keys implements propagation.TextMapCarrier.
func (h ProducerHeaders) Keys() []string {
	keys := make([]string, len(h.Msg.Headers))
	for i, r := range h.Msg.Headers {
		keys[i] = string(r.Key)
	}
	return keys
}

// MessageAttributes are the OpenTelemetry messaging attributes of a
// consumed record, read by group: the attributes of the consumer's
// processing span (package consumer).
func MessageAttributes(m *sarama.ConsumerMessage, group string) []attribute.KeyValue {
	return []attribute.KeyValue{
		semconv.MessagingSystemKafka,
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingDestinationName(m.Topic),
		semconv.MessagingDestinationPartitionID(strconv.FormatInt(int64(m.Partition), 10)),
		semconv.MessagingKafkaOffset(int(m.Offset)),
		semconv.MessagingConsumerGroupName(group),
		semconv.MessagingMessageBodySize(len(m.Value)),
	}
}
