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

// runPgbench runs billing's per-event SQL with 16 clients on a fresh
// migrated database and returns its transactions per second.
func runPgbench(server string, d time.Duration) (float64, error) {
	fmt.Printf("--- pgbench: billing's per-event transaction, 16 clients, %s\n", d)
	dsn, drop, err := freshDatabase(server, "billing_bench_pgbench")
	if err != nil {
		return 0, err
	}
	defer drop()
	db, err := postgres.Open(dsn, 2)
	if err != nil {
		return 0, err
	}
	err = postgres.Migrate(context.Background(), db.DB, discardLogger())
	db.Close()
	if err != nil {
		return 0, err
	}
	dir, err := os.MkdirTemp("", "pgbench")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	script := filepath.Join(dir, "billing.sql")
	if err := os.WriteFile(script, []byte(pgbenchScript), 0o600); err != nil {
		return 0, err
	}
	out, err := exec.Command(pgBin("pgbench"), "-n", "-M", "prepared", "-c", "16", "-j", "2",
		"-T", strconv.Itoa(int(d.Seconds())), "-f", script, dsn).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("%w\n%s", err, out)
	}
	m := regexp.MustCompile(`tps = ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("no tps in pgbench output:\n%s", out)
	}
	tps, _ := strconv.ParseFloat(string(m[1]), 64)
	fmt.Printf("    %.0f transactions/s\n", tps)
	return tps, nil
}
