package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// version is stamped at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `billing charges each confirmed order exactly once in effect.

Usage: billing <command> [flags]

Commands:
  serve      consume order.confirmed.v1 events and charge them; serves /healthz, /readyz, /metrics
  migrate    apply the embedded database migrations and exit (safe to run twice, and concurrently)
  maintain   dedup-store retention: create processed_event partitions ahead, drop expired ones, exit
  demo       the whole pipeline on this machine (embedded broker, fake provider), then a summary
  produce    publish order.confirmed.v1 events: valid, duplicated and invalid, at a rate
  devkafka   an embedded Kafka-protocol broker for development (in memory, kfake; not Apache Kafka)
  fakepsp    a fake payment provider with idempotency and fault injection
  reconcile  compare the charge table with the provider's charges of a window; non-zero exit when they differ
  dlq replay republish parked dead-letter messages, unchanged, to the topic they came from
  version    print the version

Configuration comes from the environment; see README.md. demo, produce,
devkafka, fakepsp, reconcile and dlq replay describe their flags with -h.
`

// errUsage reports a command line that names no known command.
var errUsage = errors.New("usage: billing <command>; see billing help")

// run is billing's real main: it takes everything from the outside world as
// arguments, so that tests can run the whole binary in-process.
func run(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	if len(args) < 2 {
		fmt.Fprint(stderr, usage)
		return errUsage
	}
	cmd, rest := args[1], args[2:]
	switch cmd {
	case "serve":
		return serve(ctx, rest, environ, stderr)
	case "maintain":
		return maintain(ctx, rest, environ, stdout, stderr)
	case "migrate":
		return migrate(ctx, rest, environ, stderr)
	case "demo":
		return demoCmd(ctx, args[0], rest, environ, stdout)
	case "produce":
		return produceCmd(ctx, rest, environ, stdout)
	case "devkafka":
		return devkafkaCmd(ctx, rest, environ, stdout, stderr)
	case "fakepsp":
		return fakepspCmd(ctx, rest, environ, stdout, stderr)
	case "reconcile":
		return reconcileCmd(ctx, rest, environ, stdout, stderr)
	case "dlq":
		return dlqCmd(ctx, rest, environ, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, version)
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", cmd)
}

// newLogger returns a JSON logger at level, the format log pipelines parse.
func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}

// noArgs rejects positional arguments a command does not take.
func noArgs(cmd string, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("%s takes no arguments, got %s", cmd, strings.Join(args, " "))
	}
	return nil
}
