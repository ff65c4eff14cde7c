// Command dedup measures billing's dedup store, processed_event, at
// production size (`make bench-dedup`, GitHub issue 5):
//
//  1. the steady-state insert rate into a table already holding -rows rows,
//     with UUID v7 keys (billing's partitioned table, and one plain table)
//     and with UUID v4 keys (a plain table: a v4 id carries no time to
//     partition by), with the index size, WAL and buffer reads each costs;
//  2. removing one day of that data: detaching and dropping a partition
//     (dedup.Retention, as billing does it) versus batched DELETEs on the
//     plain v7 table, with the bloat each leaves and what concurrent inserts
//     see meanwhile.
//
// It creates a database of its own on the -dsn server, runs billing's
// migrations in it and drops it at the end (also on SIGINT or SIGTERM); it
// never touches another database. It prints a Markdown report on stdout and,
// with -out, writes the same figures as JSON. It is a benchmark, not a test:
// no part of `go test ./...`.
package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"

	"example.com/billing/internal/dedup"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/postgres"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() { <-ctx.Done(); stop() }() // a second signal kills at once
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench-dedup:", err)
		os.Exit(1)
	}
}

// defaultDSN is the local server's maintenance database, as in the tests.
const defaultDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// group is the consumer group of every row: billing's default
// KAFKA_GROUP_ID, so that index entries have their production width.
const group = "billing-order-confirmed"

// days is how many whole UTC days the pre-filled rows span: billing's
// default DEDUP_RETENTION of 168h.
const days = 7

// Config is the benchmark's flags.
type Config struct {
	Rows        int64         `json:"rows"`
	DSN         string        `json:"-"`
	Out         string        `json:"-"`
	Workers     int           `json:"workers"`
	Batch       int           `json:"batch"`
	Duration    time.Duration `json:"duration_ns"`
	Rounds      int           `json:"rounds"`
	DeleteBatch int           `json:"delete_batch"`
}

func parseFlags(args []string, stderr io.Writer) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("bench-dedup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Int64Var(&c.Rows, "rows", 10_000_000, "rows each table holds before the measurements")
	fs.StringVar(&c.DSN, "dsn", defaultDSN, "URL of the server's maintenance database; the benchmark creates and drops a database of its own there")
	fs.StringVar(&c.Out, "out", "", "also write the figures as JSON to this file")
	fs.IntVar(&c.Workers, "workers", 4, "concurrent inserting connections")
	fs.IntVar(&c.Batch, "batch", 16, "events per insert transaction (billing's CONSUMER_BATCH_MAX)")
	fs.DurationVar(&c.Duration, "duration", 0, "length of one insert measurement (0: 20s at 10M rows, proportionally less for fewer, at least 1s)")
	fs.IntVar(&c.Rounds, "rounds", 0, "insert measurements per table and setting, interleaved across tables (0: 3 from 1M rows, else 1)")
	fs.IntVar(&c.DeleteBatch, "delete-batch", 10_000, "rows per DELETE transaction when removing a day without partitions")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch {
	case c.Rows < 7_000:
		return c, fmt.Errorf("-rows %d: need at least 7000 (1000 a day)", c.Rows)
	case c.Workers < 1 || c.Workers > 64:
		return c, fmt.Errorf("-workers %d is outside 1..64", c.Workers)
	case c.Batch < 1 || c.Batch > 1000:
		return c, fmt.Errorf("-batch %d is outside 1..1000", c.Batch)
	case c.DeleteBatch < 1:
		return c, fmt.Errorf("-delete-batch %d must be positive", c.DeleteBatch)
	case c.Duration < 0:
		return c, fmt.Errorf("-duration %s is negative", c.Duration)
	case c.Rounds < 0:
		return c, fmt.Errorf("-rounds %d is negative", c.Rounds)
	}
	if c.Duration == 0 {
		c.Duration = time.Duration(float64(20*time.Second) * float64(c.Rows) / 10e6).Round(time.Second)
		c.Duration = min(max(c.Duration, time.Second), 20*time.Second)
	}
	if c.Rounds == 0 {
		c.Rounds = 1
		if c.Rows >= 1_000_000 {
			c.Rounds = 3
		}
	}
	if _, err := withDB(c.DSN, "x", nil); err != nil {
		return c, err
	}
	return c, nil
}

// variant is one shape of the dedup table. Each lives in its own schema as
// a table named processed_event, so that billing's own dedup.Store, whose SQL
// names processed_event unqualified, inserts into it through search_path.
type variant struct {
	Name        string `json:"name"`
	Schema      string `json:"schema"`
	Keys        string `json:"keys"` // "v7" or "v4"
	Partitioned bool   `json:"partitioned"`
}

func (v variant) table() string { return v.Schema + ".processed_event" }

var (
	partitionedV7 = variant{Name: "v7, partitioned by day (billing)", Schema: "public", Keys: "v7", Partitioned: true}
	plainV7       = variant{Name: "v7, one table", Schema: "v7plain", Keys: "v7"}
	plainV4       = variant{Name: "v4, one table", Schema: "v4plain", Keys: "v4"}
	variants      = []variant{partitionedV7, plainV7, plainV4}
)

