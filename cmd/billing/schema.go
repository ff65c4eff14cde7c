package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"

	"example.com/billing/internal/postgres"
	"example.com/billing/internal/schema"
)

// waitForSchema waits until the database answers, then checks that its
// schema is one this release runs on: at least schema.Oldest, and not one
// a contract migration made for newer releases only. A refused password or
// a missing database is a configuration error and stops the process, and
// so does a schema this release does not run on; a server that does not
// answer yet is waited for (readiness stays 503 meanwhile). It returns nil
// when ctx ends first.
func waitForSchema(ctx context.Context, db *sqlx.DB, embedded int64, log *slog.Logger) error {
	retry := backoff.NewExponentialBackOff()
	retry.MaxInterval = 10 * time.Second
	for {
		c, err := schema.Read(ctx, db)
		if err == nil {
			return checkSchema(c, embedded, log)
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

// checkSchema says whether this release (embedding up to embedded) runs on
// a database at c.
func checkSchema(c schema.Compatibility, embedded int64, log *slog.Logger) error {
	if err := c.Check(schema.Oldest, embedded); err != nil {
		// Every event would fail on a missing table or column and be
		// retried forever while /readyz said ready: refuse to start.
		return err
	}
	if c.Version > embedded {
		// A later release migrated the database (expand migrations: this
		// one runs on them), and this one runs beside it, or was rolled
		// back to.
		log.Warn("the database schema is newer than this release (a rolling upgrade, or a rollback after an expand migration); starting: it keeps releases of this schema running",
			"schema_version", c.Version, "binary_schema_version", embedded, "runs_releases_from", c.RunsFrom)
		return nil
	}
	log.Info("database schema up to date", "schema_version", c.Version)
	return nil
}

// schemaProblem is readiness's view of the schema: "" while this release
// runs on it, else why not.
func schemaProblem(ctx context.Context, db *sqlx.DB, embedded int64) (string, error) {
	c, err := schema.Read(ctx, db)
	if err != nil {
		return "", err
	}
	if err := c.Check(schema.Oldest, embedded); err != nil {
		return err.Error(), nil
	}
	return "", nil
}

// registration is this process's record in billing_replica, renewed every
// schema.HeartbeatInterval until stopped: what billing migrate reads to
// know which releases are alive.
type registration struct {
	db       *sqlx.DB
	instance uuid.UUID
	embedded int64
	log      *slog.Logger
	stop     context.CancelFunc
	done     sync.WaitGroup
}

// register records this process and renews the record in background until
// end is called, which records a clean stop.
func register(ctx context.Context, db *sqlx.DB, embedded int64, log *slog.Logger) (*registration, error) {
	host, _ := os.Hostname()
	r := &registration{db: db, instance: uuid.Must(uuid.NewV4()), embedded: embedded, log: log}
	err := schema.Register(ctx, db, schema.Replica{Instance: r.instance, Release: version, Host: host, Schema: embedded, Oldest: schema.Oldest})
	if err != nil {
		return nil, fmt.Errorf("record this replica in the database: %w", err)
	}
	log.Info("replica recorded", "instance", r.instance.String(), "release", version, "schema", embedded, "runs_on_from", schema.Oldest)
	beat, stop := context.WithCancel(context.WithoutCancel(ctx))
	r.stop = stop
	r.done.Go(func() { r.heartbeat(beat) })
	return r, nil
}

// heartbeat renews the record every schema.HeartbeatInterval until ctx
// ends, and says when the schema stops running this release (a contract
// migration that counted this replica as gone).
func (r *registration) heartbeat(ctx context.Context) {
	t := time.NewTicker(schema.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c, err := schema.Heartbeat(ctx, r.db, r.instance)
		switch {
		case err != nil && ctx.Err() == nil:
			r.log.Warn("cannot renew this replica's record; a replica not renewed for 30s counts as gone for billing migrate", "err", err)
		case err == nil:
			if err := c.Check(schema.Oldest, r.embedded); err != nil {
				r.log.Error("the database schema no longer runs this release (readiness says so): replace it", "err", err)
			}
		}
	}
}

// end stops the heartbeat and records a clean stop.
func (r *registration) end() {
	r.stop()
	r.done.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := schema.Stop(ctx, r.db, r.instance); err != nil {
		r.log.Warn("cannot record this replica's stop; it counts as gone 30s after its last heartbeat", "err", err)
	}
}
