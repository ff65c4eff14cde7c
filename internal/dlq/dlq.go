// Package dlq owns the dead-letter topic: parking a message that cannot be
// processed as it is (Writer and its headers; the reasons are in package
// reason), and replaying parked messages once what made them fail is fixed
// (Replay, `billing dlq replay`). Package consumer parks through a
// Writer, which counts what it parked.
package dlq

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/IBM/sarama"
	"github.com/klauspost/compress/zstd"

	"example.com/billing/internal/config"
	"example.com/billing/internal/dlq/reason"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/kafkaacl"
	"example.com/billing/internal/metrics"
)

// Dead-letter headers: why a message was parked and where it came from.
const (
	HeaderReason            = "x-dlq-reason"
	HeaderOriginalTopic     = "x-original-topic"
	HeaderOriginalPartition = "x-original-partition"
	HeaderOriginalOffset    = "x-original-offset"
	HeaderConsumerGroup     = "x-consumer-group"
)

// Headers of a record parked as a reference (reason code oversize): the
// original's size in bytes and the hex SHA-256 of its value, so that a
// replay can fetch it back from the source topic and check it.
const (
	HeaderOriginalSize   = "x-original-size"
	HeaderOriginalSHA256 = "x-original-sha256"
)

// Header returns the value of the first header of a record named key, or
// "" when there is none: how a parked record's headers above are read.
func Header(headers []*sarama.RecordHeader, key string) string {
	for _, h := range headers {
		if h != nil && string(h.Key) == key {
			return string(h.Value)
		}
	}
	return ""
}

// maxReason bounds x-dlq-reason: it is for a human, and must not make a
// parked message larger than the topic accepts.
const maxReason = 1024

// referencePrefix is how much of an oversized value a reference keeps: for
// a human to recognise it; the whole value stays in the source topic.
const referencePrefix = 1024

// recordOverhead is what a parked record adds to its key and value in the
// broker's accounting: the batch and record framing and the headers billing
// adds (a reason of up to maxReason bytes among them), rounded up.
const recordOverhead = 4096

// DefaultMaxRecordBytes is Kafka's default max.message.bytes, assumed
// when the dead-letter topic's own could not be read.
const DefaultMaxRecordBytes = 1048588

// Writer parks messages that cannot be processed as they are in the
// dead-letter topic, unchanged, with headers that say why.
//
// It parks every message the source topic accepted: a record that fits the
// dead-letter topic's max.message.bytes once compressed is parked whole; a
// larger one (a value that compressed well on the way in, then was
// rejected, can be many times the topic's limit) is parked as a reference,
// with the original's position, size and SHA-256 and its first bytes, which
// `billing dlq replay` resolves from the source topic. Retrying a message
// that cannot fit would hold its partition for ever.
type Writer struct {
	producer sarama.SyncProducer
	topic    string
	group    string
	// maxRecord is the dead-letter topic's max.message.bytes: the largest
	// compressed batch the broker takes. maxWhole is the producer's
	// Producer.MaxMessageBytes, which sarama checks against the
	// uncompressed size.
	maxRecord, maxWhole int
	metrics             *metrics.Metrics
	closeOnce           sync.Once
	closeErr            error
}

// NewWriter returns a Writer that writes to topic through producer, which must be
// idempotent, wait for all in-sync replicas and compress with zstd at
// kafka.ZstdLevel (ProducerConfig). maxRecordBytes is the topic's
// max.message.bytes (DescribeTopic); 0 assumes DefaultMaxRecordBytes. It counts what it
// parked in m.
func NewWriter(producer sarama.SyncProducer, topic, group string, maxRecordBytes int, m *metrics.Metrics) *Writer {
	if maxRecordBytes <= 0 {
		maxRecordBytes = DefaultMaxRecordBytes
	}
	return &Writer{producer: producer, topic: topic, group: group,
		maxRecord: maxRecordBytes, maxWhole: maxMessageBytes, metrics: m}
}

// Park writes m to the dead-letter topic and returns once the broker
// acknowledged it, with the reason it was parked under: why's, or an
// Oversize one that says why when only a reference fits. Key, value and
// the original headers (trace context among them) are kept; dead-letter
// headers of an earlier parking are replaced.
//
// The message is counted once parked, as billing_events_total's
// outcome "invalid" and in billing_dlq_messages_total by code; a write the
// broker refused is counted as a retry (cause dlq): the caller tries again
// later, never skips it.
func (d *Writer) Park(m *sarama.ConsumerMessage, why reason.Reason) (reason.Reason, error) {
	parked, err := d.park(m, why)
	if err != nil {
		d.metrics.Retries.WithLabelValues("dlq").Inc()
		return parked, err
	}
	d.metrics.Events.WithLabelValues(metrics.OutcomeInvalid).Inc()
	d.metrics.DLQ.WithLabelValues(string(parked.Code)).Inc()
	return parked, nil
}

