package schema_test

import (
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"example.com/billing/db/migrations"
	"example.com/billing/internal/schema"
	"example.com/billing/internal/testenv/dbtest"
)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// migrate applies every embedded migration to db, and fails t unless all
// were.
func migrate(t *testing.T, db *sqlx.DB) schema.Report {
	t.Helper()
	rep, err := schema.Migrate(dbtest.Context(t), db.DB, discard())
	if err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if len(rep.Pending) > 0 {
		t.Fatalf("Migrate left %d migrations pending: %v", len(rep.Pending), rep.Refused)
	}
	return rep
}

func count(t *testing.T, db *sqlx.DB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := db.GetContext(dbtest.Context(t), &n, q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// embeddedVersions are the versions of the migration files billing carries.
func embeddedVersions(t *testing.T) []int64 {
	t.Helper()
	files, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("no embedded migrations (%v)", err)
	}
	var versions []int64
	for _, f := range files {
		prefix, _, _ := strings.Cut(f, "_")
		v, err := strconv.ParseInt(prefix, 10, 64)
		if err != nil {
			t.Fatalf("migration %s has no numeric version", f)
		}
		versions = append(versions, v)
	}
	return versions
}

// versionRow is one row of goose's tracking table.
type versionRow struct {
	ID        int64     `db:"id"`
	VersionID int64     `db:"version_id"`
	IsApplied bool      `db:"is_applied"`
	Tstamp    time.Time `db:"tstamp"`
}

func versionRows(t *testing.T, db *sqlx.DB) []versionRow {
	t.Helper()
	var rows []versionRow
	if err := db.SelectContext(dbtest.Context(t), &rows, `SELECT id, version_id, is_applied, tstamp FROM goose_db_version ORDER BY id`); err != nil {
		t.Fatalf("read goose_db_version: %v", err)
	}
	return rows
}

// checkAppliedOnce asserts one applied row per embedded version.
func checkAppliedOnce(t *testing.T, db *sqlx.DB) {
	t.Helper()
	perVersion := map[int64]int{}
	for _, r := range versionRows(t, db) {
		if r.VersionID > 0 && r.IsApplied {
			perVersion[r.VersionID]++
		}
	}
	want := map[int64]int{}
	for _, v := range embeddedVersions(t) {
		want[v] = 1
	}
	if !maps.Equal(perVersion, want) {
		t.Errorf("applied rows per version = %v, want %v", perVersion, want)
	}
	for _, table := range []string{"processed_event", "charge"} {
		var exists bool
		if err := db.GetContext(dbtest.Context(t), &exists, `SELECT to_regclass($1) IS NOT NULL`, table); err != nil || !exists {
			t.Errorf("table %s missing after Migrate (err %v)", table, err)
		}
	}
}

func TestMigrate(t *testing.T) {
	t.Parallel()

	t.Run("OK_SecondRunIsNoop", func(t *testing.T) {
		t.Parallel()
		db := dbtest.Open(t, dbtest.Empty(t), 2)
		migrate(t, db)
		checkAppliedOnce(t, db)
		before := versionRows(t, db)

		migrate(t, db)
		if after := versionRows(t, db); !slices.Equal(after, before) {
			t.Errorf("second Migrate changed goose_db_version:\nbefore %+v\n after %+v", before, after)
		}
	})

	t.Run("OK_SixConcurrentRuns", func(t *testing.T) {
		t.Parallel()
		dsn := dbtest.Empty(t)
		const runs = 6
		// One pool per run, as six pods would have.
		pools := make([]*sqlx.DB, runs)
		for i := range pools {
			pools[i] = dbtest.Open(t, dsn, 2)
		}
		start := make(chan struct{})
		errs := make([]error, runs)
		var wg sync.WaitGroup
		for i, db := range pools {
			wg.Go(func() {
				<-start
				_, errs[i] = schema.Migrate(dbtest.Context(t), db.DB, discard())
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("Migrate run %d: %v", i, err)
			}
		}
		checkAppliedOnce(t, pools[0])
	})
}

// TestSchemaVersion: serve compares the database's schema version with
// Version to refuse an unmigrated database; the two must agree once the
// embedded migrations are applied, and a database that never saw a
// migration is at 0, without SchemaVersion creating anything.
func TestSchemaVersion(t *testing.T) {
	t.Parallel()
	want, err := schema.Version()
	if err != nil {
		t.Fatal(err)
	}
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil || len(names) == 0 {
		t.Fatalf("no embedded migrations: %v", err)
	}
	if last, _ := strconv.ParseInt(strings.SplitN(names[len(names)-1], "_", 2)[0], 10, 64); want != last {
		t.Errorf("Version() = %d, want %d, the version of the last migration (%s)", want, last, names[len(names)-1])
	}

	db := dbtest.Open(t, dbtest.Empty(t), 2)
	if got, err := schema.Current(dbtest.Context(t), db); err != nil || got != 0 {
		t.Errorf("SchemaVersion of an empty database = %d, %v; want 0", got, err)
	}
	if n := count(t, db, `SELECT count(*) FROM pg_tables WHERE tablename = 'goose_db_version'`); n != 0 {
		t.Errorf("SchemaVersion created goose's table")
	}
	migrate(t, db)
	if got, err := schema.Current(dbtest.Context(t), db); err != nil || got != want {
		t.Errorf("SchemaVersion after Migrate = %d, %v; want %d", got, err, want)
	}
}

// newTable creates a table in a fresh database and returns a pool on it.
