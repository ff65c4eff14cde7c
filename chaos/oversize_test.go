//go:build chaos

package chaos_test

import (
	"bytes"
	"fmt"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/dev/loadgen"
)

// oversizeBytes is the size of each oversized value: larger than any
// producer limit billing had (16 MiB), valid JSON but not an event, and a
// few KB gzip-compressed, so the broker takes it.
const oversizeBytes = 17 << 20

// Oversized compressed values among the stream: each must be parked
// within seconds while the thousands of events around it are charged; a
// partition held by one of them would show as lag that never reaches 0.
func injectOversize(r *run) {
	rng := r.rng("oversize")
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_0_0_0
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Compression = sarama.CompressionGZIP
	cfg.Producer.MaxMessageBytes = 64 << 20
	producer, err := sarama.NewSyncProducer(strings.Split(r.brokers, ","), cfg)
	if err != nil {
		r.t.Errorf("oversize: producer: %v", err)
		return
	}
	defer producer.Close()
	for i, at := range moments(rng, 3, time.Second, r.stream.duration()-time.Second) {
		r.sleepUntil(at)
		key := []byte(fmt.Sprintf("oversize-%d", i))
		value := append(append([]byte(`{"pad":"`), bytes.Repeat([]byte{'a' + byte(i)}, oversizeBytes)...), `"}`...)
		p, off, err := producer.SendMessage(&sarama.ProducerMessage{Topic: r.topic, Key: sarama.ByteEncoder(key), Value: sarama.ByteEncoder(value)})
		if err != nil {
			r.t.Errorf("oversize: produce %d bytes gzip-compressed: %v", len(value), err)
			return
		}
		r.mu.Lock()
		r.extra = append(r.extra, &sent{kind: loadgen.Invalid, defect: "17 MiB value, gzip-compressed", key: key, value: value, partition: p, offset: off})
		r.mu.Unlock()
		r.fault("oversize", "%d-byte value (gzip-compressed) at %d/%d", len(value), p, off)
	}
	r.faultOver()
}
