package migrations_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"example.com/billing/internal/postgres"
	"example.com/billing/internal/testenv/dbtest"
)

// runtimePrivileges is everything billing_runtime may do, table by table,
// after the migrations: what serve needs, nothing more. A migration that
// adds a table must decide what serve may do with it, and say so here.
var runtimePrivileges = map[string][]string{
	"billing_lease":           {"INSERT", "SELECT", "UPDATE"},
	"billing_replica":         {"INSERT", "SELECT", "UPDATE"},
	"charge":                  {"INSERT", "SELECT", "UPDATE"},
	"charge_waiting":          {"DELETE", "INSERT", "SELECT"},
	"charging_state":          {"INSERT", "SELECT", "UPDATE"},
	"fleet_member":            {"DELETE", "INSERT", "SELECT", "UPDATE"},
	"notified_payment":        {"INSERT", "SELECT"},
	"consumer_position":       {"INSERT", "SELECT", "UPDATE"},
	"goose_db_version":        {"SELECT"},
	"goose_db_version_id_seq": nil,
	// goose's migration lock (a lease of its own), which only migrate,
	// run as the owner, takes.
	"goose_lock":              nil,
	"outbox":                  {"DELETE", "INSERT", "SELECT", "UPDATE"},
	"outbox_dead":             {"INSERT", "SELECT"},
	"outbox_seq":              {"USAGE"},
	"operator_action":         {"INSERT", "SELECT"},
	"operator_action_id_seq":  nil,
	"payment_budget":          {"INSERT", "SELECT", "UPDATE"},
	"payment_method":          {"SELECT"},
	"processed_event":         {"INSERT", "SELECT"},
	"processed_event_horizon": {"SELECT"},
	"schema_compatibility":    {"SELECT"},
}

// Every table and sequence of the schema (partitions aside: they are
// reached through their parent, whose privileges apply) grants
// billing_runtime exactly what runtimePrivileges says.
func TestRuntimeRole_HasExactlyItsPrivileges(t *testing.T) {
	db, _ := dbtest.New(t)
	const q = `
SELECT c.relname, p.priv
FROM pg_class c
CROSS JOIN unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER', 'USAGE']) AS p(priv)
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p', 'S') AND NOT c.relispartition
  AND CASE WHEN c.relkind = 'S' THEN p.priv IN ('SELECT', 'UPDATE', 'USAGE') AND has_sequence_privilege('billing_runtime', c.oid, p.priv)
           ELSE p.priv <> 'USAGE' AND has_table_privilege('billing_runtime', c.oid, p.priv) END
UNION ALL
SELECT c.relname, NULL FROM pg_class c
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p', 'S') AND NOT c.relispartition`
	var rows []struct {
		Rel  string  `db:"relname"`
		Priv *string `db:"priv"`
	}
	if err := db.Select(&rows, q); err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, r := range rows {
		if r.Priv == nil {
			if _, ok := got[r.Rel]; !ok {
				got[r.Rel] = nil
			}
			continue
		}
		got[r.Rel] = append(got[r.Rel], *r.Priv)
	}
	for rel := range got {
		slices.Sort(got[rel])
		if _, ok := runtimePrivileges[rel]; !ok {
			t.Errorf("table %s: billing_runtime may %q of it, and runtimePrivileges does not say what serve needs of it", rel, got[rel])
		}
	}
	for rel, want := range runtimePrivileges {
		if have, ok := got[rel]; !ok || !slices.Equal(have, want) {
			t.Errorf("billing_runtime on %s: %q, want %q", rel, have, want)
		}
	}
}

// A role with billing_runtime does what serve does, through the parents and
// ensure_day_partition, and can destroy nothing: no DROP, TRUNCATE, DELETE
// or ALTER of billing's tables, no table of its own, no partition of
// another table, no dropped day of processed_event brought back.
func TestRuntimeRole_CannotDropTruncateOrCreate(t *testing.T) {
	owner, dsn := dbtest.New(t)
	app := runtimeLogin(t, owner, dsn)
	ctx := context.Background()

	today := time.Now().UTC().Truncate(24 * time.Hour)
	if _, err := app.ExecContext(ctx, `SELECT ensure_day_partition('processed_event'::regclass, $1::date)`, today.AddDate(0, 0, 20)); err != nil {
		t.Fatalf("billing_runtime creating a partition ahead: %v", err)
	}
	var partOwner string
	if err := owner.Get(&partOwner, `SELECT pg_get_userbyid(relowner) FROM pg_class WHERE relname = $1`,
		"processed_event_p"+today.AddDate(0, 0, 20).Format("20060102")); err != nil || partOwner != "postgres" {
		t.Fatalf("the new partition is owned by %q (%v), want the tables' owner", partOwner, err)
	}
	if _, err := app.ExecContext(ctx, `INSERT INTO charge (event_id, order_id, customer_id, amount_minor, currency, status)
		VALUES (gen_random_uuid(), 1, 2, 100, 'EUR', 'pending')`); err != nil {
		t.Fatalf("billing_runtime inserting a charge: %v", err)
	}

	denied := []string{
		`DROP TABLE charge`,
		`DROP TABLE processed_event`,
		`TRUNCATE charge`,
		`TRUNCATE processed_event`,
		`TRUNCATE outbox`,
		`DELETE FROM charge`,
		`DELETE FROM processed_event`,
		`DELETE FROM outbox_dead`,
		`ALTER TABLE charge DROP CONSTRAINT charge_status_check`,
		`ALTER TABLE processed_event DETACH PARTITION processed_event_p` + today.Format("20060102"),
		`DROP TABLE processed_event_p` + today.Format("20060102"),
		`UPDATE processed_event_horizon SET dropped_before = '2999-01-01'`,
		`CREATE TABLE mine (id int)`,
		`SELECT ensure_day_partition('charge'::regclass, current_date)`,
		// A stand-in of the caller's own, where the function would act as
		// the owner.
		`CREATE TEMP TABLE outbox (event_id uuid) PARTITION BY RANGE (event_id); SELECT ensure_day_partition('pg_temp.outbox'::regclass, current_date)`,
	}
	for _, q := range denied {
		_, err := app.ExecContext(ctx, q)
		var pqErr *pq.Error
		if !errors.As(err, &pqErr) || pqErr.Code != "42501" {
			t.Errorf("billing_runtime: %s = %v, want insufficient_privilege (42501)", q, err)
		}
	}

	// A day retention dropped stays dropped, whoever asks.
	if _, err := owner.Exec(`INSERT INTO processed_event_horizon (dropped_before) VALUES (current_date - 5)`); err != nil {
		t.Fatal(err)
	}
	if _, err := app.ExecContext(ctx, `SELECT ensure_day_partition('processed_event'::regclass, current_date - 30)`); err == nil ||
		!strings.Contains(err.Error(), "not created again") {
		t.Errorf("billing_runtime re-creating a dropped day: %v, want a refusal", err)
	}
}

// runtimeLogin creates a login role that is a member of billing_runtime
// only (dropped when the test ends) and returns a pool on dsn as it. The
// local test server trusts local connections: no password here (the
// secured cluster of cmd/billing's tests checks passwords and TLS).
func runtimeLogin(t *testing.T, owner *sqlx.DB, dsn string) *sqlx.DB {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	role := "billing_app_" + hex.EncodeToString(b)
	if _, err := owner.Exec(`CREATE ROLE ` + role + ` LOGIN IN ROLE billing_runtime`); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	app, err := postgres.Open(u.String(), 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		app.Close()
		// Runs before dbtest drops the database: the role owns nothing.
		if _, err := owner.Exec(`DROP ROLE ` + role); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	return app
}
