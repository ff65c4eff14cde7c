package main

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"

	"github.com/IBM/sarama"

	"example.com/billing/internal/dlq"
	"example.com/billing/internal/testenv/kafkatest"
)

// produceCompressed writes value to partition 0 of the order topic
// gzip-compressed, as a producer whose batch compressed far below the
// topic's max.message.bytes may: the broker takes what it would refuse
// uncompressed.
func (h *harness) produceCompressed(key string, value []byte) {
	h.t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_0_0_0
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Producer.Compression = sarama.CompressionGZIP
	cfg.Producer.MaxMessageBytes = 64 << 20
	p, err := sarama.NewSyncProducer(strings.Split(h.broker.Addr(), ","), cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	defer p.Close()
	if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: h.broker.Topic, Partition: 0,
		Key: sarama.StringEncoder(key), Value: sarama.ByteEncoder(value)}); err != nil {
		h.t.Fatalf("produce %d bytes gzip-compressed: %v", len(value), err)
	}
}

// jsonOf is a JSON object of about n bytes that is not an event: valid
// JSON, so only the decoder's size limit rejects it. filler makes the
// padding: repeated (compresses to almost nothing) or random (hardly).
func jsonOf(n int, random bool) []byte {
	pad := bytes.Repeat([]byte("a"), n/2*2)
	if random {
		raw := make([]byte, n/2)
		_, _ = rand.Read(raw)
		pad = []byte(hex.EncodeToString(raw))
	}
	return append(append([]byte(`{"pad":"`), pad...), `"}`...)
}

// A 17 MiB value, gzip-compressed to a few KB on the wire, is larger than
// any limit of the dead-letter producer uncompressed. It must be parked
// (whole: compressed it fits the dead-letter topic) within seconds, and
// the events behind it in its partition charged; before, the producer
// refused it and the partition stalled for good.
func TestOversize_CompressedValueIsParkedWhole(t *testing.T) {
	h := newHarness(t, 1)
	s := h.serve(h.environ())
	big := jsonOf(17<<20, false)
	h.produceCompressed("big", big)
	_, after := event(t, 7, 700, "EUR")
	h.publish(0, "7", after)
	h.waitCaughtUp()

	parked := kafkatest.ReadAll(t, h.client, h.broker.DLQTopic)
	if len(parked) != 1 {
		t.Fatalf("DLQ holds %d messages, want 1", len(parked))
	}
	reason := kafkatest.Header(parked[0], dlq.HeaderReason)
	if !strings.HasPrefix(reason, "invalid-event: ") || !bytes.Equal(parked[0].Value, big) {
		t.Errorf("parked %q with %d bytes, want invalid-event: ... with the whole %d-byte value", reason, len(parked[0].Value), len(big))
	}
	if got := h.count(`SELECT count(*) FROM charge WHERE order_id = 7 AND status = 'succeeded'`); got != 1 {
		t.Errorf("order 7 behind it: %d succeeded charges, want 1", got)
	}
	if got := s.metric(t, `billing_dlq_messages_total{reason="invalid-event"}`); got != 1 {
		t.Errorf(`billing_dlq_messages_total{reason="invalid-event"} = %v, want 1`, got)
	}
	if got := s.metric(t, `billing_retries_total{cause="dlq"}`); got != 0 {
		t.Errorf(`billing_retries_total{cause="dlq"} = %v, want 0`, got)
	}
}

// A message that does not fit the dead-letter topic even compressed (here
// the dead-letter topic takes 64 KiB, the order topic 1 MiB, and the value
// is 400 KB of random hex, about 200 KB compressed) is parked as a
// reference, reason oversize; `billing dlq replay` republishes the
// original from the order topic, and says so when the original is gone.
func TestOversize_ParkedAsReferenceAndReplayed(t *testing.T) {
	h := newHarness(t, 1, kafkatest.DLQConfig(map[string]string{"max.message.bytes": "65536"}))
	env := h.environ()
	s := h.serve(env)
	big := jsonOf(400_000, true)
	h.produceCompressed("big", big)
	h.waitCaughtUp()

	parked := kafkatest.ReadAll(t, h.client, h.broker.DLQTopic)
	if len(parked) != 1 {
		t.Fatalf("DLQ holds %d messages, want 1", len(parked))
	}
	ref := parked[0]
	sum := sha256.Sum256(big)
	reason := kafkatest.Header(ref, dlq.HeaderReason)
	if !strings.HasPrefix(reason, "oversize: ") || !strings.Contains(reason, "invalid-event: ") {
		t.Errorf("x-dlq-reason %q, want oversize: ... invalid-event: ...", reason)
	}
	if got := kafkatest.Header(ref, dlq.HeaderOriginalSize); got != strconv.Itoa(len(big)) {
		t.Errorf("x-original-size %q, want %d", got, len(big))
	}
	if got := kafkatest.Header(ref, dlq.HeaderOriginalSHA256); got != hex.EncodeToString(sum[:]) {
		t.Errorf("x-original-sha256 %q, want the value's", got)
	}
	if !bytes.Equal(ref.Value, big[:1024]) || string(ref.Key) != "big" {
		t.Errorf("reference holds %d bytes and key %q, want the first 1024 bytes and key big", len(ref.Value), ref.Key)
	}
	if got := s.metric(t, `billing_dlq_messages_total{reason="oversize"}`); got != 1 {
		t.Errorf(`billing_dlq_messages_total{reason="oversize"} = %v, want 1`, got)
	}
	s.stop(t)

	// Replay: the original comes back from the order topic, whole.
	out := dlqReplay(t, env, "--group", "replay-1")
	if !strings.Contains(out, "replayed 1,") {
		t.Errorf("replay output lacks 'replayed 1,':\n%s", out)
	}
	msgs := kafkatest.ReadAll(t, h.client, h.broker.Topic)
	last := msgs[len(msgs)-1]
	if len(msgs) != 2 || !bytes.Equal(last.Value, big) || kafkatest.Header(last, dlq.HeaderReplayedFrom) == "" {
		t.Fatalf("order topic holds %d messages, the last of %d bytes (replayed-from %q); want the original republished",
			len(msgs), len(last.Value), kafkatest.Header(last, dlq.HeaderReplayedFrom))
	}

	// Once retention removed the original, a replay says it is gone.
	admin, err := sarama.NewClusterAdminFromClient(h.client)
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.DeleteRecords(h.broker.Topic, map[int32]int64{0: 2}); err != nil {
		t.Fatalf("delete records: %v", err)
	}
	out = dlqReplay(t, env, "--group", "replay-2")
	if !strings.Contains(out, "is gone") || !strings.Contains(out, "1 parked as references (oversize) could not be replayed") {
		t.Errorf("replay of a reference whose original is gone:\n%s\nwant it reported gone", out)
	}
	if got := len(kafkatest.ReadAll(t, h.client, h.broker.Topic)); got != 0 {
		t.Errorf("order topic holds %d messages after a replay of a gone original, want 0 (nothing republished)", got)
	}
}
