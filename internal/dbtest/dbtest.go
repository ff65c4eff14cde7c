// Package dbtest gives each test a fresh, migrated PostgreSQL database of
// its own on a real server, and drops it when the test ends.
//
// The server is TEST_DATABASE_URL, by default the local one on
// 127.0.0.1:5432. Tests never share a database, so they can run in
// parallel and leave nothing behind.
package dbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"example.com/billing/internal/pgtest"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/schema"
)

// DefaultURL is the server tests use unless TEST_DATABASE_URL says otherwise.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// ServerURL returns the URL of the test server's maintenance database.
func ServerURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// New creates a database for t, applies the migrations and returns a pool
// on it and its URL.
func New(t testing.TB) (*sqlx.DB, string) {
	t.Helper()
	dsn := Empty(t)
	db, err := postgres.Open(dsn, 20)
	if err != nil {
		t.Fatalf("open test database: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := schema.Migrate(ctx, db.DB, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatalf("migrate test database: %v", err)
	}
	return db, dsn
}

// Empty creates an empty database for t and returns its URL.
func Empty(t testing.TB) string {
	t.Helper()
	server := ServerURL()
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	name := "billing_test_" + hex.EncodeToString(suffix)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dsn, err := pgtest.Recreate(ctx, server, name)
	if err != nil {
		t.Fatalf("create test database (is PostgreSQL running at %s?): %v", postgres.Redact(server), err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := pgtest.Drop(ctx, server, name); err != nil {
			t.Errorf("drop test database %s: %v", name, err)
		}
	})
	return dsn
}
