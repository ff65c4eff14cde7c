//go:build dev

package main

import (
	"context"
	"fmt"
	"io"

	"example.com/billing/internal/config"
	"example.com/billing/internal/dev/embeddedkafka"
)

const devkafkaHelp = `
Starts an embedded Kafka-protocol broker for local development: franz-go's
kfake, an in-memory development broker, not Apache Kafka (one process, no
replication, no quotas, listening on 127.0.0.1 only). billing and
'billing produce' reach it over TCP exactly as they reach Kafka.

It creates the order topic and its dead-letter topic (KAFKA_TOPIC and
KAFKA_DLQ_TOPIC) unless they exist. Everything is kept in memory and lost on exit, unless --data-dir
is given: then topics, messages and committed offsets survive a restart with
the same directory.

Runs until SIGINT or SIGTERM.`

// devkafkaCmd runs the embedded broker until ctx is done.
func devkafkaCmd(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	var k config.Topics
	fs := newFlagSet("devkafka", about{synopsis: "[flags]", description: devkafkaHelp, env: &k,
		example: "billing devkafka --data-dir .devkafka"})
	port := fs.Int("port", 9092, "port to listen on, on 127.0.0.1 (0 picks a free one)")
	partitions := fs.Int("partitions", 6, "partitions of each topic it creates")
	dataDir := fs.String("data-dir", "", "directory to persist topics, messages and committed offsets in (default: memory only)")
	if help, err := parseSubcommandFlags(fs, args, stdout); help || err != nil {
		return err
	}
	if *port < 0 || *port > 65535 {
		return fmt.Errorf("devkafka: --port %d is outside 0..65535", *port)
	}
	if *partitions < 1 || *partitions > 10000 {
		return fmt.Errorf("devkafka: --partitions %d is outside 1..10000", *partitions)
	}
	if err := config.Load(environ, &k); err != nil {
		return err
	}
	b, err := embeddedkafka.Start(embeddedkafka.Options{
		Port:       *port,
		Topics:     []string{k.Topic, k.DLQTopic, k.OutcomeTopic},
		Partitions: int32(*partitions),
		DataDir:    *dataDir,
	})
	if err != nil {
		return err
	}
	defer b.Close() // flushes the data dir
	kind, storage := "in-memory development broker", "in memory: everything is lost on exit"
	if *dataDir != "" {
		kind, storage = "development broker", "persisted in "+*dataDir
	}
	fmt.Fprintf(stdout, "devkafka listening on %s (%s, kfake; not Apache Kafka)\n", b.Addr(), kind)
	fmt.Fprintf(stdout, "topics %s, %s and %s (created with %d partitions unless they existed); %s\n", k.Topic, k.DLQTopic, k.OutcomeTopic, *partitions, storage)
	fmt.Fprintf(stdout, "use KAFKA_BROKERS=%s; Ctrl-C stops it\n", b.Addr())
	<-ctx.Done()
	fmt.Fprintln(stderr, "devkafka stopping")
	return nil
}