func (d *Writer) park(m *sarama.ConsumerMessage, why reason.Reason) (reason.Reason, error) {
	if d.fits(m) {
		_, _, err := d.producer.SendMessage(d.whole(m, why))
		if err == nil {
			return why, nil
		}
		if !tooLarge(err) {
			return why, fmt.Errorf("park %s/%d@%d in %s: %w", m.Topic, m.Partition, m.Offset, d.topic, d.denied(err))
		}
		// The estimate was short: the broker's answer is what counts.
	}
	ref := d.referenceReason(m, why)
	if _, _, err := d.producer.SendMessage(d.reference(m, ref)); err != nil {
		return why, fmt.Errorf("park a reference to %s/%d@%d in %s: %w", m.Topic, m.Partition, m.Offset, d.topic, d.denied(err))
	}
	return ref, nil
}

// denied names the ACL a refused write lacked.
func (d *Writer) denied(err error) error {
	return kafkaacl.NameDenied(err, "Write on Topic "+d.topic, "")
}

// fits reports whether m, compressed, fits the dead-letter topic whole.
// Only a message near or above the limit is compressed to find out.
func (d *Writer) fits(m *sarama.ConsumerMessage) bool {
	raw := len(m.Key) + len(m.Value) + headersSize(m.Headers)
	switch {
	case raw+recordOverhead <= d.maxRecord:
		return true
	case raw+recordOverhead > d.maxWhole:
		return false
	}
	return len(m.Key)+compressedSize(m.Value)+headersSize(m.Headers)+recordOverhead <= d.maxRecord
}

// compressedSize is how large value becomes compressed as the producer
// compresses it (zstd at kafka.ZstdLevel). The encoder lives for the call:
// only a message above the topic's limit is measured, and for one that
// large the encoder grows a history buffer of megabytes (8.6 MB at a 64 KiB
// block and more) that a Writer keeping it would hold for the life of the
// process; it was also 0.5 MB of tables from the start.
func compressedSize(value []byte) int {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.EncoderLevelFromZstd(kafka.ZstdLevel)),
		zstd.WithEncoderConcurrency(1), zstd.WithLowerEncoderMem(true))
	if err != nil {
		panic(err) // only for invalid options, which these are not
	}
	defer enc.Close()
	return len(enc.EncodeAll(value, nil))
}

// whole is m as it is, with the dead-letter headers.
func (d *Writer) whole(m *sarama.ConsumerMessage, why reason.Reason) *sarama.ProducerMessage {
	msg := &sarama.ProducerMessage{Topic: d.topic, Headers: d.headers(m, m.Headers, why), Timestamp: m.Timestamp}
	setBody(msg, m.Key, m.Value)
	return msg
}

// referenceReason is the reason of a reference to m, parked for why.
func (d *Writer) referenceReason(m *sarama.ConsumerMessage, why reason.Reason) reason.Reason {
	return reason.Reason{Code: reason.Oversize, Detail: fmt.Sprintf("the message (%d bytes) exceeds the dead-letter topic's max.message.bytes (%d) even compressed: parked as a reference; `billing dlq replay` republishes the original from %s/%d@%d while that topic retains it. Parked for: %s",
		len(m.Key)+len(m.Value)+headersSize(m.Headers), d.maxRecord, m.Topic, m.Partition, m.Offset, why)}
}

// reference is a record that stands for m: the dead-letter headers with
// ref (reason code oversize), the original's size and SHA-256, and the
// first referencePrefix bytes of its value. Key and original headers are
// kept when they are small, as they are in every message billing can
// decode.
func (d *Writer) reference(m *sarama.ConsumerMessage, ref reason.Reason) *sarama.ProducerMessage {
	sum := sha256.Sum256(m.Value)
	var original []*sarama.RecordHeader
	if headersSize(m.Headers) <= referencePrefix {
		original = m.Headers
	}
	headers := append(d.headers(m, original, ref),
		sarama.RecordHeader{Key: []byte(HeaderOriginalSize), Value: []byte(strconv.Itoa(len(m.Value)))},
		sarama.RecordHeader{Key: []byte(HeaderOriginalSHA256), Value: []byte(hex.EncodeToString(sum[:]))},
	)
	msg := &sarama.ProducerMessage{Topic: d.topic, Headers: headers, Timestamp: m.Timestamp,
		Value: sarama.ByteEncoder(m.Value[:min(len(m.Value), referencePrefix)])}
	if m.Key != nil && len(m.Key) <= referencePrefix {
		msg.Key = sarama.ByteEncoder(m.Key)
	}
	return msg
}

