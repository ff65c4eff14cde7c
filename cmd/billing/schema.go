package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jmoiron/sqlx"

	"example.com/billing/internal/postgres"
)

// waitForSchema waits until the database answers, then checks that its
// schema is the one this binary needs (want). A refused password or a
// missing database is a configuration error and stops the process, and so
// does a schema older than want; a server that does not answer yet is
// waited for (readiness stays 503 meanwhile). It returns nil when ctx ends
// first.
func waitForSchema(ctx context.Context, db *sqlx.DB, want int64, log *slog.Logger) error {
	retry := backoff.NewExponentialBackOff()
	retry.MaxInterval = 10 * time.Second
	for {
		have, err := postgres.SchemaVersion(ctx, db)
		if err == nil {
			return checkSchema(have, want, log)
		}
		if postgres.IsConfigError(err) {
			return fmt.Errorf("DATABASE_URL: %w", err)
		}
		if ctx.Err() != nil {
			return nil
		}
		wait := retry.NextBackOff()
		if postgres.IsCertificateError(err) {
			// Not an outage: the server (or something in its place) shows
			// a certificate sslmode=verify-full refuses. Said apart, since
			// it may be an attack; waited out, since it may be a rotation.
			log.Error("database refused: its TLS certificate does not verify (DATABASE_URL's sslmode, sslrootcert and host); waiting", "err", err, "retry_in", wait)
		} else {
			log.Warn("database unreachable; waiting", "err", err, "retry_in", wait)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// checkSchema compares the database's schema version with the binary's.
func checkSchema(have, want int64, log *slog.Logger) error {
	switch {
	case have < want:
		// Every event would fail on a missing table or column and be
		// retried forever while /readyz said ready: refuse to start.
		return fmt.Errorf("the database schema is at version %d, this billing needs version %d: run `billing migrate` (of this version) first", have, want)
	case have > want:
		// A later version migrated the database and this binary was rolled
		// back. Migrations are additive (new tables, columns, indexes and
		// partitions; nothing an older binary uses is dropped or renamed),
		// so its queries still work: refusing to start would turn a
		// rollback into an outage.
		log.Warn("the database schema is newer than this binary (rolled back after a migration?); starting, since migrations are additive",
			"schema_version", have, "binary_schema_version", want)
	default:
		log.Info("database schema up to date", "schema_version", have)
	}
	return nil
}
