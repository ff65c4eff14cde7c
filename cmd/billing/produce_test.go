//go:build dev

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/config"
	"example.com/billing/internal/order"
	"example.com/billing/internal/testenv/kafkatest"
)

// runProduce runs `billing produce` to completion and returns its summary.
func runProduce(t *testing.T, b *kafkatest.Broker, args ...string) produceSummary {
	t.Helper()
	var stdout, stderr syncBuffer
	env := map[string]string{"KAFKA_BROKERS": b.Addr(), "KAFKA_TOPIC": b.Topic}
	if err := run(t.Context(), append([]string{"billing", "produce"}, args...), env, nil, &stdout, &stderr); err != nil {
		t.Fatalf("produce %v: %v\n%s", args, err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("produce printed %d lines, want one JSON line:\n%s", len(lines), stdout.String())
	}
	var sum produceSummary
	dec := json.NewDecoder(strings.NewReader(lines[0]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sum); err != nil {
		t.Fatalf("summary %q: %v", lines[0], err)
	}
	return sum
}

func TestProduce_PublishesTheMixItWasAskedFor(t *testing.T) {
	const partitions = 6
	broker := kafkatest.Start(t, partitions)
	sum := runProduce(t, broker, "--count", "400", "--duplicates", "0.1", "--invalid", "0.05",
		"--first-order", "5000", "--currencies", "EUR,JPY,KWD", "--seed", "9")

	// The summary: counts within rounding of the flags.
	if sum.Produced != 400 || sum.Duplicates != 40 || sum.Invalid != 20 || sum.Unique != 340 {
		t.Errorf("summary %+v: want 400 produced = 340 unique + 40 duplicates + 20 invalid", sum)
	}
	if sum.FirstOrder != 5000 || sum.LastOrder != 5000+340+20-1 {
		t.Errorf("summary orders %d..%d, want 5000..%d", sum.FirstOrder, sum.LastOrder, 5000+340+20-1)
	}

	client := kafkatest.Client(t, broker.Addr())
	msgs := kafkatest.ReadAll(t, client, broker.Topic)
	if len(msgs) != 400 {
		t.Fatalf("the topic holds %d messages, want 400", len(msgs))
	}
	hash := sarama.NewHashPartitioner(broker.Topic)
	seen := map[string]int{} // value → copies
	var valid, invalid int
	orders := map[int64]bool{}
	for _, m := range msgs {
		want, err := hash.Partition(&sarama.ProducerMessage{Key: sarama.ByteEncoder(m.Key)}, partitions)
		if err != nil {
			t.Fatal(err)
		}
		if m.Partition != want {
			t.Errorf("key %s on partition %d, the hash partitioner says %d", m.Key, m.Partition, want)
		}
		if _, err := strconv.ParseInt(string(m.Key), 10, 64); err != nil {
			t.Errorf("key %q is not an order id", m.Key)
		}
		ev, err := order.Parse(m.Value)
		var verr *order.ValidationError
		switch {
		case errors.As(err, &verr):
			invalid++
			continue
		case err != nil:
			t.Fatalf("Parse: %v", err)
		}
		valid++
		seen[string(m.Value)]++
		if string(m.Key) != strconv.FormatInt(ev.OrderID, 10) {
			t.Errorf("key %q, orderId %d", m.Key, ev.OrderID)
		}
		if ev.OrderID < 5000 || ev.OrderID > sum.LastOrder {
			t.Errorf("order %d outside 5000..%d", ev.OrderID, sum.LastOrder)
		}
		if c := ev.Amount.Currency; c != "EUR" && c != "JPY" && c != "KWD" {
			t.Errorf("currency %s was not asked for", c)
		}
		orders[ev.OrderID] = true
	}
	if invalid != 20 {
		t.Errorf("%d messages rejected by order.Parse, want 20", invalid)
	}
	// Duplicates are byte-identical copies: 340 distinct values carry 380
	// valid messages.
	if len(seen) != 340 || valid != 380 || len(orders) != 340 {
		t.Errorf("%d valid messages with %d distinct values for %d orders, want 380, 340, 340", valid, len(seen), len(orders))
	}
}

func TestProduce_ProducerIsIdempotentWithAcksAll(t *testing.T) {
	var k config.Kafka
	env := map[string]string{"KAFKA_BROKERS": "127.0.0.1:9092", "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
		"KAFKA_SASL_USERNAME": "billing", "KAFKA_SASL_PASSWORD": "secret"}
	if err := config.Load(env, &k); err != nil {
		t.Fatal(err)
	}
	cfg, err := producerConfig(k)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("sarama rejects the configuration: %v", err)
	}
	if !cfg.Producer.Idempotent || cfg.Producer.RequiredAcks != sarama.WaitForAll || cfg.Net.MaxOpenRequests != 1 {
		t.Errorf("idempotent %v, acks %v, max open requests %d: want true, WaitForAll, 1",
			cfg.Producer.Idempotent, cfg.Producer.RequiredAcks, cfg.Net.MaxOpenRequests)
	}
	if !cfg.Producer.Return.Successes || !cfg.Producer.Return.Errors {
		t.Error("the producer does not return successes and errors: acknowledgements cannot be counted")
	}
	if !cfg.Net.SASL.Enable || cfg.Net.SASL.Mechanism != sarama.SASLTypeSCRAMSHA512 || cfg.Net.SASL.User != "billing" {
		t.Errorf("SASL from the environment not applied: %+v", cfg.Net.SASL)
	}
	// The partitioner is the hash partitioner: the same key, the same
	// partition as sarama's.
	got, want := cfg.Producer.Partitioner("t"), sarama.NewHashPartitioner("t")
	for i := range 100 {
		m := &sarama.ProducerMessage{Key: sarama.StringEncoder(strconv.Itoa(i))}
		g, _ := got.Partition(m, 12)
		w, _ := want.Partition(m, 12)
		if g != w {
			t.Fatalf("key %d goes to partition %d, the hash partitioner says %d", i, g, w)
		}
	}
}

func TestProduce_RateLimitsThePublishing(t *testing.T) {
	broker := kafkatest.Start(t, 1)
	sum := runProduce(t, broker, "--count", "21", "--rate", "100", "--duplicates", "0")
	elapsed, err := time.ParseDuration(sum.Elapsed)
	if err != nil {
		t.Fatal(err)
	}
	// The 21st message is due 200ms after the first.
	if elapsed < 200*time.Millisecond || sum.Produced != 21 {
		t.Errorf("published %d in %s at --rate 100, want 21 in at least 200ms", sum.Produced, elapsed)
	}
	if sum.Rate > 105 || math.IsNaN(sum.Rate) {
		t.Errorf("summary rate %v exceeds --rate 100", sum.Rate)
	}
}

func TestProduce_RejectsBadInput(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"ErrRatiosAbove1", []string{"--duplicates", "0.7", "--invalid", "0.5"}, nil, "ratio"},
		{"ErrUnknownCurrency", []string{"--currencies", "EUR,ZZZ"}, nil, "ZZZ"},
		{"ErrNegativeRate", []string{"--rate", "-1"}, nil, "rate"},
		{"ErrFirstOrderZero", []string{"--first-order", "0"}, nil, "first-order"},
		{"ErrUnknownFlag", []string{"--decline-every", "3"}, nil, "decline-every"},
		{"ErrEmptyBrokers", nil, map[string]string{"KAFKA_BROKERS": ""}, "KAFKA_BROKERS"},
		{"ErrBadTopic", nil, map[string]string{"KAFKA_TOPIC": "a/b"}, "KAFKA_TOPIC"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			err := run(t.Context(), append([]string{"billing", "produce"}, tt.args...), tt.env, nil, &out, &out)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("produce %v returned %v, want an error naming %s", tt.args, err, tt.want)
			}
		})
	}
	var help bytes.Buffer
	if err := run(t.Context(), []string{"billing", "produce", "-h"}, nil, nil, &help, &help); err != nil {
		t.Fatalf("produce -h: %v", err)
	}
	for _, want := range []string{"-count", "-rate", "-duplicates", "-invalid", "-currencies", "-first-order", "-seed", "KAFKA_BROKERS"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("help lacks %q", want)
		}
	}
}
