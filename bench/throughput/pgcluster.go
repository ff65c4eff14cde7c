package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"example.com/billing/internal/dev/pgserver"
	"example.com/billing/internal/postgres"
)

// pgCluster is the benchmark's own PostgreSQL cluster (a pgserver.Cluster:
// initdb'd in a directory of its own, on a free port of 127.0.0.1, used by
// nobody else, run as the OS user postgres when root, killed with the
// benchmark). WAL positions and the server's CPU are the whole cluster's,
// so on the shared server other engineers' tests would be counted as
// billing's; here every byte and every tick between two samples is the
// scenario's (and the few records a server writes by itself, which the
// breakdown shows).
//
// It is configured as a primary that keeps money: fsync, full-page writes
// and synchronous commit on, wal_level replica (a standby or an archive
// reads its WAL). What differs from a production primary, and why:
//
//   - Checkpoints come only when the benchmark asks (CHECKPOINT before each
//     measured window; checkpoint_timeout and max_wal_size too large to
//     fire within one). Every window then starts the same way, with every
//     page's first change after it logging a full-page image, instead of a
//     checkpoint landing at a random moment in some windows and not in
//     others. The full-page images are reported apart.
//   - autovacuum is off, so that a vacuum does not land in some windows
//     and not in others; what vacuuming a window's dead rows writes is
//     measured after the window instead (a VACUUM of the scenario's
//     database, at 0 ms).
//
// Its binaries are this machine's PostgreSQL (PG_BIN, else the newest
// /usr/lib/postgresql/*/bin), not the embedded one: the benchmark also runs
// pgbench and reads the WAL with pg_walinspect.
type pgCluster struct {
	*pgserver.Cluster
}

// pgSettings are the cluster's settings beyond initdb's defaults, in the
// order the benchmark prints them.
var pgSettings = []string{
	"max_connections=300", // replicas × DATABASE_MAX_CONNS, pgbench's 16 clients, the benchmark's own
	"fsync=on",
	"synchronous_commit=on",
	"full_page_writes=on",
	"wal_compression=off",
	"checkpoint_timeout=1h",
	"max_wal_size=16GB",
	"autovacuum=off",
	"log_checkpoints=on",
	"log_min_messages=warning",
}

// startPGCluster starts the benchmark's cluster; Close stops it and removes
// its directory.
func startPGCluster(ctx context.Context) (*pgCluster, error) {
	bin, err := pgserver.LocalBinaries(ctx, os.Getenv("PG_BIN"))
	if err != nil {
		return nil, fmt.Errorf("the benchmark needs this machine's PostgreSQL (pgbench, pg_walinspect): %w", err)
	}
	settings := map[string]string{}
	for _, s := range pgSettings {
		k, v, _ := strings.Cut(s, "=")
		settings[k] = v
	}
	c, err := pgserver.StartCluster(ctx, bin, pgserver.ClusterOptions{Settings: settings})
	if err != nil {
		return nil, err
	}
	// pg_walinspect reads the WAL back (the breakdown by record type and
	// relation); creating it takes a superuser, which the benchmark is in
	// its own cluster.
	db, err := postgres.Open(c.URL("postgres"), 1)
	if err == nil {
		_, err = db.ExecContext(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`)
		db.Close()
	}
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("create extension pg_walinspect: %w", err)
	}
	return &pgCluster{c}, nil
}

// postmaster is the server's process, whose CPU (and its children's) is
// PostgreSQL's.
func (c *pgCluster) postmaster() int { return c.Pid() }

// program is the path of one of the cluster's PostgreSQL programs; without
// a cluster of its own (-db), the one on PATH.
func (c *pgCluster) program(name string) string {
	if c == nil {
		return name
	}
	return filepath.Join(c.Binaries.Dir, name)
}
