package main

import (
	"bytes"
	"cmp"
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"

	"example.com/billing/internal/config"
)

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
	{[]string{"demo"}, &demoConfig{}, "The demo sets everything else itself: serve's variables from the environment are not used."},
	{[]string{"produce"}, &config.Kafka{}, "With `OTEL_EXPORTER_OTLP_ENDPOINT` set, each message carries the traceparent of its producer span."},
	{[]string{"devkafka"}, &config.Topics{}, ""},
	{[]string{"fakepsp"}, &fakepspConfig{}, ""},
	{[]string{"reconcile"}, &reconcileConfig{}, ""},
	{[]string{"explain"}, &explainConfig{}, ""},
	{[]string{"resolve"}, &config.Resolve{}, ""},
	{[]string{"audit"}, &auditConfig{}, ""},
	{[]string{"dlq", "replay"}, &dlqConfig{}, ""},
	{[]string{"payment-methods", "import"}, &config.PaymentMethods{}, ""},
	{[]string{"pause"}, &config.Charging{}, ""},
	{[]string{"resume"}, &config.Charging{}, ""},
}

// runHelp runs billing with args and returns what it printed on stdout,
// failing the test when it fails or prints on stderr.
func runHelp(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), append([]string{"billing"}, args...), map[string]string{}, nil, &stdout, &stderr); err != nil {
		t.Fatalf("billing %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	if stderr.Len() > 0 {
		t.Errorf("billing %s wrote on stderr:\n%s", strings.Join(args, " "), stderr.String())
	}
	return stdout.String()
}

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

func TestHelp_Commands(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"OK_Help", []string{"help"}, usage()},
		{"OK_DashH", []string{"-h"}, usage()},
		{"OK_HelpHelp", []string{"help", "help"}, usage()},
		{"OK_Version", []string{"version"}, version + "\n"},
		{"OK_DashDashVersion", []string{"--version"}, version + "\n"},
		{"OK_DashV", []string{"-v"}, version + "\n"},
		{"OK_HelpVersion", []string{"help", "version"}, "Usage: billing version"},
		{"OK_HelpDLQ", []string{"help", "dlq"}, "Usage: billing dlq <command>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if out := runHelp(t, tt.args...); !strings.HasPrefix(out, tt.want) {
				t.Errorf("billing %s printed:\n%s\nwant it to start with %q", strings.Join(tt.args, " "), out, tt.want)
			}
		})
	}
	// Every command registered is described by billing help <command>.
	for _, c := range subcommands() {
		if c.name == "help" {
			continue
		}
		shown := cmp.Or(c.synopsis, c.name)
		if out := runHelp(t, append([]string{"help"}, strings.Fields(shown)...)...); !strings.HasPrefix(out, "Usage: billing "+shown) {
			t.Errorf("billing help %s printed:\n%s", shown, out)
		}
	}
}

func TestHelp_Errors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"ErrNoCommand", nil, "usage"},
		{"ErrUnknownCommand", []string{"serv"}, `unknown command "serv"`},
		{"ErrHelpUnknownCommand", []string{"help", "serv"}, `unknown command "serv"`},
		{"ErrServeArgument", []string{"serve", "now"}, "serve takes no arguments"},
		{"ErrMigrateUnknownFlag", []string{"migrate", "--force"}, "migrate: flag provided but not defined: -force"},
		{"ErrPauseWithoutReason", []string{"pause", "--by", "alice"}, "pause: --reason is required"},
		{"ErrResumeWithoutReason", []string{"resume"}, "resume: --reason is required"},
		{"ErrPauseNegativeWait", []string{"pause", "--reason", "INC-42", "--wait", "-1s"}, "--wait must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), append([]string{"billing"}, tt.args...), map[string]string{}, nil, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("billing %s: err = %v, want %q", strings.Join(tt.args, " "), err, tt.want)
			}
		})
	}
}