// Results is everything the benchmark measured, as written by -out.
type Results struct {
	Started  time.Time      `json:"started"`
	Wall     time.Duration  `json:"wall_ns"`
	Config   Config         `json:"config"`
	Machine  Machine        `json:"machine"`
	Loads    []LoadResult   `json:"loads"`
	Inserts  []InsertResult `json:"inserts"`
	Removals []RemoveResult `json:"removals"`
}

// Machine describes where the figures come from.
type Machine struct {
	CPUs      int               `json:"cpus"`
	MemTotal  string            `json:"mem_total"`
	Server    string            `json:"server"`
	Settings  map[string]string `json:"settings"`
	LoadStart string            `json:"loadavg_start"`
	LoadEnd   string            `json:"loadavg_end"`
	HasStat   bool              `json:"pgstattuple"`
}

// Sizes are a table's on-disk figures, summed over its partitions.
type Sizes struct {
	Partitions int   `json:"partitions"`
	Heap       int64 `json:"heap_bytes"`    // main fork of the table(s)
	PKey       int64 `json:"pkey_bytes"`    // pg_relation_size of the primary key index(es)
	Indexes    int64 `json:"indexes_bytes"` // pg_indexes_size
	Total      int64 `json:"total_bytes"`   // pg_total_relation_size
	// From pgstatindex, when asked for and available.
	LeafPages   int64   `json:"leaf_pages"`
	LeafDensity float64 `json:"leaf_density_pct"` // avg_leaf_density weighted by leaf pages
	FreePages   int64   `json:"free_pages"`       // empty_pages + deleted_pages: reusable, still in the file
	Levels      int     `json:"btree_levels"`     // deepest tree_level + 1
}

// WAL is the write-ahead log written during a measurement.
type WAL struct {
	// Cluster is the advance of pg_current_wal_lsn(): every database's WAL,
	// other engineers' tests included.
	Cluster int64 `json:"cluster_bytes"`
	// Ours and OursFPI are the records, and the full-page images in them,
	// that touch the benchmark database's relations, read back with
	// pg_walinspect; -1 when that was not possible. Commit records name no
	// relation and are left out: some 40 bytes a transaction.
	Ours    int64 `json:"ours_bytes"`
	OursFPI int64 `json:"ours_fpi_bytes"`
	// Checkpoints that happened during the measurement, ours excluded.
	Checkpoints int64 `json:"checkpoints"`
}

func (w WAL) add(o WAL) WAL {
	s := WAL{Cluster: w.Cluster + o.Cluster, Ours: -1, OursFPI: -1, Checkpoints: w.Checkpoints + o.Checkpoints}
	if w.Ours >= 0 && o.Ours >= 0 {
		s.Ours, s.OursFPI = w.Ours+o.Ours, w.OursFPI+o.OursFPI
	}
	return s
}

// LoadResult is one table's bulk pre-fill.
type LoadResult struct {
	Variant variant       `json:"variant"`
	Rows    int64         `json:"rows"`
	Took    time.Duration `json:"took_ns"`
	Vacuum  time.Duration `json:"vacuum_analyze_ns"`
	Sizes   Sizes         `json:"sizes"`
}

// InsertResult is one round of steady-state inserts.
type InsertResult struct {
	Variant    variant       `json:"variant"`
	SyncCommit string        `json:"synchronous_commit"`
	Round      int           `json:"round"`
	RowsBefore int64         `json:"rows_before"`
	Rows       int64         `json:"rows_inserted"`
	Elapsed    time.Duration `json:"elapsed_ns"`
	RowsPerSec float64       `json:"rows_per_sec"`
	Tx         latencies     `json:"tx"`
	WAL        WAL           `json:"wal"`
	IdxRead    int64         `json:"idx_blks_read"`
	IdxHit     int64         `json:"idx_blks_hit"`
	HeapRead   int64         `json:"heap_blks_read"`
	PKeyGrowth int64         `json:"pkey_growth_bytes"`
	Load       string        `json:"loadavg_end"`
	samples    []sample
}

// RemoveResult is one removal of a day of rows.
type RemoveResult struct {
	Variant     variant       `json:"variant"`
	Method      string        `json:"method"`
	Day         string        `json:"day"`
	UnderLoad   bool          `json:"under_load"`
	Rows        int64         `json:"rows_removed"`
	Took        time.Duration `json:"took_ns"`
	Batches     int           `json:"transactions"`
	Slowest     time.Duration `json:"slowest_transaction_ns"`
	WAL         WAL           `json:"wal"`
	Before      Sizes         `json:"before"`
	After       Sizes         `json:"after"`
	DeadTuples  int64         `json:"n_dead_tup_after"`
	Vacuum      time.Duration `json:"vacuum_ns,omitempty"`
	VacuumWAL   *WAL          `json:"vacuum_wal,omitempty"`
	AfterVacuum *Sizes        `json:"after_vacuum,omitempty"`
	// pgstattuple of the heap after the removal and after the VACUUM.
	DeadPct       float64 `json:"pgstattuple_dead_pct_after"`
	FreePct       float64 `json:"pgstattuple_free_pct_after"`
	FreePctVacuum float64 `json:"pgstattuple_free_pct_after_vacuum"`
	// Concurrent inserts into the same table, under load only: before the
	// removal started and while it ran.
	InsBefore latencies `json:"inserts_before"`
	InsDuring latencies `json:"inserts_during"`
}

