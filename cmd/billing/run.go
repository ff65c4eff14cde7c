package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"example.com/billing/internal/config"
)

// version is stamped at build time with -ldflags "-X main.version=...".
var version = "dev"

// subcommand is one `billing <name>`: its entry in the usage and what runs
// it. Every command is registered in subcommands (those that ship) or in
// developerCommands (the developer build's), and nowhere else.
type subcommand struct {
	name    string
	aliases []string
	// synopsis is how the usage shows it, when not its name alone
	// (dlq replay).
	synopsis string
	// summary is its description in the usage; each line after the first
	// is indented as the first.
	summary string
	run     func(ctx context.Context, in invocation) error
}

// invocation is what a subcommand runs with: its arguments and the
// process's outside world.
type invocation struct {
	argv0          string   // how billing was started, for the hints a command prints
	args           []string // after the command's name
	environ        map[string]string
	stdin          io.Reader
	stdout, stderr io.Writer
}

// subcommands are the commands of the build that ships, in the order of
// the usage: the service and what its operators run.
func subcommands() []subcommand {
	return []subcommand{
		{name: "serve", summary: "consume order.confirmed.v1 events and charge them; serves /healthz, /readyz, /metrics,\n" +
			"and the provider's webhooks on WEBHOOK_ADDR",
			run: func(ctx context.Context, in invocation) error {
				return serve(ctx, in.args, in.environ, in.stdout, in.stderr)
			}},
		{name: "migrate", summary: "apply the embedded database migrations and exit (safe to run twice, and concurrently);\n" +
			"contract migrations wait for older releases to be replaced; migrate status says where it stands",
			run: func(ctx context.Context, in invocation) error {
				return migrate(ctx, in.args, in.environ, in.stdout, in.stderr)
			}},
		{name: "maintain", summary: "the tables' upkeep, once: partitions ahead and expired ones dropped, charge attempts left pending",
			run: func(ctx context.Context, in invocation) error {
				return maintain(ctx, in.args, in.environ, in.stdout, in.stderr)
			}},
		{name: "reconcile", summary: "compare the charge table with the provider's charges of a window; non-zero exit when they differ",
			run: func(ctx context.Context, in invocation) error {
				return reconcileCmd(ctx, in.args, in.environ, in.stdout, in.stderr)
			}},
		{name: "explain", summary: "one event's or order's whole story, from the database and Kafka: where it was read, its claim,\n" +
			"its charge attempts and the provider's answers, its outcome event, a DLQ parking, operator actions",
			run: func(ctx context.Context, in invocation) error {
				return explainCmd(ctx, in.args, in.environ, in.stdout, in.stderr)
			}},
		{name: "resolve", summary: "record a human's verdict on a charge attempt billing cannot settle (succeeded, declined, or\n" +
			"send it again), through billing's own settle",
			run: func(ctx context.Context, in invocation) error {
				return resolveCmd(ctx, in.args, in.environ, in.stdout, in.stderr)
			}},
		{name: "audit", summary: "list the operator actions recorded (who, why, what, when)",
			run: func(ctx context.Context, in invocation) error {
				return auditCmd(ctx, in.args, in.environ, in.stdout)
			}},
		{name: "dlq", synopsis: "dlq replay", summary: "republish parked dead-letter messages, unchanged, to the topic they came from",
			run: func(ctx context.Context, in invocation) error {
				return dlqCmd(ctx, in.args, in.environ, in.stdout, in.stderr)
			}},
		{name: "payment-methods", synopsis: "payment-methods import",
			summary: "upsert which saved payment method pays for each customer (CSV on stdin)",
			run: func(ctx context.Context, in invocation) error {
				return paymentMethodsCmd(ctx, in.args, in.environ, in.stdin, in.stdout, in.stderr)
			}},
		{name: "pause", summary: "stop charging on every replica of the group within 5s, without a rebalance\n" +
			"(--reason required; recorded with --by in operator_action)",
			run: func(ctx context.Context, in invocation) error {
				return pauseCmd(ctx, true, in.args, in.environ, in.stdout, in.stderr)
			}},
		{name: "resume", summary: "charge again after billing pause (--reason required)",
			run: func(ctx context.Context, in invocation) error {
				return pauseCmd(ctx, false, in.args, in.environ, in.stdout, in.stderr)
			}},
		{name: "version", aliases: []string{"--version", "-v"}, summary: "print the version (also --version, -v)",
			run: func(_ context.Context, in invocation) error { return versionCmd(in.args, in.stdout) }},
		{name: "help", aliases: []string{"-h", "--help"}, summary: "this text; billing help <command> describes a command",
			run: helpCmd},
	}
}

