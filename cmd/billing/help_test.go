package main

import (
	"bytes"
	"cmp"
	"context"
	"io"
	"strings"
	"testing"
)

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

// needsDeveloperBuild skips t in the build that ships, which has no
// developer command (make test builds the developer build).
func needsDeveloperBuild(t *testing.T, command string) {
	t.Helper()
	if len(developerCommands()) == 0 {
		t.Skipf("billing %s is a developer command: go test -tags dev", command)
	}
}

// TestDeveloperCommands_NamedInTheBuildThatShips: the build that ships
// names the developer commands it lacks, as the developer build registers
// them.
func TestDeveloperCommands_NamedInTheBuildThatShips(t *testing.T) {
	needsDeveloperBuild(t, "demo")
	var names []string
	for _, c := range developerCommands() {
		names = append(names, c.name)
	}
	if got := strings.Join(names, ", "); got != developerNames {
		t.Errorf("the developer build registers %s, the build that ships names %s", got, developerNames)
	}
}

// TestHelp_TheBuildThatShips: its usage lists no developer command and
// says where they are, and asking for one says the same.
func TestHelp_TheBuildThatShips(t *testing.T) {
	t.Parallel()
	out := usageWith(nil)
	for _, name := range strings.Split(developerNames, ", ") {
		if strings.Contains(out, "\n  "+name+" ") {
			t.Errorf("the usage of the build that ships lists %s:\n%s", name, out)
		}
	}
	if !strings.Contains(out, "("+developerNames+")") || !strings.Contains(out, "make dev") {
		t.Errorf("the usage of the build that ships does not say where the developer commands are:\n%s", out)
	}
	if err := unknownCommand("demo", nil, io.Discard); !strings.Contains(err.Error(), "demo is a developer command") || !strings.Contains(err.Error(), "make dev") {
		t.Errorf("billing demo in the build that ships: %v", err)
	}
	if err := unknownCommand("serv", nil, io.Discard); err.Error() != `unknown command "serv"` {
		t.Errorf("billing serv in the build that ships: %v", err)
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
