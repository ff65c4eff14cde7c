// Package dbtest gives each test a fresh, migrated PostgreSQL database of
// its own on a real server, and drops it when the test ends. Tests never
// share a database, so they can run in parallel and leave nothing behind.
//
// The server is the one TEST_DATABASE_URL names (by default the local one
// on 127.0.0.1:5432) when it answers; make test starts one for the whole
// run when none does, and names it in TEST_DATABASE_URL. A test binary run
// by other means (go test ./...) where none answers starts one of its own
// on first use, as pgserver does it (local binaries, else the embedded
// PostgreSQL), and stops it when its tests end: a package that uses dbtest
// has
//
//	func TestMain(m *testing.M) { dbtest.Main(m) }
package dbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"example.com/billing/internal/dev/pgserver"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/schema"
)

// server is the server of this test binary's tests: the one that answers,
// or the one they started, which Main stops.
var server struct {
	mu sync.Mutex
	// main is set while Main runs the tests: a server started now is
	// stopped after them.
	main    bool
	url     string
	err     error
	started *pgserver.Server
}

// ServerURL returns the URL of the maintenance database of the server the
// tests use, starting one when none answers.
func ServerURL(t testing.TB) string {
	t.Helper()
	server.mu.Lock()
	defer server.mu.Unlock()
	if server.url == "" && server.err == nil {
		server.url, server.err = find()
	}
	if server.err != nil {
		t.Fatal(server.err)
	}
	return server.url
}

// find returns the server that answers, or starts one. A failure is kept:
// the package's other tests fail at once with it rather than try again.
func find() (string, error) {
	opts := pgserver.TestOptions(os.Getenv)
	// Long enough for the embedded binaries' first fetch on a slow network.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if pgserver.Answers(ctx, opts.URL) {
		return opts.URL, nil
	}
	if !server.main {
		return "", fmt.Errorf("dbtest: no PostgreSQL answers at %s, and these tests may not start one: nothing would stop it. "+
			"The package needs func TestMain(m *testing.M) { dbtest.Main(m) }", postgres.Redact(opts.URL))
	}
	s, err := pgserver.Start(ctx, opts)
	if err != nil {
		return "", fmt.Errorf("dbtest: no PostgreSQL answers at %s, and none could be started: %w", postgres.Redact(opts.URL), err)
	}
	server.started = s
	fmt.Fprintf(os.Stderr, "dbtest: %s\n", s.Describe())
	return s.URL, nil
}

// M is what TestMain runs: a *testing.M, or one that another package's
// Main wraps.
type M interface{ Run() int }

// Main runs a package's tests, stops the server they started if they
// started one, and exits.
func Main(m M) { os.Exit(WithServer(m).Run()) }

// WithServer returns m, whose Run lets the tests start a server and stops
// it after them: for a TestMain that hands m to another package's Main,
// e.g. kafkatest.Main(dbtest.WithServer(m)).
func WithServer(m M) M { return withServer{m} }

type withServer struct{ m M }

func (w withServer) Run() int {
	server.mu.Lock()
	server.main = true
	server.mu.Unlock()
	code := w.m.Run()
	server.mu.Lock()
	defer server.mu.Unlock()
	server.main = false
	if server.started != nil {
		if err := server.started.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "dbtest: %v\n", err)
			code = max(code, 1)
		}
		server.started = nil
	}
	return code
}

// New creates a database for t, applies the migrations and returns a pool
// on it and its URL.
func New(t testing.TB) (*sqlx.DB, string) {
	t.Helper()
	dsn := Empty(t)
	db := Open(t, dsn, 20)
	if _, err := schema.Migrate(Context(t), db.DB, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatalf("migrate test database: %v", err)
	}
	return db, dsn
}

// Open returns a pool of at most maxConns connections on dsn, closed when
// t ends.
func Open(t testing.TB, dsn string, maxConns int) *sqlx.DB {
	t.Helper()
	db, err := postgres.Open(dsn, maxConns)
	if err != nil {
		t.Fatalf("open %s: %v", postgres.Redact(dsn), err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// Context bounds a test's database calls to a minute, so that a lock wait
// fails the test instead of hanging it.
func Context(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// Empty creates an empty database for t and returns its URL.
func Empty(t testing.TB) string {
	t.Helper()
	server := ServerURL(t)
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	name := "billing_test_" + hex.EncodeToString(suffix)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dsn, err := pgserver.Recreate(ctx, server, name)
	if err != nil {
		t.Fatalf("create test database on %s: %v", postgres.Redact(server), err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := pgserver.Drop(ctx, server, name); err != nil {
			t.Errorf("drop test database %s: %v", name, err)
		}
	})
	return dsn
}
