package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"example.com/billing/internal/testenv/dbtest"
)

// TestMain stops the PostgreSQL server the tests started, if none answered
// (see dbtest).
func TestMain(m *testing.M) { dbtest.Main(m) }

// TestRunSmall runs the whole benchmark on a few thousand rows, so that a
// migration that changes processed_event breaks `make test`, not the next
// person who runs `make bench-dedup` (migration 00004's claimed_with did).
func TestRunSmall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	args := []string{"-dsn", dbtest.ServerURL(t), "-rows", "7000", "-duration", "300ms", "-rounds", "1", "-workers", "2"}
	if err := run(ctx, args, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"### Tables after the bulk load",
		"| v7, partitioned by day (billing) | 7000 |",
		"### Steady-state inserts",
		"### Removing the oldest day, nothing else writing",
		"DETACH PARTITION … CONCURRENTLY + DROP TABLE (dedup.Retention)",
		"### Removing the next day while 2 workers insert",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}
