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
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"

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
	fs.IntVar(&c.Batch, "batch", 16, "events per insert transaction (billing's group commit takes up to 128)")
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