// headers are the original headers without dead-letter ones of an earlier
// parking, then the contract's dead-letter headers.
func (d *Writer) headers(m *sarama.ConsumerMessage, original []*sarama.RecordHeader, why reason.Reason) []sarama.RecordHeader {
	text := why.String()
	if len(text) > maxReason {
		text = strings.ToValidUTF8(text[:maxReason], "")
	}
	return append(keptHeaders(original, isDLQHeader, 7),
		sarama.RecordHeader{Key: []byte(HeaderReason), Value: []byte(text)},
		sarama.RecordHeader{Key: []byte(HeaderOriginalTopic), Value: []byte(m.Topic)},
		sarama.RecordHeader{Key: []byte(HeaderOriginalPartition), Value: []byte(strconv.FormatInt(int64(m.Partition), 10))},
		sarama.RecordHeader{Key: []byte(HeaderOriginalOffset), Value: []byte(strconv.FormatInt(m.Offset, 10))},
		sarama.RecordHeader{Key: []byte(HeaderConsumerGroup), Value: []byte(d.group)},
	)
}

// keptHeaders copies hs without nil entries and the headers drop names,
// with room for extra more.
func keptHeaders(hs []*sarama.RecordHeader, drop func(key string) bool, extra int) []sarama.RecordHeader {
	out := make([]sarama.RecordHeader, 0, len(hs)+extra)
	for _, h := range hs {
		if h != nil && !drop(string(h.Key)) {
			out = append(out, *h)
		}
	}
	return out
}

// setBody sets pm's key and value. nil stays nil: a tombstone is parked,
// and republished, as a tombstone, and a message without a key keeps none.
func setBody(pm *sarama.ProducerMessage, key, value []byte) {
	if key != nil {
		pm.Key = sarama.ByteEncoder(key)
	}
	if value != nil {
		pm.Value = sarama.ByteEncoder(value)
	}
}

func headersSize(hs []*sarama.RecordHeader) int {
	n := 0
	for _, h := range hs {
		if h != nil {
			n += len(h.Key) + len(h.Value)
		}
	}
	return n
}

// tooLarge reports whether err says the record is too large: sarama's own
// check of the uncompressed size, or the broker's of the compressed batch.
func tooLarge(err error) bool {
	var ce sarama.ConfigurationError
	return errors.Is(err, sarama.ErrMessageSizeTooLarge) || errors.Is(err, sarama.ErrInvalidRecord) ||
		(errors.As(err, &ce) && strings.Contains(string(ce), "MaxMessageBytes"))
}

// Close closes the producer, which fails a Park in progress; it may be
// called more than once.
func (d *Writer) Close() error {
	d.closeOnce.Do(func() { d.closeErr = d.producer.Close() })
	return d.closeErr
}

func isDLQHeader(k string) bool {
	return k == HeaderReason || strings.HasPrefix(k, "x-original-") || k == HeaderConsumerGroup
}

// maxMessageBytes is the dead-letter producer's Producer.MaxMessageBytes,
// which sarama compares with a record's uncompressed size. A record above it
// is parked as a reference (see Writer); below it, whether it fits is up to
// the dead-letter topic's max.message.bytes and the compression.
const maxMessageBytes = 64 << 20

// ProducerConfig is kafka.ProducerConfig for moving messages in and out of the
// dead-letter topic. It must be able to park any message the source topic
// accepted, or that partition would stall: sarama's own default of
// 1,000,000 bytes is below Kafka's default max.message.bytes, and a value
// that compressed well can be far larger than the topic's limit
// uncompressed. (A general producer keeps sarama's limit: it also caps the
// size of a batch, and a consumer holds a whole fetched batch in memory.)
func ProducerConfig(k config.Kafka) (*sarama.Config, error) {
	cfg, err := kafka.ProducerConfig(k)
	if err != nil {
		return nil, err
	}
	cfg.Producer.MaxMessageBytes = maxMessageBytes
	cfg.Producer.CompressionLevel = kafka.ZstdLevel
	return cfg, nil
}