// latencies summarizes insert transactions.
type latencies struct {
	N          int           `json:"tx"`
	P50        time.Duration `json:"p50_ns"`
	P99        time.Duration `json:"p99_ns"`
	Max        time.Duration `json:"max_ns"`
	RowsPerSec float64       `json:"rows_per_sec"`
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	res := Results{Started: time.Now().UTC(), Config: cfg}

	// --- A database of our own, dropped whatever happens.
	name, err := createDatabase(ctx, cfg.DSN)
	if err != nil {
		return err
	}
	log.Info("created benchmark database", "name", name, "server", postgres.Redact(cfg.DSN), "rows", cfg.Rows,
		"workers", cfg.Workers, "batch", cfg.Batch, "duration", cfg.Duration, "rounds", cfg.Rounds)
	defer func() {
		if err := dropDatabase(cfg.DSN, name); err != nil {
			log.Error("drop benchmark database; drop it by hand", "name", name, "err", err)
			return
		}
		log.Info("dropped benchmark database", "name", name)
	}()
	dsn, _ := withDB(cfg.DSN, name, nil)
	ctl, err := postgres.Open(dsn, 8)
	if err != nil {
		return err
	}
	defer ctl.Close()

	b := &bench{cfg: cfg, dbName: name, ctl: ctl, log: log, rows: map[string]int64{}}
	if err := b.setup(ctx, &res.Machine); err != nil {
		return err
	}

	// --- 1. Pre-fill every table to cfg.Rows rows.
	for _, v := range variants {
		lr, err := b.load(ctx, v)
		if err != nil {
			return err
		}
		res.Loads = append(res.Loads, lr)
	}

	// --- 2. Steady-state inserts, committed as billing commits them and
	// then without waiting for the WAL flush, which leaves the index's own
	// cost; rounds interleave the tables so that a change in the machine's
	// load falls on all of them.
	for round := range cfg.Rounds {
		for _, sc := range []string{"on", "off"} {
			for _, v := range variants {
				ir, err := b.inserts(ctx, v, sc, round)
				if err != nil {
					return err
				}
				res.Inserts = append(res.Inserts, ir)
			}
		}
	}

	// --- 3. Remove the oldest day with nothing else writing, for time, WAL
	// and bloat; then the next day while workers insert, for what they see.
	drop := "DETACH PARTITION … CONCURRENTLY + DROP TABLE (dedup.Retention)"
	del := fmt.Sprintf("DELETE by key range, %d rows a transaction", cfg.DeleteBatch)
	for day, underLoad := range []bool{false, true} {
		rr, err := b.removal(ctx, partitionedV7, drop, b.dropPartition, day, underLoad)
		if err != nil {
			return err
		}
		res.Removals = append(res.Removals, rr)
		if rr, err = b.removal(ctx, plainV7, del, b.deleteDay, day, underLoad); err != nil {
			return err
		}
		res.Removals = append(res.Removals, rr)
	}

	res.Machine.LoadEnd = loadavg()
	res.Wall = time.Since(res.Started)
	report(stdout, res)
	if cfg.Out != "" {
		out, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return fmt.Errorf("encode results: %w", err)
		}
		if err := os.WriteFile(cfg.Out, append(out, '\n'), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", cfg.Out, err)
		}
	}
	return nil
}

// bench holds what every phase needs.
type bench struct {
	cfg    Config
	dbName string
	ctl    *sqlx.DB // the benchmark database, default search_path
	log    *slog.Logger
	// hasStat: pgstattuple is there for leaf density and dead tuples.
	hasStat bool
	// hasWalInspect: pg_walinspect is there to tell our WAL from others'.
	hasWalInspect bool
	// dataStart is midnight UTC days days ago: the pre-filled rows span
	// [dataStart, today), one day in each of days partitions; new rows go
	// to today's.
	dataStart time.Time
	rows      map[string]int64 // rows in each variant's table, by schema
}

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
	if _, err := postgres.Recreate(ctx, server, name); err != nil {
		return "", fmt.Errorf("create database on %s: %w", postgres.Redact(server), err)
	}
	return name, nil
}

