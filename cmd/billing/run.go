package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"example.com/billing/internal/config"
)

// version is stamped at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `billing charges each confirmed order exactly once in effect.

Usage: billing <command> [flags]

Commands:
  serve      consume order.confirmed.v1 events and charge them; serves /healthz, /readyz, /metrics,
             and the provider's webhooks on WEBHOOK_ADDR
  migrate    apply the embedded database migrations and exit (safe to run twice, and concurrently);
             contract migrations wait for older releases to be replaced; migrate status says where it stands
  maintain   the tables' upkeep, once: partitions ahead and expired ones dropped, charge attempts left pending
  demo       the whole pipeline on this machine (embedded broker, fake provider), then a summary
  produce    publish order.confirmed.v1 events: valid, duplicated and invalid, at a rate
  devkafka   an embedded Kafka-protocol broker for development (in memory, kfake; not Apache Kafka)
  fakepsp    a fake payment provider (billing's contract or Stripe's API) with idempotency, webhooks
             and fault injection
  reconcile  compare the charge table with the provider's charges of a window; non-zero exit when they differ
  explain    one event's or order's whole story, from the database and Kafka: where it was read, its claim,
             its charge attempts and the provider's answers, its outcome event, a DLQ parking, operator actions
  resolve    record a human's verdict on a charge attempt billing cannot settle (succeeded, declined, or
             send it again), through billing's own settle
  audit      list the operator actions recorded (who, why, what, when)
  dlq replay republish parked dead-letter messages, unchanged, to the topic they came from
  payment-methods import
             upsert which saved payment method pays for each customer (CSV on stdin)
  pause      stop charging on every replica of the group within 5s, without a rebalance
             (--reason required; recorded with --by in operator_action)
  resume     charge again after billing pause (--reason required)
  version    print the version (also --version, -v)
  help       this text; billing help <command> describes a command

'billing help <command>' or 'billing <command> -h' describes a command: its
flags, the environment variables it reads with their defaults, and an
example. docs/configuration.md lists every variable of every command.
`

// errUsage reports a command line that names no known command.
var errUsage = errors.New("usage: billing <command>; see billing help")

// run is billing's real main: it takes everything from the outside world as
// arguments, so that tests can run the whole binary in-process.
func run(ctx context.Context, args []string, environ map[string]string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) < 2 {
		fmt.Fprint(stderr, usage)
		return errUsage
	}
	cmd, rest := args[1], args[2:]
	switch cmd {
	case "serve":
		return serve(ctx, rest, environ, stdout, stderr)
	case "maintain":
		return maintain(ctx, rest, environ, stdout, stderr)
	case "migrate":
		return migrate(ctx, rest, environ, stdout, stderr)
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
	case "explain":
		return explainCmd(ctx, rest, environ, stdout, stderr)
	case "resolve":
		return resolveCmd(ctx, rest, environ, stdout, stderr)
	case "audit":
		return auditCmd(ctx, rest, environ, stdout)
	case "dlq":
		return dlqCmd(ctx, rest, environ, stdout, stderr)
	case "payment-methods":
		return paymentMethodsCmd(ctx, rest, environ, stdin, stdout, stderr)
	case "pause", "resume":
		return pauseCmd(ctx, cmd == "pause", rest, environ, stdout, stderr)
	case "version", "--version", "-v":
		return versionCmd(rest, stdout)
	case "help", "-h", "--help":
		if len(rest) == 0 || rest[0] == "help" {
			fmt.Fprint(stdout, usage)
			return nil
		}
		// billing help <command> is billing <command> -h.
		return run(ctx, append(append([]string{args[0]}, rest...), "-h"), environ, stdin, stdout, stderr)
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", cmd)
}

// versionCmd prints the version.
func versionCmd(args []string, stdout io.Writer) error {
	fs := newFlagSet("version", about{description: `
Prints the version of this binary: the git description it was built from
(make build stamps it), or "dev".`})
	if help, err := parseSubcommandFlags(fs, args, stdout); help || err != nil {
		return err
	}
	fmt.Fprintln(stdout, version)
	return nil
}

// newLogger returns a command's logger: JSON lines, the format log
// pipelines parse, or text for people (LOG_FORMAT), at LOG_LEVEL.
func newLogger(w io.Writer, c config.Log) *slog.Logger {
	opts := &slog.HandlerOptions{Level: c.Level, ReplaceAttr: durationAsText}
	if c.Format == config.LogText {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// durationAsText writes a time.Duration as text (1.36s) in every log line,
// whoever logged it: the JSON handler would write nanoseconds
// (1357137935), which nobody reads at a glance. It is the one place that
// does it, so that a new attribute cannot forget.
func durationAsText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(roughly(a.Value.Duration()).String())
	}
	return a
}

// roughly drops the digits of d that say nothing to a reader of a log:
// 1.357137935s becomes 1.36s, 12.3456ms 12.35ms; whole durations such as
// 168h stay as they are.
func roughly(d time.Duration) time.Duration {
	switch abs := d.Abs(); {
	case abs >= time.Second:
		return d.Round(10 * time.Millisecond)
	case abs >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	}
	return d
}
