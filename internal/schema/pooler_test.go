package schema_test

import (
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"example.com/billing/internal/schema"
	"example.com/billing/internal/testenv/dbtest"
	"example.com/billing/internal/testenv/pgbouncer"
)

func TestMigrations_SessionSettings(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		up   string
		want bool
	}{
		{"OK_SetLocal", "SET LOCAL lock_timeout = '1s';\nALTER TABLE charge ADD COLUMN x int;\n", false},
		{"OK_SetInAnotherStatement", "ALTER TABLE charge SET (fillfactor = 70);\nUPDATE charge SET x = 1 WHERE false;\n", false},
		{"OK_SetConfigLocal", "SELECT set_config('lock_timeout', '1s', true);\n", false},
		{"ErrSet", "SET lock_timeout = '1s';\nCREATE INDEX CONCURRENTLY i ON charge (x);\nRESET lock_timeout;\n", true},
		{"ErrSetTo", "set statement_timeout to 0;\n", true},
		{"ErrSetSession", "SET SESSION lock_timeout = '1s';\n", true},
		{"ErrReset", "RESET lock_timeout;\n", true},
		{"ErrSetConfigSession", "SELECT set_config('lock_timeout', '1s', false);\n", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fsys := fstest.MapFS{"00001_a.sql": {Data: []byte("-- +goose NO TRANSACTION\n-- +goose Up\n" + tt.up + "-- +goose Down\nSET lock_timeout = '1s';\n")}}
			ms, err := schema.MigrationsOf(fsys)
			if err != nil {
				t.Fatal(err)
			}
			if ms[0].Session != tt.want {
				t.Errorf("Session = %v, want %v", ms[0].Session, tt.want)
			}
		})
	}
}

// Of billing's own migrations, only 00010 sets its session's lock_timeout
// (a NO TRANSACTION migration, from before the leases): a new migration
// uses SET LOCAL.
func TestMigrations_OnlyTheTenthChangesItsSession(t *testing.T) {
	t.Parallel()
	ms, err := schema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Session != (m.Version == 10) {
			t.Errorf("%s: Session = %v", m.Path, m.Session)
		}
	}
}

// Through PgBouncer in transaction mode, migrate applies what it can and
// stops, naming the pool mode, at the migration that would leave a session
// setting behind; over a direct connection it applies it; afterwards,
// runs through the pooler, several at once, find nothing to do, without
// waiting for one another's lock for long, and leave nothing held.
func TestMigrate_ThroughATransactionPooler(t *testing.T) {
	t.Parallel()
	direct := dbtest.Empty(t)
	bouncer := pgbouncer.Require(t, direct, pgbouncer.Options{Mode: pgbouncer.Transaction, PoolSize: 2})
	pooled := dbtest.Open(t, bouncer.URL(direct), 2)

	_, err := schema.Migrate(dbtest.Context(t), pooled.DB, discard())
	if err == nil || !strings.Contains(err.Error(), "00010_lighter_writes.sql") || !strings.Contains(err.Error(), "pool mode transaction") {
		t.Fatalf("Migrate through the pooler = %v, want it refused at 00010 naming the pool mode", err)
	}
	if v, err := schema.Current(dbtest.Context(t), pooled); err != nil || v != 9 {
		t.Errorf("through the pooler, applied up to %d (%v), want 9 (the migrations before 00010)", v, err)
	}

	db := dbtest.Open(t, direct, 2)
	migrate(t, db)

	const runs = 4
	var wg sync.WaitGroup
	errs := make([]error, runs)
	took := make([]time.Duration, runs)
	for i := range runs {
		pool := dbtest.Open(t, bouncer.URL(direct), 2)
		wg.Go(func() {
			began := time.Now()
			_, errs[i] = schema.Migrate(dbtest.Context(t), pool.DB, discard())
			took[i] = time.Since(began)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Migrate %d through the pooler with nothing pending: %v", i, err)
		}
	}
	t.Logf("%d concurrent migrate runs through the pooler, nothing pending: %v", runs, took)
	if n := count(t, db, `SELECT count(*) FROM goose_lock WHERE locked`); n != 0 {
		t.Errorf("goose_lock: %d locks held after every migrate ended", n)
	}
	if n := count(t, db, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`); n != 0 {
		t.Errorf("%d advisory locks held after every migrate ended", n)
	}
}