// dropDatabase runs with a fresh context: it must happen after a signal too.
func dropDatabase(server, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return postgres.Drop(ctx, server, name)
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
	if err := postgres.Migrate(ctx, b.ctl.DB, quiet); err != nil {
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
INSERT INTO ` + v.table() + ` (event_id, consumer_group, fingerprint, processed_at)
SELECT ` + id + `, $4, sha256(int8send(g)), to_timestamp(t.ms / 1000.0)
FROM generate_series($1::bigint, $2::bigint) AS g,
     LATERAL (SELECT $3::bigint + g * $5::bigint / $6::bigint AS ms) AS t`

	startMs := b.dataStart.UnixMilli()
	spanMs := int64(days * 24 * time.Hour / time.Millisecond)
	chunk := max(b.cfg.Rows/20, 10_000)
	lr := LoadResult{Variant: v, Rows: b.cfg.Rows}
	t0 := time.Now()
	for lo := int64(0); lo < b.cfg.Rows; lo += chunk {
		hi := min(lo+chunk, b.cfg.Rows) - 1
		if _, err := b.ctl.ExecContext(ctx, q, lo, hi, startMs, group, spanMs, b.cfg.Rows); err != nil {
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

// walWindow measures the WAL written between begin and end.
//
// The server's WAL position covers every database, and other engineers'
// tests write WAL too, so the records that touch this database's relations
// are read back with pg_walinspect. The WAL must still be there to be read:
// other sessions' checkpoints (a DROP DATABASE forces one) recycle old
// segments within seconds. A temporary physical replication slot keeps it;
// the server drops such a slot itself when its session ends, so a benchmark
// that dies leaves none behind.
type walWindow struct {
	b     *bench
	conn  *sql.Conn // holds the slot
	slot  string    // "" without one: the cluster figure only
	start string
	ckpt  int64
}

func (b *bench) beginWAL(ctx context.Context) (*walWindow, error) {
	w := &walWindow{b: b}
	if b.hasWalInspect {
		conn, err := b.ctl.Conn(ctx)
		if err != nil {
			return nil, fmt.Errorf("wal window: %w", err)
		}
		slot := "bench_dedup_" + randomHex(4)
		if _, err := conn.ExecContext(ctx, `SELECT pg_create_physical_replication_slot($1, true, true)`, slot); err != nil {
			b.log.Warn("no replication slot to keep the WAL: the WAL figure is the whole cluster's", "err", err)
			conn.Close()
		} else {
			w.conn, w.slot = conn, slot
		}
	}
	if err := b.ctl.QueryRowContext(ctx, `SELECT pg_current_wal_lsn()::text, (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter)`).Scan(&w.start, &w.ckpt); err != nil {
		w.close()
		return nil, fmt.Errorf("wal position: %w", err)
	}
	return w, nil
}

// stop measures the WAL position and checkpoints since begin: call it as
// soon as the measured work ends.
func (w *walWindow) stop(ctx context.Context) (WAL, error) {
	r := WAL{Ours: -1, OursFPI: -1}
	var ckpt int64
	if err := w.b.ctl.QueryRowContext(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint, (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter)`,
		w.start).Scan(&r.Cluster, &ckpt); err != nil {
		return r, fmt.Errorf("wal position: %w", err)
	}
	r.Checkpoints = max(ckpt-w.ckpt, 0)
	return r, nil
}

// readBack adds to r this database's part of the WAL since begin and
// releases the slot. It reads up to what is flushed: with
// synchronous_commit=off, call it a second after stop, when the WAL writer
// (every 200ms) has flushed the last commits.
func (w *walWindow) readBack(ctx context.Context, r WAL) WAL {
	defer w.close()
	if w.slot == "" {
		return r
	}
	const q = `
SELECT coalesce(sum(record_length), 0)::bigint, coalesce(sum(fpi_length), 0)::bigint
FROM pg_get_wal_records_info($1::pg_lsn, pg_current_wal_flush_lsn())
WHERE block_ref LIKE '% rel %/' || (SELECT oid FROM pg_database WHERE datname = current_database()) || '/%'`
	if err := w.conn.QueryRowContext(ctx, q, w.start).Scan(&r.Ours, &r.OursFPI); err != nil {
		w.b.log.Warn("cannot read the WAL back: the WAL figure is the whole cluster's", "err", err)
		r.Ours, r.OursFPI = -1, -1
	}
	return r
}

