package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// A binary is given only the variables it reads: an earlier binary does
// not get later variables, and none gets the benchmark's own settings of
// billing or of the Go runtime from the shell it was started in.
func TestServeEnv(t *testing.T) {
	known := map[string]bool{"KAFKA_BROKERS": true, "DATABASE_URL": true, "DATABASE_MAX_CONNS": true, "PAYMENT_MAX_RPS": true}
	inherited := []string{"PATH=/bin", "PGPASSWORD=pw", "PAYMENT_MAX_RPS=7", "GOMEMLIMIT=32MiB", "GOGC=50", "OTEL_EXPORTER_OTLP_ENDPOINT=http://x", "HOME=/root"}
	set := []string{"KAFKA_BROKERS=127.0.0.1:9092", "DEBUG_PPROF_ADDR=127.0.0.1:6060"}
	extra := []string{"CONSUMER_LANES=1", "DATABASE_MAX_CONNS=3", "GOGC=200"}
	env, dropped := serveEnv(known, inherited, set, extra)
	want := []string{"PATH=/bin", "PGPASSWORD=pw", "HOME=/root", "KAFKA_BROKERS=127.0.0.1:9092", "DATABASE_MAX_CONNS=3", "GOGC=200"}
	if !slices.Equal(env, want) {
		t.Errorf("env = %q, want %q", env, want)
	}
	if want := []string{"DEBUG_PPROF_ADDR=127.0.0.1:6060", "CONSUMER_LANES=1"}; !slices.Equal(dropped, want) {
		t.Errorf("dropped = %q, want %q", dropped, want)
	}
	if v, _ := lookup(append(env, "DATABASE_MAX_CONNS=4"), "DATABASE_MAX_CONNS"); v != "4" {
		t.Errorf("lookup gives %q, want the last value set, 4", v)
	}
}

// knownVars reads the variables from the env tags a binary keeps.
func TestKnownVars(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "billing")
	body := "\x00\x01env:\"KAFKA_BROKERS\" envDefault:\"localhost:9092\"\x00env:\"DATABASE_URL,required\"\x00env:\"CONSUMER_LANES\" \x00not env:\"lower\""
	if err := os.WriteFile(bin, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	known, err := knownVars(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"KAFKA_BROKERS", "DATABASE_URL", "CONSUMER_LANES"} {
		if !known[name] {
			t.Errorf("%s not found", name)
		}
	}
	if len(known) != 3 {
		t.Errorf("known = %v, want 3 variables", known)
	}
	other := filepath.Join(dir, "other")
	if err := os.WriteFile(other, []byte("no tags"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := knownVars(other); err == nil {
		t.Error("a file without billing's variables was taken for billing")
	}
}

func TestBaselineBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "billing")
	if err := os.WriteFile(bin, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if path, _, err := baselineBinary(bin); err != nil || path != bin {
		t.Errorf("baselineBinary(a file) = %q, %v; want the file", path, err)
	}
	if _, _, err := baselineBinary("no-such-commit-or-file"); err == nil {
		t.Error("baselineBinary accepted neither a file nor a commit")
	}
}
