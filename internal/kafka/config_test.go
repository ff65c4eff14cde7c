package kafka_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/IBM/sarama"
	"github.com/klauspost/compress/zstd"

	"example.com/billing/internal/config"
	"example.com/billing/internal/kafka"
)

// saramaEncoder is the zstd encoder sarama makes for a compression level
// (its zstd.go).
func saramaEncoder(t *testing.T, level int) *zstd.Encoder {
	t.Helper()
	enc, err := zstd.NewWriter(nil, zstd.WithZeroFrames(true), zstd.WithEncoderLevel(zstd.EncoderLevelFromZstd(level)),
		zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	return enc
}

// outcomes is n bytes of payment outcome events, as the relay sends them.
func outcomes(n int) []byte {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, `{"eventId":"01907a4e-8d2c-7b3a-9f1e-%012x","eventType":"payment.succeeded.v1","occurredAt":"2026-12-04T18:00:%02d.%03dZ","causationId":"01907a4e-8d2c-7b3a-9f1e-%012x","orderId":%d,"customerId":%d,"totalAmount":%d.%02d,"currency":"EUR","providerChargeId":"ch_%x"}`,
			i*7919, i%60, i%1000, i*104729, 1000000+i*31, i*17%100000, i%500, i%100, i*2654435761)
	}
	return []byte(b.String()[:n])
}

// An outcome batch is compressed in one zstd block: the encoder then keeps
// no history, which would hold megabytes for the life of the process (see
// kafka.ZstdLevel). A larger batch takes several blocks, which is what the
// bound prevents.
func TestOutcomeProducerConfig_BatchesFitOneZstdBlock(t *testing.T) {
	t.Parallel()
	cfg, err := kafka.OutcomeProducerConfig(config.Kafka{Brokers: []string{"127.0.0.1:9092"}, ClientID: "billing", Version: "3.6.0"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Producer.Compression != sarama.CompressionZSTD || cfg.Producer.CompressionLevel != kafka.ZstdLevel ||
		cfg.Producer.MaxMessageBytes != kafka.OutcomeBatchBytes {
		t.Errorf("outcome producer: %s level %d, batches of %d bytes; want zstd level %d, %d", cfg.Producer.Compression,
			cfg.Producer.CompressionLevel, cfg.Producer.MaxMessageBytes, kafka.ZstdLevel, kafka.OutcomeBatchBytes)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("sarama refuses the outcome producer's configuration: %v", err)
	}
	enc := saramaEncoder(t, cfg.Producer.CompressionLevel)
	for _, tc := range []struct {
		bytes    int
		oneBlock bool
	}{{kafka.OutcomeBatchBytes, true}, {4 * kafka.OutcomeBatchBytes, false}} {
		var h zstd.Header
		if err := h.Decode(enc.EncodeAll(outcomes(tc.bytes), nil)); err != nil {
			t.Fatal(err)
		}
		if h.FirstBlock.Last != tc.oneBlock {
			t.Errorf("%d bytes of outcomes: in one block %v, want %v", tc.bytes, h.FirstBlock.Last, tc.oneBlock)
		}
	}
}