func (w *walWindow) close() {
	if w.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := w.conn.ExecContext(ctx, `SELECT pg_drop_replication_slot($1)`, w.slot); err != nil {
		// Discard the session instead: its end drops the temporary slot.
		w.conn.Raw(func(any) error { return driver.ErrBadConn }) //nolint:errcheck // the error is the point
	}
	w.conn.Close()
	w.conn = nil
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

// sample is one insert transaction: when it started, relative to the start
// of the run, how long it took from BEGIN to COMMIT and how many rows it
// inserted.
type sample struct {
	At, Took time.Duration
	Rows     int
}

// insertLoad runs cfg.Workers workers that insert new events the way the
// consumer does, dedup.Store.Claim inside postgres.InTx, cfg.Batch fresh ids
// of kind keys a transaction, until stop is closed. It returns every
// transaction.
func (b *bench) insertLoad(ctx context.Context, db *sqlx.DB, keys string, t0 time.Time, stop <-chan struct{}) ([]sample, error) {
	newID := uuid.NewV7
	if keys == "v4" {
		newID = uuid.NewV4
	}
	store := dedup.NewStore(group)
	var wg sync.WaitGroup
	results := make([][]sample, b.cfg.Workers)
	errs := make([]error, b.cfg.Workers)
	for w := range b.cfg.Workers {
		wg.Go(func() {
			entries := make([]dedup.Entry, b.cfg.Batch)
			for {
				select {
				case <-stop:
					return
				case <-ctx.Done():
					errs[w] = ctx.Err()
					return
				default:
				}
				for i := range entries {
					id, err := newID()
					if err != nil {
						errs[w] = err
						return
					}
					entries[i] = dedup.Entry{ID: id, Fingerprint: sha256.Sum256(id.Bytes())}
				}
				start := time.Now()
				first := 0
				err := postgres.InTx(ctx, db, func(tx *sqlx.Tx) error {
					verdicts, err := store.Claim(ctx, tx, entries)
					for _, v := range verdicts {
						if v == dedup.First {
							first++
						}
					}
					return err
				})
				if err != nil {
					errs[w] = err
					return
				}
				results[w] = append(results[w], sample{At: start.Sub(t0), Took: time.Since(start), Rows: first})
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("insert: %w", err)
	}
	return slices.Concat(results...), nil
}

// summarize gives the latencies of the samples that started in [from, to).
func summarize(all []sample, from, to time.Duration) latencies {
	var took []time.Duration
	rows := 0
	for _, s := range all {
		if s.At >= from && s.At < to {
			took = append(took, s.Took)
			rows += s.Rows
		}
	}
	l := latencies{N: len(took)}
	if len(took) == 0 {
		return l
	}
	slices.Sort(took)
	pct := func(p float64) time.Duration { return took[max(0, int(math.Ceil(p*float64(len(took))))-1)] }
	l.P50, l.P99, l.Max = pct(0.50), pct(0.99), took[len(took)-1]
	if to > from && to < math.MaxInt64 {
		l.RowsPerSec = float64(rows) / (to - from).Seconds()
	}
	return l
}

// inserts measures the steady-state insert rate into v's table for
// cfg.Duration, starting right after a checkpoint: as in production, where
// one comes every checkpoint_timeout or max_wal_size, the first change to
// each page after it writes the whole page to the WAL.
func (b *bench) inserts(ctx context.Context, v variant, sc string, round int) (InsertResult, error) {
	ir := InsertResult{Variant: v, SyncCommit: sc, Round: round, RowsBefore: b.rows[v.Schema]}
	db, err := b.pool(ctx, v, sc)
	if err != nil {
		return ir, err
	}
	defer db.Close()
	before, err := b.sizes(ctx, v, false)
	if err != nil {
		return ir, err
	}
	if err := b.checkpoint(ctx); err != nil {
		return ir, err
	}
	c0, err := b.counters(ctx, v.Schema)
	if err != nil {
		return ir, err
	}
	ww, err := b.beginWAL(ctx)
	if err != nil {
		return ir, err
	}
	defer ww.close()

	stop := make(chan struct{})
	t0 := time.Now()
	timer := time.AfterFunc(b.cfg.Duration, func() { close(stop) })
	defer timer.Stop()
	samples, err := b.insertLoad(ctx, db, v.Keys, t0, stop)
	if err != nil {
		return ir, fmt.Errorf("%s: %w", v.Name, err)
	}
	ir.Elapsed = time.Since(t0)
	if ir.WAL, err = ww.stop(ctx); err != nil {
		return ir, err
	}
	closePool(db)
	ir.WAL = ww.readBack(ctx, ir.WAL)
	c1, err := b.counters(ctx, v.Schema)
	if err != nil {
		return ir, err
	}
	after, err := b.sizes(ctx, v, false)
	if err != nil {
		return ir, err
	}
	ir.samples = samples
	ir.Tx = summarize(samples, 0, math.MaxInt64)
	for _, s := range samples {
		ir.Rows += int64(s.Rows)
	}
	b.rows[v.Schema] += ir.Rows
	ir.RowsPerSec = float64(ir.Rows) / ir.Elapsed.Seconds()
	ir.Tx.RowsPerSec = ir.RowsPerSec
	ir.IdxRead, ir.IdxHit, ir.HeapRead = c1.IdxRead-c0.IdxRead, c1.IdxHit-c0.IdxHit, c1.HeapRead-c0.HeapRead
	ir.PKeyGrowth = after.PKey - before.PKey
	ir.Load = loadavg()
	b.log.Info("inserts", "table", v.Name, "synchronous_commit", sc, "round", round+1, "rows", ir.Rows,
		"rows/s", int(ir.RowsPerSec), "p99", ir.Tx.P99, "wal/row", walPerRow(ir.WAL, ir.Rows),
		"checkpoints by others", ir.WAL.Checkpoints, "loadavg", ir.Load)
	return ir, nil
}

// remover removes the day'th day (0: the oldest) of a table and says how
// many rows it removed (-1: it cannot tell), in how many transactions, the
// slowest of which took slowest.
type remover func(ctx context.Context, day int) (rows int64, txs int, slowest time.Duration, err error)

// removal runs remove on day of v's table and measures it: with nothing
// else writing, for its time, WAL and the bloat it leaves (and, without
// partitions, the VACUUM that clears it); or underLoad, for what concurrent
// inserts see meanwhile.
func (b *bench) removal(ctx context.Context, v variant, method string, remove remover, day int, underLoad bool) (RemoveResult, error) {
	rr := RemoveResult{Variant: v, Method: method, Day: b.dataStart.AddDate(0, 0, day).Format(time.DateOnly), UnderLoad: underLoad}
	// Count the day's rows beforehand: a count is no part of a removal.
	const count = `SELECT count(*) FROM %s WHERE event_id >= processed_event_bound($1::date) AND event_id < processed_event_bound($1::date + 1)`
	if err := b.ctl.GetContext(ctx, &rr.Rows, fmt.Sprintf(count, v.table()), rr.Day); err != nil {
		return rr, fmt.Errorf("count the day's rows: %w", err)
	}
	var err error
	if rr.Before, err = b.sizes(ctx, v, !underLoad); err != nil {
		return rr, err
	}
	if err := b.checkpoint(ctx); err != nil {
		return rr, err
	}
	ww, err := b.beginWAL(ctx)
	if err != nil {
		return rr, err
	}
	defer ww.close()
	timed := func() error {
		t0 := time.Now()
		var err error
		removed, txs, slowest, err := remove(ctx, day)
		rr.Took = time.Since(t0)
		rr.Batches, rr.Slowest = txs, slowest
		if err == nil && removed >= 0 && removed != rr.Rows {
			err = fmt.Errorf("removed %d rows of the %d counted", removed, rr.Rows)
		}
		return err
	}
	if underLoad {
		rr.InsBefore, rr.InsDuring, err = b.window(ctx, v, timed)
	} else {
		err = timed()
	}
	if err != nil {
		return rr, fmt.Errorf("%s: %w", method, err)
	}
	b.rows[v.Schema] -= rr.Rows
	if rr.WAL, err = ww.stop(ctx); err != nil {
		return rr, err
	}
	time.Sleep(time.Second) // for the WAL flush, and the statistics remove pushed out
	rr.WAL = ww.readBack(ctx, rr.WAL)
	c, err := b.counters(ctx, v.Schema)
	if err != nil {
		return rr, err
	}
	rr.DeadTuples = c.NDeadTup
	if rr.After, err = b.sizes(ctx, v, !underLoad); err != nil {
		return rr, err
	}
	if v.Partitioned || underLoad {
		b.log.Info("removed a day", "table", v.Name, "method", method, "under load", underLoad, "rows", rr.Rows,
			"took", rr.Took, "insert p99 before", rr.InsBefore.P99, "during", rr.InsDuring.P99)
		return rr, nil
	}

	// Without partitions the day's rows are dead tuples until a VACUUM
	// (autovacuum would start at 20% of the table dead, by default). Look at
	// them, then time the VACUUM that clears them.
	if b.hasStat {
		if err := b.ctl.QueryRowContext(ctx, `SELECT dead_tuple_percent, free_percent FROM pgstattuple($1::regclass)`,
			v.table()).Scan(&rr.DeadPct, &rr.FreePct); err != nil {
			return rr, fmt.Errorf("pgstattuple: %w", err)
		}
	}
	vw, err := b.beginWAL(ctx)
	if err != nil {
		return rr, err
	}
	defer vw.close()
	t0 := time.Now()
	if _, err := b.ctl.ExecContext(ctx, `VACUUM `+v.table()); err != nil {
		return rr, fmt.Errorf("vacuum after delete: %w", err)
	}
	rr.Vacuum = time.Since(t0)
	vwal, err := vw.stop(ctx)
	if err != nil {
		return rr, err
	}
	vwal = vw.readBack(ctx, vwal)
	rr.VacuumWAL = &vwal
	av, err := b.sizes(ctx, v, true)
	if err != nil {
		return rr, err
	}
	rr.AfterVacuum = &av
	if b.hasStat {
		if err := b.ctl.GetContext(ctx, &rr.FreePctVacuum, `SELECT free_percent FROM pgstattuple($1::regclass)`, v.table()); err != nil {
			return rr, fmt.Errorf("pgstattuple: %w", err)
		}
	}
	b.log.Info("removed a day", "table", v.Name, "method", method, "rows", rr.Rows, "transactions", rr.Batches,
		"took", rr.Took, "vacuum", rr.Vacuum)
	return rr, nil
}

// window measures concurrent inserts into v's table around remove: it
// inserts for a while alone, then runs remove, then inserts a while more.
func (b *bench) window(ctx context.Context, v variant, remove func() error) (before, during latencies, err error) {
	db, err := b.pool(ctx, v, "on")
	if err != nil {
		return before, during, err
	}
	defer db.Close()
	side := min(max(b.cfg.Duration/4, time.Second), 5*time.Second)
	stop := make(chan struct{})
	t0 := time.Now()
	var samples []sample
	var insErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		samples, insErr = b.insertLoad(ctx, db, v.Keys, t0, stop)
	}()
	sleep(ctx, side)
	from := time.Since(t0)
	remErr := remove()
	to := time.Since(t0)
	sleep(ctx, side)
	close(stop)
	<-done
	if err := errors.Join(remErr, insErr); err != nil {
		return before, during, err
	}
	for _, s := range samples {
		b.rows[v.Schema] += int64(s.Rows)
	}
	return summarize(samples, 0, from), summarize(samples, from, to), nil
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// dropPartition removes a day of billing's partitioned table the way
// billing does: dedup.Retention detaches its partition CONCURRENTLY, which
// does not block inserts, then drops it.
func (b *bench) dropPartition(ctx context.Context, day int) (int64, int, time.Duration, error) {
	d := b.dataStart.AddDate(0, 0, day)
	victim := "processed_event_p" + d.Format("20060102")
	// A retention whose horizon is the end of that day. keep is measured
	// from now, so Run's horizon can only fall a little later, never before
	// the end of the day: it drops that partition and no other.
	cut := d.AddDate(0, 0, 1)
	r := dedup.NewRetention(b.ctl, time.Since(cut), 3, metrics.New(prometheus.NewRegistry()), b.log)
	t0 := time.Now()
	rep, err := r.Run(ctx)
	if err != nil {
		return 0, 0, 0, err
	}
	took := time.Since(t0)
	if !slices.Equal(rep.Dropped, []string{victim}) {
		return 0, 0, 0, fmt.Errorf("retention dropped %v, want [%s]", rep.Dropped, victim)
	}
	return -1, 1, took, nil
}

// deleteDay removes a day of the unpartitioned v7 table by DELETEs of
// cfg.DeleteBatch rows, each its own transaction, walking the primary key
// from where the last batch ended (keyset pagination: no batch rescans the
// dead entries of the earlier ones). A v7 day is one key range; a v4 table
// would need one more index, on processed_at, to find a day at all.
func (b *bench) deleteDay(ctx context.Context, day int) (rows int64, txs int, slowest time.Duration, err error) {
	var lo, hi string
	d := b.dataStart.AddDate(0, 0, day).Format(time.DateOnly)
	if err := b.ctl.QueryRowContext(ctx, `SELECT processed_event_bound($1::date)::text, processed_event_bound($1::date + 1)::text`,
		d).Scan(&lo, &hi); err != nil {
		return 0, 0, 0, fmt.Errorf("day bounds: %w", err)
	}
	q := `
WITH batch AS (
    SELECT event_id, consumer_group FROM ` + plainV7.table() + `
    WHERE (event_id, consumer_group) > ($1::uuid, $2::text) AND event_id < $3::uuid
    ORDER BY event_id, consumer_group
    LIMIT $4
), gone AS (
    DELETE FROM ` + plainV7.table() + ` p USING batch
    WHERE p.event_id = batch.event_id AND p.consumer_group = batch.consumer_group
    RETURNING p.event_id, p.consumer_group
)
SELECT (SELECT count(*) FROM gone),
       coalesce((SELECT event_id::text FROM gone ORDER BY event_id DESC, consumer_group DESC LIMIT 1), ''),
       coalesce((SELECT consumer_group FROM gone ORDER BY event_id DESC, consumer_group DESC LIMIT 1), '')`
	conn, err := b.ctl.Connx(ctx)
	if err != nil {
		return 0, 0, 0, err
	}
	defer conn.Close()
	// Below the day's smallest key: its lower bound with an empty group.
	lastID, lastGroup := lo, ""
	for {
		t0 := time.Now()
		var n int64
		var id, grp string
		if err := conn.QueryRowxContext(ctx, q, lastID, lastGroup, hi, b.cfg.DeleteBatch).Scan(&n, &id, &grp); err != nil {
			return rows, txs, slowest, fmt.Errorf("delete batch: %w", err)
		}
		if n == 0 {
			break
		}
		slowest = max(slowest, time.Since(t0))
		txs++
		rows += n
		lastID, lastGroup = id, grp
	}
	// Publish this session's statistics (n_dead_tup) now, not in 10s.
	if _, err := conn.ExecContext(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		return rows, txs, slowest, fmt.Errorf("flush statistics: %w", err)
	}
	return rows, txs, slowest, nil
}

// --- Report

// insertSummary pools the rounds of one table and setting.
type insertSummary struct {
	v               variant
	sc              string
	rowsBefore      int64
	rates           []float64
	rows            int64
	tx              latencies
	wal             WAL
	idxRead, idxHit int64
	pkeyGrowth      int64
	loads           []string
}

func summarizeInserts(all []InsertResult) []*insertSummary {
	var out []*insertSummary
	byKey := map[string]*insertSummary{}
	for _, ir := range all {
		k := ir.Variant.Schema + "/" + ir.SyncCommit
		s, ok := byKey[k]
		if !ok {
			s = &insertSummary{v: ir.Variant, sc: ir.SyncCommit, rowsBefore: ir.RowsBefore}
			byKey[k] = s
			out = append(out, s)
		}
		s.rates = append(s.rates, ir.RowsPerSec)
		s.rows += ir.Rows
		s.wal = s.wal.add(ir.WAL)
		s.idxRead += ir.IdxRead
		s.idxHit += ir.IdxHit
		s.pkeyGrowth += ir.PKeyGrowth
		s.loads = append(s.loads, strings.Fields(ir.Load)[0])
	}
	for _, s := range out {
		var samples []sample
		for _, ir := range all {
			if ir.Variant.Schema == s.v.Schema && ir.SyncCommit == s.sc {
				samples = append(samples, ir.samples...)
			}
		}
		s.tx = summarize(samples, 0, math.MaxInt64)
	}
	return out
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func report(w io.Writer, r Results) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	m := r.Machine
	p("## Dedup store (`make bench-dedup`)\n\n")
	p("Run %s, wall time %s: %d rows a table over %d days; inserts by %d workers, %d rows a transaction, %d round(s) of %s per table and setting; DELETE batches of %d.\n\n",
		r.Started.Format(time.RFC3339), r.Wall.Round(time.Second), r.Config.Rows, days, r.Config.Workers, r.Config.Batch,
		r.Config.Rounds, r.Config.Duration, r.Config.DeleteBatch)
	p("Machine: %d CPUs, %s RAM; load average %s at start, %s at end. %s.\n\n", m.CPUs, m.MemTotal, m.LoadStart, m.LoadEnd, m.Server)
	var set []string
	for _, k := range slices.Sorted(maps.Keys(m.Settings)) {
		set = append(set, k+"="+m.Settings[k])
	}
	p("Settings: %s.\n\n", strings.Join(set, ", "))

	p("### Tables after the bulk load\n\n")
	p("| table | rows | load time | rows/s | VACUUM ANALYZE | heap | PK index | pg_indexes_size | total | PK leaf density | PK levels |\n")
	p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, l := range r.Loads {
		s := l.Sizes
		p("| %s | %d | %s | %.0f | %s | %s | %s | %s | %s | %s | %s |\n", l.Variant.Name, l.Rows,
			l.Took.Round(100*time.Millisecond), float64(l.Rows)/l.Took.Seconds(), l.Vacuum.Round(100*time.Millisecond),
			mb(s.Heap), mb(s.PKey), mb(s.Indexes), mb(s.Total), pct(s.LeafDensity, m.HasStat), levels(s.Levels, m.HasStat))
	}

	p("\n### Steady-state inserts (each round %s from a CHECKPOINT; rates: median of the rounds, min–max)\n\n", r.Config.Duration)
	p("| table | synchronous_commit | rows in table | rows/s | tx p50 | tx p99 | tx max | WAL bytes/row | of which full-page images | index blocks read from outside shared_buffers /1k rows | index buffer hits/row | PK growth bytes/row | others' checkpoints | load average (1 min) |\n")
	p("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range summarizeInserts(r.Inserts) {
		p("| %s | %s | %d | %.0f (%.0f–%.0f) | %s | %s | %s | %s | %s | %s | %s | %s | %d | %s |\n", s.v.Name, s.sc, s.rowsBefore,
			median(s.rates), slices.Min(s.rates), slices.Max(s.rates), msStr(s.tx.P50), msStr(s.tx.P99), msStr(s.tx.Max),
			walPerRow(s.wal, s.rows), fpiPerRow(s.wal, s.rows), per1k(s.idxRead, s.rows), perRow(s.idxHit, s.rows),
			perRow(s.pkeyGrowth, s.rows), s.wal.Checkpoints, strings.Join(s.loads, ", "))
	}

	p("\n### Removing the oldest day, nothing else writing\n\n")
	p("| table | method | rows removed | time | transactions (slowest) | WAL | table+indexes before → after | PK index before → after | n_dead_tup after | VACUUM | after VACUUM: table+indexes (PK; free PK pages) |\n")
	p("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var notes []string
	for _, x := range r.Removals {
		if x.UnderLoad {
			continue
		}
		vac, avs := "not needed", "—"
		if x.AfterVacuum != nil {
			vac = x.Vacuum.Round(100*time.Millisecond).String() + ", WAL " + walStr(*x.VacuumWAL)
			avs = fmt.Sprintf("%s (%s; %d)", mb(x.AfterVacuum.Total), mb(x.AfterVacuum.PKey), x.AfterVacuum.FreePages)
		}
		p("| %s | %s | %d | %s | %d (%s) | %s | %s → %s | %s → %s | %d | %s | %s |\n", x.Variant.Name, x.Method, x.Rows,
			x.Took.Round(time.Millisecond), x.Batches, x.Slowest.Round(time.Millisecond), walStr(x.WAL),
			mb(x.Before.Total), mb(x.After.Total), mb(x.Before.PKey), mb(x.After.PKey), x.DeadTuples, vac, avs)
		if x.AfterVacuum != nil && m.HasStat {
			notes = append(notes, fmt.Sprintf("\npgstattuple of the unpartitioned table after the DELETE: %.1f%% dead tuples, %.1f%% free space; after the VACUUM: %.1f%% free space. Its PK's leaf density: %.1f%% before, %.1f%% after the DELETE, %.1f%% after the VACUUM.\n",
				x.DeadPct, x.FreePct, x.FreePctVacuum, x.Before.LeafDensity, x.After.LeafDensity, x.AfterVacuum.LeafDensity))
		}
	}
	for _, n := range notes {
		p("%s", n)
	}

	p("\n### Removing the next day while %d workers insert into the same table (synchronous_commit=on)\n\n", r.Config.Workers)
	p("| table | method | rows removed | time | before: tx | p50 | p99 | max | rows/s | during: tx | p50 | p99 | max | rows/s |\n")
	p("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, x := range r.Removals {
		if !x.UnderLoad {
			continue
		}
		a, d := x.InsBefore, x.InsDuring
		p("| %s | %s | %d | %s | %d | %s | %s | %s | %.0f | %d | %s | %s | %s | %.0f |\n", x.Variant.Name, x.Method, x.Rows,
			x.Took.Round(time.Millisecond), a.N, msStr(a.P50), msStr(a.P99), msStr(a.Max), a.RowsPerSec,
			d.N, msStr(d.P50), msStr(d.P99), msStr(d.Max), d.RowsPerSec)
	}
}

func walStr(w WAL) string {
	if w.Ours < 0 {
		return mb(w.Cluster) + " (whole cluster)"
	}
	return mb(w.Ours)
}

func walPerRow(w WAL, rows int64) string {
	if w.Ours < 0 {
		return perRow(w.Cluster, rows) + " (whole cluster)"
	}
	return perRow(w.Ours, rows)
}

func fpiPerRow(w WAL, rows int64) string {
	if w.Ours < 0 {
		return "—"
	}
	return perRow(w.OursFPI, rows)
}

func mb(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/(1<<20)) }

func msStr(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/1e6) }

func perRow(n, rows int64) string {
	if rows == 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f", float64(n)/float64(rows))
}

func per1k(n, rows int64) string {
	if rows == 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f", 1000*float64(n)/float64(rows))
}

func pct(v float64, ok bool) string {
	if !ok {
		return "—"
	}
	return fmt.Sprintf("%.1f%%", v)
}

func levels(n int, ok bool) string {
	if !ok {
		return "—"
	}
	return strconv.Itoa(n)
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func memTotal() string {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return "?"
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			if kb, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				return fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
			}
		}
	}
	return "?"
}
