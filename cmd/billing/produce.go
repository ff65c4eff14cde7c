//go:build dev

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/config"
	"example.com/billing/internal/dev/loadgen"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/kafkaacl"
	"example.com/billing/internal/tracing"
)

const produceHelp = `
Publishes order.confirmed.v1 events to KAFKA_TOPIC, keyed by order id, with
an idempotent producer that waits for all in-sync replicas (acks=all). It
reads the Kafka settings as serve does (it has no use for the group ones),
and the standard OTEL_* variables: with OTEL_EXPORTER_OTLP_ENDPOINT set,
each message carries the traceparent of its producer span.

The mix: --duplicates re-send earlier events byte for byte (some right
after, some much later); --invalid are values billing must reject and park
in the dead-letter topic (tombstone, bad JSON, string amount, UUID v4 event
id, unknown or lower-case currency, too many decimals, missing field,
negative amount, wrong event type, bad timestamp, oversize). Every fresh
event gets the next order id from --first-order on.

Prints one JSON line on stdout when done: produced, unique, duplicates,
invalid, firstOrder, lastOrder, elapsed.`

// produceSummary is the line produce prints.
type produceSummary struct {
	Topic      string  `json:"topic"`
	Produced   int     `json:"produced"`
	Unique     int     `json:"unique"`
	Duplicates int     `json:"duplicates"`
	Invalid    int     `json:"invalid"`
	FirstOrder int64   `json:"firstOrder"`
	LastOrder  int64   `json:"lastOrder"`
	Elapsed    string  `json:"elapsed"`
	Rate       float64 `json:"eventsPerSecond"`
}

// produceCmd publishes generated events.
func produceCmd(ctx context.Context, args []string, environ map[string]string, stdout io.Writer) error {
	var k config.Kafka
	fs := newFlagSet("produce", about{synopsis: "[flags]", description: produceHelp, env: &k,
		example: "KAFKA_BROKERS=127.0.0.1:9092 billing produce --count 5000 --rate 500 --duplicates 0.1 --invalid 0.02"})
	var opts loadgen.Options
	fs.IntVar(&opts.Count, "count", 1000, "messages to publish, duplicates and invalid ones included")
	rate := fs.Float64("rate", 0, "messages per second; 0 = as fast as possible")
	fs.Float64Var(&opts.Duplicates, "duplicates", 0.1, "share of messages that re-send an earlier event unchanged, in [0, 1]")
	fs.Float64Var(&opts.Invalid, "invalid", 0, "share of messages billing must reject, in [0, 1]")
	currencies := fs.String("currencies", strings.Join(loadgen.DefaultCurrencies, ","), "comma-separated ISO 4217 codes to draw amounts in")
	fs.Int64Var(&opts.FirstOrder, "first-order", 1, "order id of the first event")
	fs.Int64Var(&opts.Seed, "seed", 1, "seed of the mix (kinds, customers, amounts, currencies)")
	if help, err := parseSubcommandFlags(fs, args, stdout); help || err != nil {
		return err
	}
	if *rate < 0 {
		return errors.New("produce: --rate must not be negative")
	}
	if opts.FirstOrder < 1 {
		return errors.New("produce: --first-order must be positive")
	}
	for _, c := range strings.Split(*currencies, ",") {
		if c = strings.TrimSpace(c); c != "" {
			opts.Currencies = append(opts.Currencies, c)
		}
	}
	if len(opts.Currencies) == 0 {
		return errors.New("produce: --currencies is empty")
	}
	gen, err := loadgen.New(opts)
	if err != nil {
		return fmt.Errorf("produce: %w", err)
	}

	if err := config.Load(environ, &k); err != nil {
		return err
	}
	cfg, err := producerConfig(k)
	if err != nil {
		return err
	}
	// Tracing, off unless OTEL_EXPORTER_OTLP_ENDPOINT is set: each message
	// then carries the traceparent of its producer span.
	tp, stopTracing, err := tracing.NewProvider(ctx, environ, version)
	if err != nil {
		return err
	}
	defer stopTracing(context.WithoutCancel(ctx)) //nolint:errcheck // best effort on exit
	client, err := sarama.NewClient(k.Brokers, cfg)
	if err != nil {
		return fmt.Errorf("produce: connect to %s: %w", strings.Join(k.Brokers, ","), err)
	}
	defer client.Close()
	if err := kafkaacl.Require(client, k, kafkaacl.Produce(k)); err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	producer, err := sarama.NewAsyncProducerFromClient(client)
	if err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	res, err := loadgen.Publish(ctx, producer, gen, loadgen.PublishOptions{
		Topic: k.Topic, Rate: *rate, Tracer: tp.Tracer("example.com/billing/cmd/billing/produce"),
	})
	if cerr := producer.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("produce: close producer: %w", cerr)
	}
	if err != nil {
		return fmt.Errorf("produce: %d of %d messages acknowledged: %w", res.Produced, opts.Count, err)
	}
	exp := gen.Expected()
	sum := produceSummary{
		Topic:      k.Topic,
		Produced:   res.Produced,
		Unique:     exp.Unique,
		Duplicates: exp.Duplicates,
		Invalid:    exp.Invalid,
		FirstOrder: opts.FirstOrder,
		LastOrder:  exp.LastOrder,
		Elapsed:    res.Elapsed.Round(time.Millisecond).String(),
	}
	if s := res.Elapsed.Seconds(); s > 0 {
		sum.Rate = math.Round(float64(res.Produced)/s*10) / 10
	}
	line, err := json.Marshal(sum)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s\n", line)
	return err
}

// producerConfig is the configuration of produce's producer: billing's own
// producer settings (idempotent, acks=all, hash partitioner on the order-id
// key, TLS and SASL from k).
func producerConfig(k config.Kafka) (*sarama.Config, error) {
	return kafka.ProducerConfig(k)
}
