package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"runtime"
	"time"

	"example.com/billing/internal/dedup"
	"example.com/billing/internal/dev/pgserver"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/schema"
	"github.com/jmoiron/sqlx"
)

// withDB returns server's URL pointing at database name, with extra
// parameters (lib/pq sends unknown ones as run-time settings).
func withDB(server, name string, params map[string]string) (string, error) {
	u, err := url.Parse(server)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("-dsn must be a postgres:// URL, got %s", postgres.Redact(server))
	}
	u.Path = "/" + name
	q := u.Query()
	for k, v := range params {
		q.Set(k, v)
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func createDatabase(ctx context.Context, server string) (string, error) {
	name := "billing_bench_" + randomHex(6)
	if _, err := pgserver.Recreate(ctx, server, name); err != nil {
		return "", fmt.Errorf("create database on %s: %w", postgres.Redact(server), err)
	}
	return name, nil
}

// dropDatabase runs with a fresh context: it must happen after a signal too.
func dropDatabase(server, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return pgserver.Drop(ctx, server, name)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// setup migrates the database with billing's migrations, creates the
// partitions the data needs and the two unpartitioned tables, and records
// the machine and the server settings.
func (b *bench) setup(ctx context.Context, m *Machine) error {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if _, err := schema.Migrate(ctx, b.ctl.DB, quiet); err != nil {
		return err
	}
	today := time.Now().UTC().Truncate(24 * time.Hour)
	b.dataStart = today.AddDate(0, 0, -days)
	// The data's days and today, where new rows go. The migration made them
	// already (a week back, three days ahead); a fresh database at another
	// date would need them.
	for d := b.dataStart; !d.After(today); d = d.AddDate(0, 0, 1) {
		if _, err := b.ctl.ExecContext(ctx, `SELECT ensure_processed_event_partition($1::date)`, d.Format(time.DateOnly)); err != nil {
			return fmt.Errorf("create partition of %s: %w", d.Format(time.DateOnly), err)
		}
	}
	for _, v := range []variant{plainV7, plainV4} {
		// Shaped like processed_event: same columns, defaults, checks, key.
		for _, s := range []string{
			`CREATE SCHEMA ` + v.Schema,
			`CREATE TABLE ` + v.table() + ` (LIKE public.processed_event INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`,
			`ALTER TABLE ` + v.table() + ` ADD PRIMARY KEY (event_id, consumer_group)`,
		} {
			if _, err := b.ctl.ExecContext(ctx, s); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
	}
	if _, err := b.ctl.ExecContext(ctx, `CREATE EXTENSION IF NOT EXISTS pgstattuple`); err != nil {
		b.log.Warn("pgstattuple unavailable: no leaf density or dead-tuple figures", "err", err)
	} else {
		b.hasStat = true
	}
	if _, err := b.ctl.ExecContext(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`); err != nil {
		b.log.Warn("pg_walinspect unavailable: WAL figures are the whole cluster's", "err", err)
	} else {
		b.hasWalInspect = true
	}

	m.CPUs = runtime.NumCPU()
	m.MemTotal = memTotal()
	m.LoadStart = loadavg()
	m.HasStat = b.hasStat
	if err := b.ctl.GetContext(ctx, &m.Server, `SELECT version()`); err != nil {
		return fmt.Errorf("server version: %w", err)
	}
	var settings []struct {
		Name    string `db:"name"`
		Setting string `db:"setting"`
	}
	const q = `
SELECT name, current_setting(name) AS setting FROM pg_settings
WHERE name IN ('shared_buffers', 'synchronous_commit', 'fsync', 'wal_sync_method', 'full_page_writes',
               'wal_compression', 'max_wal_size', 'checkpoint_timeout', 'autovacuum', 'work_mem',
               'maintenance_work_mem', 'effective_cache_size', 'wal_buffers', 'commit_delay')
ORDER BY name`
	if err := b.ctl.SelectContext(ctx, &settings, q); err != nil {
		return fmt.Errorf("server settings: %w", err)
	}
	m.Settings = map[string]string{}
	for _, s := range settings {
		m.Settings[s.Name] = s.Setting
	}
	return nil
}

// load pre-fills v's table with cfg.Rows rows spread evenly, in time order,
// over the days days before today, by INSERT ... SELECT with the primary key
// in place: the index gets the shape production's inserts give it (appended
// for v7, split at random places for v4), not the packed shape of an index
// built after the load.
func (b *bench) load(ctx context.Context, v variant) (LoadResult, error) {
	// Row g's time is spread evenly over the span. A v7 id is that
	// millisecond in its 48 time bits, version 7, and the random bits of a
	// gen_random_uuid(), whose variant bits are already right.
	id := `gen_random_uuid()`
	if v.Keys == "v7" {
		id = `(lpad(to_hex(t.ms), 12, '0') || '7' || substr(replace(gen_random_uuid()::text, '-', ''), 14))::uuid`
	}
	q := `
INSERT INTO ` + v.table() + ` (event_id, consumer_group, fingerprint, processed_at, claimed_with)
SELECT ` + id + `, $4, sha256(int8send(g)), to_timestamp(t.ms / 1000.0), $7
FROM generate_series($1::bigint, $2::bigint) AS g,
     LATERAL (SELECT $3::bigint + g * $5::bigint / $6::bigint AS ms) AS t`

	startMs := b.dataStart.UnixMilli()
	spanMs := int64(days * 24 * time.Hour / time.Millisecond)
	chunk := max(b.cfg.Rows/20, 10_000)
	lr := LoadResult{Variant: v, Rows: b.cfg.Rows}
	t0 := time.Now()
	for lo := int64(0); lo < b.cfg.Rows; lo += chunk {
		hi := min(lo+chunk, b.cfg.Rows) - 1
		if _, err := b.ctl.ExecContext(ctx, q, lo, hi, startMs, group, spanMs, b.cfg.Rows, dedup.ClaimProtocol); err != nil {
			return lr, fmt.Errorf("load %s: %w", v.table(), err)
		}
		b.log.Info("loading", "table", v.Name, "rows", hi+1, "of", b.cfg.Rows, "elapsed", time.Since(t0).Round(time.Second))
	}
	lr.Took = time.Since(t0)
	b.rows[v.Schema] = b.cfg.Rows

	// What autovacuum would have done by then (it is off on some servers):
	// hint bits and visibility map set, statistics fresh, so that the
	// measurements that follow do not pay for the load.
	t0 = time.Now()
	if _, err := b.ctl.ExecContext(ctx, `VACUUM (ANALYZE) `+v.table()); err != nil {
		return lr, fmt.Errorf("vacuum %s: %w", v.table(), err)
	}
	lr.Vacuum = time.Since(t0)
	var err error
	if lr.Sizes, err = b.sizes(ctx, v, true); err != nil {
		return lr, err
	}
	b.log.Info("loaded", "table", v.Name, "took", lr.Took.Round(time.Millisecond),
		"vacuum", lr.Vacuum.Round(time.Millisecond), "pkey", mb(lr.Sizes.PKey), "heap", mb(lr.Sizes.Heap))
	return lr, nil
}

// sizes sums v's sizes over its leaf partitions (or of the table itself);
// with deep, also pgstatindex's figures, which read the whole index.
func (b *bench) sizes(ctx context.Context, v variant, deep bool) (Sizes, error) {
	const pkeys = `
WITH leaves AS (
    SELECT relid FROM pg_partition_tree($1::regclass) WHERE isleaf
    UNION ALL
    SELECT $1::regclass WHERE NOT EXISTS (SELECT FROM pg_partition_tree($1::regclass))
), pk AS MATERIALIZED ( -- so that pgstatindex sees these only, never the parent's index
    SELECT l.relid, i.indexrelid FROM leaves l JOIN pg_index i ON i.indrelid = l.relid AND i.indisprimary
)`
	const q = pkeys + `
SELECT count(*),
       coalesce(sum(pg_relation_size(relid)), 0),
       coalesce(sum(pg_relation_size(indexrelid)), 0),
       coalesce(sum(pg_indexes_size(relid)), 0),
       coalesce(sum(pg_total_relation_size(relid)), 0)
FROM pk`
	var s Sizes
	if err := b.ctl.QueryRowContext(ctx, q, v.table()).Scan(&s.Partitions, &s.Heap, &s.PKey, &s.Indexes, &s.Total); err != nil {
		return s, fmt.Errorf("sizes of %s: %w", v.table(), err)
	}
	if !b.hasStat || !deep {
		return s, nil
	}
	const qStat = pkeys + `
SELECT coalesce(sum(s.leaf_pages), 0)::bigint,
       coalesce(sum(s.avg_leaf_density * s.leaf_pages) FILTER (WHERE s.leaf_pages > 0)
                / nullif(sum(s.leaf_pages), 0), 0),
       coalesce(sum(s.empty_pages + s.deleted_pages), 0)::bigint,
       coalesce(max(s.tree_level) + 1, 0)
FROM pk, LATERAL pgstatindex(pk.indexrelid::regclass) s`
	if err := b.ctl.QueryRowContext(ctx, qStat, v.table()).Scan(&s.LeafPages, &s.LeafDensity, &s.FreePages, &s.Levels); err != nil {
		return s, fmt.Errorf("pgstatindex of %s: %w", v.table(), err)
	}
	return s, nil
}

// counters are figures read before and after a measurement: the block
// traffic of a schema's tables (pg_statio_user_tables), its dead tuples, and
// the server's checkpoint count.
type counters struct {
	IdxRead, IdxHit, HeapRead int64
	NDeadTup                  int64
	Checkpoints               int64
}

func (b *bench) counters(ctx context.Context, schema string) (counters, error) {
	// A fresh statistics snapshot; each statement is its own transaction.
	if _, err := b.ctl.ExecContext(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
		return counters{}, fmt.Errorf("clear statistics snapshot: %w", err)
	}
	const q = `
SELECT coalesce(sum(s.idx_blks_read), 0)::bigint, coalesce(sum(s.idx_blks_hit), 0)::bigint,
       coalesce(sum(s.heap_blks_read), 0)::bigint,
       (SELECT coalesce(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables WHERE schemaname = $1),
       (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter)
FROM pg_statio_user_tables s WHERE s.schemaname = $1`
	var c counters
	if err := b.ctl.QueryRowContext(ctx, q, schema).Scan(&c.IdxRead, &c.IdxHit, &c.HeapRead, &c.NDeadTup, &c.Checkpoints); err != nil {
		return c, fmt.Errorf("read statistics: %w", err)
	}
	return c, nil
}

func (b *bench) checkpoint(ctx context.Context) error {
	if _, err := b.ctl.ExecContext(ctx, `CHECKPOINT`); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// pool opens cfg.Workers connections that see v's table as processed_event
// and commit with synchronous_commit sc.
func (b *bench) pool(ctx context.Context, v variant, sc string) (*sqlx.DB, error) {
	dsn, err := withDB(b.cfg.DSN, b.dbName, map[string]string{
		"search_path":        v.Schema,
		"synchronous_commit": sc,
		"application_name":   "bench-dedup",
	})
	if err != nil {
		return nil, err
	}
	db, err := postgres.Open(dsn, b.cfg.Workers)
	if err != nil {
		return nil, err
	}
	// Connect every worker now, not inside the measurement.
	conns := make([]*sql.Conn, 0, b.cfg.Workers)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range b.cfg.Workers {
		c, err := db.Conn(ctx)
		if err != nil {
			db.Close()
			return nil, fmt.Errorf("connect: %w", err)
		}
		conns = append(conns, c)
	}
	return db, nil
}

// closePool closes db and gives its backends time to exit, which publishes
// their statistics (otherwise up to 10s late).
func closePool(db *sqlx.DB) {
	db.Close()
	time.Sleep(time.Second)
}
