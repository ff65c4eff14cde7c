package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"example.com/billing/internal/postgres"
	"example.com/billing/internal/schema"
)

// pgbenchScript is billing's SQL for one event, as its two transactions:
// the claim (the dedup insert, the order lock, the read of the order's
// attempts, the pending attempt) and the settle (the update and its read
// back). The event id is a UUID v7 made from the clock, as billing's are.
// One script run is one event, so pgbench's tps are events/s.
const pgbenchScript = `\set order random(1, 1000000000000)
SELECT (lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') || '7' || substr(md5(random()::text), 1, 3) || '8' || substr(md5(random()::text), 1, 15))::uuid AS id \gset
BEGIN;
INSERT INTO processed_event (event_id, consumer_group, fingerprint, claimed_with)
  VALUES (:id, 'pgbench', sha256(:id::text::bytea), 2) ON CONFLICT DO NOTHING RETURNING event_id;
SELECT count(pg_advisory_xact_lock(1651076204, hashint8(:order)));
SELECT event_id, status FROM charge WHERE order_id = :order;
INSERT INTO charge (event_id, order_id, customer_id, amount_minor, currency, status)
  VALUES (:id, :order, 1, 1999, 'EUR', 'pending');
COMMIT;
BEGIN;
UPDATE charge SET status = 'succeeded', provider_charge_id = 'ch_pgbench', settled_at = now(), updated_at = now(),
  requests = requests + 1, counted_by = 'pgbench'
  WHERE event_id = :id AND status = 'pending' RETURNING event_id;
SELECT status FROM charge WHERE event_id = :id;
COMMIT;
`

// seedSchema is the seed's dedup table (its DDL, R-KFK-IDEM-2: the
// event id alone as the key, an index on processed_at) and a business row
// as billing's first migration kept it, settled at once: the seed claims
// and charges in one transaction, with the provider called inside it.
const seedSchema = `
CREATE TABLE processed_event (
    event_id       uuid        PRIMARY KEY,
    consumer_group text        NOT NULL,
    processed_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ix_processed_event_processed_at ON processed_event (processed_at);
CREATE TABLE charge (
    event_id           uuid        PRIMARY KEY,
    order_id           bigint      NOT NULL CHECK (order_id > 0),
    customer_id        bigint      NOT NULL CHECK (customer_id > 0),
    amount_minor       bigint      NOT NULL CHECK (amount_minor > 0),
    currency           char(3)     NOT NULL,
    status             text        NOT NULL CHECK (status IN ('succeeded', 'declined')),
    provider_charge_id text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    CHECK ((status = 'succeeded') = (provider_charge_id IS NOT NULL))
);
CREATE UNIQUE INDEX charge_one_success_per_order ON charge (order_id) WHERE status = 'succeeded';
CREATE INDEX charge_created_at ON charge (created_at);
`

// seedScript is the seed's SQL for one event: the dedup insert and the
// charge in one transaction (a provider charge id as long as fakepsp's).
const seedScript = `\set order random(1, 1000000000000)
SELECT (lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') || '7' || substr(md5(random()::text), 1, 3) || '8' || substr(md5(random()::text), 1, 15))::uuid AS id \gset
BEGIN;
INSERT INTO processed_event (event_id, consumer_group) VALUES (:id, 'billing-order-confirmed') ON CONFLICT DO NOTHING;
INSERT INTO charge (event_id, order_id, customer_id, amount_minor, currency, status, provider_charge_id)
  VALUES (:id, :order, 1, 1999, 'EUR', 'succeeded', 'ch_' || substr(md5(random()::text), 1, 24));
COMMIT;
`

// sqlBench is one per-event SQL that pgbench runs: its schema and its
// script, one script run per event.
type sqlBench struct {
	label  string
	setup  func(ctx context.Context, dsn string) error
	script string
}

var sqlBenches = []sqlBench{
	{label: "pgbench, billing's per-event SQL (claim, settle)", setup: migrate, script: pgbenchScript},
	{label: "pgbench, the seed's per-event SQL (claim and charge in one transaction)", setup: func(ctx context.Context, dsn string) error {
		db, err := postgres.Open(dsn, 1)
		if err != nil {
			return err
		}
		defer db.Close()
		_, err = db.ExecContext(ctx, seedSchema)
		return err
	}, script: seedScript},
}

func migrate(ctx context.Context, dsn string) error {
	db, err := postgres.Open(dsn, 2)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = schema.Migrate(ctx, db.DB, discardLogger())
	return err
}

// runPgbench runs each per-event SQL of sqlBenches with 16 clients for d
// on a fresh database and returns, as results of their own (broker
// "pgbench", one event per script run), its transactions per second and,
// on the benchmark's own cluster, what they cost the database.
func runPgbench(server string, pg *pgCluster, d time.Duration) ([]result, error) {
	var out []result
	for _, b := range sqlBenches {
		r, err := runSQLBench(server, pg, d, b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b.label, err)
		}
		out = append(out, r)
	}
	return out, nil
}

func runSQLBench(server string, pg *pgCluster, d time.Duration, b sqlBench) (result, error) {
	ctx := context.Background()
	fmt.Printf("--- %s, 16 clients, %s\n", b.label, d)
	r := result{scenario: scenario{name: b.label}, broker: "pgbench"}
	const dbName = "billing_bench_pgbench"
	dsn, drop, err := freshDatabase(server, dbName)
	if err != nil {
		return r, err
	}
	defer drop()
	if err := b.setup(ctx, dsn); err != nil {
		return r, err
	}
	dir, err := os.MkdirTemp("", "pgbench")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	script := filepath.Join(dir, "events.sql")
	if err := os.WriteFile(script, []byte(b.script), 0o600); err != nil {
		return r, err
	}
	dbw, err := beginDB(ctx, pg)
	if err != nil {
		return r, err
	}
	out, err := exec.Command(pg.program("pgbench"), "-n", "-M", "prepared", "-c", "16", "-j", "2",
		"-T", strconv.Itoa(int(d.Seconds())), "-f", script, dsn).CombinedOutput()
	if err != nil {
		return r, fmt.Errorf("%w\n%s", err, out)
	}
	if dbw != nil {
		if r.db, err = dbw.end(ctx, dbName, true); err != nil {
			return r, err
		}
	}
	tps := regexp.MustCompile(`tps = ([0-9.]+)`).FindSubmatch(out)
	n := regexp.MustCompile(`number of transactions actually processed: ([0-9]+)`).FindSubmatch(out)
	if tps == nil || n == nil {
		return r, fmt.Errorf("no tps in pgbench output:\n%s", out)
	}
	r.eventsPerS, _ = strconv.ParseFloat(string(tps[1]), 64)
	r.produced, _ = strconv.Atoi(string(n[1]))
	fmt.Printf("    %.0f transactions/s\n", r.eventsPerS)
	if r.db.measured {
		fmt.Printf("    database: %s\n", describeDB(r))
	}
	return r, nil
}
