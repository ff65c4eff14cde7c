//go:build dev

package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"example.com/billing/internal/config"
)

// These tests cover every command's environment, the developer commands'
// too: they are the developer build's (make test builds it).

// envCommands are the commands configured by the environment and the
// configuration each of them loads: what their help lists, and what
// docs/configuration.md documents (see TestConfigurationReference).
var envCommands = []struct {
	args []string
	cfg  any
	// note is said about the command in docs/configuration.md, besides
	// its variables.
	note string
}{
	{[]string{"serve"}, &config.Serve{}, "Tracing is off unless `OTEL_EXPORTER_OTLP_ENDPOINT` is set; the OpenTelemetry SDK's standard `OTEL_*` variables apply (`OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`, `OTEL_EXPORTER_OTLP_HEADERS`, ...)."},
	{[]string{"migrate"}, &config.Migrate{}, ""},
	{[]string{"maintain"}, &config.Maintain{}, ""},
	{[]string{"demo"}, &demoConfig{}, developerNote + " The demo sets everything else itself: serve's variables from the environment are not used."},
	{[]string{"produce"}, &config.Kafka{}, developerNote + " With `OTEL_EXPORTER_OTLP_ENDPOINT` set, each message carries the traceparent of its producer span."},
	{[]string{"devkafka"}, &config.Topics{}, developerNote},
	{[]string{"fakepsp"}, &fakepspConfig{}, developerNote},
	{[]string{"reconcile"}, &reconcileConfig{}, ""},
	{[]string{"explain"}, &explainConfig{}, ""},
	{[]string{"resolve"}, &config.Resolve{}, ""},
	{[]string{"audit"}, &auditConfig{}, ""},
	{[]string{"dlq", "replay"}, &dlqConfig{}, ""},
	{[]string{"payment-methods", "import"}, &config.PaymentMethods{}, ""},
	{[]string{"pause"}, &config.Charging{}, ""},
	{[]string{"resume"}, &config.Charging{}, ""},
}

// developerNote is said of each developer command in
// docs/configuration.md.
const developerNote = "A developer command, in the developer build only (`make dev`; [what ships](deployment.md#what-ships))."

// envLine is a variable's first line in the help: NAME, NAME=default or
// NAME (required).
var envLine = regexp.MustCompile(`(?m)^  ([A-Z][A-Z0-9_]*)(=\S*| \(required\))?$`)

// TestHelp_ListsTheEnvironment: every command configured by the
// environment describes, with -h, --help and billing help <command>, every
// variable its configuration reads (and no other), with its default and
// meaning, and gives an example; without reading the environment or
// starting anything.
func TestHelp_ListsTheEnvironment(t *testing.T) {
	t.Parallel()
	for _, c := range envCommands {
		name := strings.Join(c.args, " ")
		for _, form := range [][]string{
			append(slices.Clone(c.args), "-h"),
			append(slices.Clone(c.args), "--help"),
			append([]string{"help"}, c.args...),
		} {
			t.Run(strings.Join(form, "_"), func(t *testing.T) {
				t.Parallel()
				out := runHelp(t, form...)
				if !strings.HasPrefix(out, "Usage: billing "+name) {
					t.Errorf("help does not start with the usage of billing %s:\n%s", name, out)
				}
				_, env, ok := strings.Cut(out, "\nEnvironment (NAME=default):\n")
				if !ok {
					t.Fatalf("help lists no environment:\n%s", out)
				}
				env, example, ok := strings.Cut(env, "\nExample:\n  ")
				if !ok || !strings.Contains(example, "billing "+name) {
					t.Errorf("help gives no example of billing %s:\n%s", name, out)
				}
				var listed []string
				for _, m := range envLine.FindAllStringSubmatch(env, -1) {
					listed = append(listed, m[1])
				}
				var want []string
				for _, v := range config.Vars(c.cfg) {
					want = append(want, v.Name)
					first := "  " + v.Name + "\n"
					switch {
					case v.Required:
						first = "  " + v.Name + " (required)\n"
					case v.Default != "":
						first = "  " + v.Name + "=" + v.Default + "\n"
					}
					if !strings.Contains(env, first+"    \t"+v.Help+"\n") {
						t.Errorf("help lacks %q followed by its meaning %q", strings.TrimSpace(first), v.Help)
					}
				}
				if !slices.Equal(listed, want) {
					t.Errorf("help lists %q, the configuration reads %q", listed, want)
				}
			})
		}
	}
}

// configurationReference is docs/configuration.md, relative to this
// package.
var configurationReference = filepath.Join("..", "..", "docs", "configuration.md")

// TestConfigurationReference fails when docs/configuration.md and the
// configuration structs disagree: a variable missing from either side, or
// another default or meaning. The file is generated from the structs: run
// this test with -update to rewrite it.
func TestConfigurationReference(t *testing.T) {
	t.Parallel()
	want := configurationMarkdown()
	if *update {
		if err := os.WriteFile(configurationReference, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(configurationReference)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s disagrees with the configuration structs; rewrite it with\n"+
			"  go test ./cmd/billing -run TestConfigurationReference -update\n%s",
			configurationReference, firstDifference(string(got), string(want)))
	}
}

// configurationMarkdown writes the configuration reference: every variable
// of every command configured by the environment, with its default and
// meaning, grouped by command.
func configurationMarkdown() []byte {
	var b bytes.Buffer
	b.WriteString(`# Configuration

<!-- Generated from the configuration structs (their env, envDefault and help
tags) by: go test ./cmd/billing -run TestConfigurationReference -update
Do not edit by hand: that test fails when this file and the structs disagree. -->

Every command reads its settings from the environment, once, at start. A
missing or bad value stops it with a message that names every variable at
fault. Secrets (` + "`PAYMENT_API_KEY`, `KAFKA_SASL_PASSWORD`, the password in\n`DATABASE_URL`" + `) are masked in logs and never reach metrics.
` + "`billing <command> -h`" + ` prints the same list for one command, with an
example.

`)
	for _, c := range envCommands {
		fmt.Fprintf(&b, "- [billing %s](#billing-%s)\n", strings.Join(c.args, " "), strings.Join(c.args, "-"))
	}
	for _, c := range envCommands {
		fmt.Fprintf(&b, "\n## billing %s\n\n", strings.Join(c.args, " "))
		if c.note != "" {
			b.WriteString(c.note + "\n\n")
		}
		b.WriteString("| variable | default | meaning |\n| --- | --- | --- |\n")
		for _, v := range config.Vars(c.cfg) {
			def := "—"
			switch {
			case v.Required:
				def = "required"
			case v.Default != "":
				def = "`" + v.Default + "`"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s |\n", v.Name, def, markdownText(v.Help))
		}
	}
	return b.Bytes()
}
