package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pressly/goose/v3"

	"example.com/billing/db/migrations"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/schema"
	"example.com/billing/internal/testenv/dbtest"
	"example.com/billing/internal/testenv/wait"
)

// schemaEnv is serve's environment on the database dsn, with a broker that
// refuses connections: these tests are about what happens before Kafka.
func schemaEnv(t *testing.T, dsn string) map[string]string {
	t.Helper()
	return map[string]string{
		"KAFKA_BROKERS":    freeAddr(t),
		"DATABASE_URL":     dsn,
		"PAYMENT_BASE_URL": "http://127.0.0.1:9", // never called
		"HTTP_ADDR":        freeAddr(t),
	}
}

// TestServe_RefusesAnOlderSchema: on a database that was never migrated,
// or migrated by an older billing than the oldest schema this release runs
// on, serve stops at start with an error that says what to run, instead of
// starting and retrying every event forever on a missing table while
// /readyz says ready.
func TestServe_RefusesAnOlderSchema(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		version int64 // migrated up to; 0: never migrated
	}{
		{"ErrNeverMigrated", 0},
		{"ErrOlder", migrationBefore(t, schema.Oldest)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dsn := dbtest.Empty(t)
			if tt.version > 0 {
				migrateTo(t, dsn, tt.version)
			}
			err := serveUntilItStops(t, dsn)
			for _, s := range []string{"billing migrate", fmt.Sprintf("version %d", tt.version), fmt.Sprintf("schemas %d and newer", schema.Oldest)} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
		})
	}
}

// TestServe_RefusesASchemaForNewerReleasesOnly: once a contract migration
// made the schema run releases newer than this one only, serve stops at
// start naming both ranges.
func TestServe_RefusesASchemaForNewerReleasesOnly(t *testing.T) {
	t.Parallel()
	db, dsn := dbtest.New(t)
	embedded, err := schema.Version()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE schema_compatibility SET runs_from = $1`, embedded+1); err != nil {
		t.Fatal(err)
	}
	err = serveUntilItStops(t, dsn)
	for _, s := range []string{fmt.Sprintf("schema %d and newer only", embedded+1), fmt.Sprintf("this release (schema %d)", embedded), "deploy a newer release"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	var recorded int
	if err := db.Get(&recorded, `SELECT count(*) FROM billing_replica`); err != nil || recorded != 0 {
		t.Errorf("a replica that does not run on the schema is recorded (%d, %v)", recorded, err)
	}
}

// migrationBefore is the newest embedded migration older than version
// (versions may skip a number).
func migrationBefore(t *testing.T, version int64) int64 {
	t.Helper()
	ms, err := schema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var before int64
	for _, m := range ms {
		if m.Version < version {
			before = m.Version
		}
	}
	return before
}

// serveUntilItStops runs serve on dsn and returns the error it stopped
// with, failing t when it starts or runs for 30 s.
func serveUntilItStops(t *testing.T, dsn string) error {
	t.Helper()
	var logs syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := run(ctx, []string{"billing", "serve"}, schemaEnv(t, dsn), nil, io.Discard, &logs)
	if ctx.Err() != nil {
		t.Fatalf("serve was still running after 30s\n%s", logs.String())
	}
	if err == nil {
		t.Fatalf("serve started\n%s", logs.String())
	}
	return err
}

// TestServe_StartsOnANewerSchema: a release runs on the expand migrations
// of a later one (a rolling upgrade, or a rollback after it), and says so.
func TestServe_StartsOnANewerSchema(t *testing.T) {
	t.Parallel()
	db, dsn := dbtest.New(t)
	want, err := schema.Version()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO goose_db_version (version_id, is_applied) VALUES ($1, true)`, want+1); err != nil {
		t.Fatal(err)
	}
	env := schemaEnv(t, dsn)
	logs := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"billing", "serve"}, env, nil, io.Discard, logs) }()
	waitLogLine(t, logs, done, 20*time.Second, func(l logLine) bool { return strings.HasPrefix(l.Msg, "the database schema is newer") })
	// It goes on to Kafka, which refuses here.
	waitLogLine(t, logs, done, 20*time.Second, func(l logLine) bool { return l.Msg == "kafka unreachable; waiting" })
	cancel()
	if err := <-done; err != nil {
		t.Errorf("serve exited with %v, want exit 0", err)
	}
}

// TestServe_ReadyzSaysWhenTheSchemaFallsBehind: a schema that changes
// underneath a running serve (a backup restored, a migration rolled back)
// makes /readyz answer 503 saying so, and 200 again once it is migrated.
func TestServe_ReadyzSaysWhenTheSchemaFallsBehind(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1)
	s := h.serve(h.environ())
	if _, err := h.db.Exec(`DELETE FROM goose_db_version WHERE version_id >= $1`, schema.Oldest); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "/readyz 503 naming the schema", func() bool {
		code, body := get(s.addr, "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "database schema") && strings.Contains(body, "billing migrate")
	})
	if _, err := h.db.Exec(`INSERT INTO goose_db_version (version_id, is_applied) VALUES ($1, true)`, schema.Oldest); err != nil {
		t.Fatal(err)
	}
	s.waitReady(t)
}

// migrateTo applies the embedded migrations to dsn up to version.
func migrateTo(t *testing.T, dsn string, version int64) {
	t.Helper()
	db, err := postgres.Open(dsn, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, db.DB, migrations.FS, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := provider.UpTo(context.Background(), version); err != nil {
		t.Fatal(err)
	}
}

// TestServe_SaysWhereTheGroupStarts: a new consumer group starts from the
// oldest offset and processes every message already on the topic (after
// a change of KAFKA_GROUP_ID: the whole topic again); serve says so, with
// the number of messages, and says when a group resumes instead.
func TestServe_SaysWhereTheGroupStarts(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 2)
	for i := range int64(3) {
		_, value := event(t, 60+i, 100, "EUR")
		h.publish(int32(i%2), fmt.Sprint(60+i), value)
	}
	first := h.serve(h.environ())
	first.waitLog(t, `"msg":"new consumer group: it starts from the oldest offset, so every message on the topic is processed`)
	if !strings.Contains(first.logs.String(), `"messages":3`) {
		t.Errorf("the new group's start does not count the 3 messages on the topic:\n%s", first.logs.String())
	}
	h.waitCaughtUp()
	first.stop(t)

	again := h.serve(h.environ())
	again.waitLog(t, `"msg":"consumer group resumes from its committed offsets"`)
}
