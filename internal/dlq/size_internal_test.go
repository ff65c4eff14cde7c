package dlq

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/klauspost/compress/zstd"

	"example.com/billing/internal/config"
	"example.com/billing/internal/kafka"
)

// The Writer measures a large message as its producer will compress it:
// the same level, and the same size as sarama's encoder gives (its
// zstd.go), although it keeps no encoder between calls.
func TestCompressedSize_AsTheProducerCompresses(t *testing.T) {
	t.Parallel()
	cfg, err := ProducerConfig(config.Kafka{Brokers: []string{"127.0.0.1:9092"}, ClientID: "billing", Version: "3.6.0"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Producer.CompressionLevel != kafka.ZstdLevel {
		t.Fatalf("dead-letter producer at zstd level %d, want kafka.ZstdLevel %d", cfg.Producer.CompressionLevel, kafka.ZstdLevel)
	}
	sarama, err := zstd.NewWriter(nil, zstd.WithZeroFrames(true), zstd.WithEncoderLevel(zstd.EncoderLevelFromZstd(cfg.Producer.CompressionLevel)),
		zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	random := make([]byte, 1<<20)
	_, _ = rand.Read(random)
	for _, value := range [][]byte{
		bytes.Repeat([]byte(`{"pad":"aaaaaaaa"}`), 200_000), // 3.6 MB, compresses to almost nothing
		[]byte(hex.EncodeToString(random)),                  // 2 MB, hardly compresses
		[]byte(`{"small":true}`),
	} {
		if got, want := compressedSize(value), len(sarama.EncodeAll(value, nil)); got != want {
			t.Errorf("%d bytes: measured %d compressed, the producer's encoder gives %d", len(value), got, want)
		}
	}
}
