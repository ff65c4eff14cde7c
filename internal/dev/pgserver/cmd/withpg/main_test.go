package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"example.com/billing/internal/dev/pgserver"
)

func TestRun_TheCommandGetsAServerAndItsExitCodeIsWithpgs(t *testing.T) {
	if testing.Short() {
		t.Skip("may start PostgreSQL")
	}
	// The run's own environment: a server that answers, or PG_BIN and
	// the cache for the one withpg starts.
	opts := pgserver.TestOptions(os.Getenv)
	seen := filepath.Join(t.TempDir(), "url")
	var stderr bytes.Buffer
	code, err := run([]string{"sh", "-c", `echo "$TEST_DATABASE_URL" >` + seen + `; exit 3`}, os.Getenv, &stderr)
	if err != nil || code != 3 {
		t.Fatalf("run: %d, %v; want the command's exit code 3\n%s", code, err, stderr.String())
	}
	b, err := os.ReadFile(seen)
	if err != nil {
		t.Fatal(err)
	}
	url := strings.TrimSpace(string(b))
	if !strings.Contains(stderr.String(), "withpg: PostgreSQL for the tests: ") {
		t.Errorf("withpg does not say which server the tests use:\n%s", stderr.String())
	}
	if url == opts.URL {
		return // it answered: withpg started nothing
	}
	if !strings.Contains(stderr.String(), "started on") || pgserver.Answers(t.Context(), url) {
		t.Errorf("the command got %s, a server withpg started, which must not answer once withpg returned\n%s", url, stderr.String())
	}
}

func TestRun_ErrNoCommand(t *testing.T) {
	if code, err := run(nil, os.Getenv, &bytes.Buffer{}); code != 2 || err == nil {
		t.Errorf("run without a command: %d, %v; want usage, 2", code, err)
	}
}