// developerNames names the developer commands (developerCommands) in the
// build that ships, which does not link them.
const developerNames = "demo, produce, devkafka, fakepsp"

// usage is billing's usage: the commands of this build.
func usage() string { return usageWith(developerCommands()) }

// usageWith is the usage of a build whose developer commands are dev:
// listed after the others, or, in the build that ships, where they are.
func usageWith(dev []subcommand) string {
	var b strings.Builder
	b.WriteString(`billing charges each confirmed order exactly once in effect.

Usage: billing <command> [flags]

Commands:
`)
	for _, c := range subcommands() {
		b.WriteString(c.usageEntry())
	}
	if len(dev) > 0 {
		b.WriteString("\nDeveloper commands (this developer build's; the build that ships has none):\n")
		for _, c := range dev {
			b.WriteString(c.usageEntry())
		}
	} else {
		b.WriteString("\nThis is the build that ships: the developer commands (" + developerNames + ")\n" +
			"are in the developer build, which make dev builds into bin/dev/billing.\n")
	}
	b.WriteString(`
'billing help <command>' or 'billing <command> -h' describes a command: its
flags, the environment variables it reads with their defaults, and an
example. docs/configuration.md lists every variable of every command.
`)
	return b.String()
}

// usageEntry is c's lines in the usage: its synopsis, then its summary
// from the 14th column, on a line of its own when the synopsis is longer
// than the column allows.
func (c subcommand) usageEntry() string {
	const column = 13
	indent := strings.Repeat(" ", column)
	shown := cmp.Or(c.synopsis, c.name)
	summary := strings.ReplaceAll(c.summary, "\n", "\n"+indent)
	if len(shown) > column-3 {
		return "  " + shown + "\n" + indent + summary + "\n"
	}
	return fmt.Sprintf("  %-*s %s\n", column-3, shown, summary)
}

// errUsage reports a command line that names no known command.
var errUsage = errors.New("usage: billing <command>; see billing help")

// run is billing's real main: it takes everything from the outside world as
// arguments, so that tests can run the whole binary in-process.
func run(ctx context.Context, args []string, environ map[string]string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) < 2 {
		fmt.Fprint(stderr, usage())
		return errUsage
	}
	name, dev := args[1], developerCommands()
	in := invocation{argv0: args[0], args: args[2:], environ: environ, stdin: stdin, stdout: stdout, stderr: stderr}
	for _, c := range append(subcommands(), dev...) {
		if c.name == name || slices.Contains(c.aliases, name) {
			return c.run(ctx, in)
		}
	}
	return unknownCommand(name, dev, stderr)
}

// unknownCommand is the error for a command this build lacks, after the
// usage; in the build that ships, a developer command's says where it is.
func unknownCommand(name string, dev []subcommand, stderr io.Writer) error {
	if len(dev) == 0 && slices.Contains(strings.Split(developerNames, ", "), name) {
		return fmt.Errorf("%s is a developer command, not in this build (the one that ships): "+
			"run bin/dev/billing %s after make dev, or go run -tags dev ./cmd/billing %s", name, name, name)
	}
	fmt.Fprint(stderr, usageWith(dev))
	return fmt.Errorf("unknown command %q", name)
}

// helpCmd prints the usage; billing help <command> is billing <command> -h.
func helpCmd(ctx context.Context, in invocation) error {
	if len(in.args) == 0 || in.args[0] == "help" {
		fmt.Fprint(in.stdout, usage())
		return nil
	}
	return run(ctx, append(append([]string{in.argv0}, in.args...), "-h"), in.environ, in.stdin, in.stdout, in.stderr)
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
