//go:build dev

package main

import "context"

// developerCommands are the developer build's commands (the tag dev: make
// dev, make demo, make test): the demo, and the broker, provider and load
// it runs. They link franz-go's kfake, the fake provider, the load
// generator and an embedded PostgreSQL's downloader, which the build that
// ships leaves out with them (nodev.go; docs/deployment.md, "What ships").
func developerCommands() []subcommand {
	return []subcommand{
		{name: "demo", summary: "the whole pipeline on this machine (embedded broker, fake provider), then a summary",
			run: func(ctx context.Context, in invocation) error {
				return demoCmd(ctx, in.argv0, in.args, in.environ, in.stdout)
			}},
		{name: "produce", summary: "publish order.confirmed.v1 events: valid, duplicated and invalid, at a rate",
			run: func(ctx context.Context, in invocation) error {
				return produceCmd(ctx, in.args, in.environ, in.stdout)
			}},
		{name: "devkafka", summary: "an embedded Kafka-protocol broker for development (in memory, kfake; not Apache Kafka)",
			run: func(ctx context.Context, in invocation) error {
				return devkafkaCmd(ctx, in.args, in.environ, in.stdout, in.stderr)
			}},
		{name: "fakepsp", summary: "a fake payment provider (billing's contract, Stripe's or Adyen's API) with idempotency,\n" +
			"webhooks and fault injection",
			run: func(ctx context.Context, in invocation) error {
				return fakepspCmd(ctx, in.args, in.environ, in.stdout, in.stderr)
			}},
	}
}
