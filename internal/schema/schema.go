// Package schema is the database schema billing runs on: the migrations
// embedded in the binary, the schemas a release runs on, which migrations
// may run while replicas of an older release are alive, and the record of
// the replicas running (replicas.go).
//
// Upgrades replace replicas one at a time after the migrate Job ran, so
// that replicas of the previous release charge on the new schema for a
// while, and may do so again after a rollback. Migrations come in two
// kinds. An expand migration only adds (a table, a nullable column, an
// index built concurrently, a function): the previous release runs on it
// unchanged. A contract migration removes or tightens what an older
// release still reads or writes: its file says from which release schema
// on releases keep running,
//
//	-- +billing contract: releases of schema N and newer
//
// and its first statement is SELECT billing_contract(N), which refuses in
// the database while a replica of an older release is alive and otherwise
// raises the schema's floor to N (migration 9). Migrate applies every
// expand migration and stops before a contract one that would be refused,
// for a later run.
package schema

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"example.com/billing/internal/postgres"
)

// Migration is one embedded migration.
type Migration struct {
	Version int64
	Path    string
	// RunsFrom, for a contract migration, is the oldest release schema
	// that keeps running once it is applied; 0 for an expand migration.
	RunsFrom int64
	// Session: its Up section changes its session's settings (a SET or
	// RESET that is not LOCAL, as a NO TRANSACTION migration must to set
	// lock_timeout: goose runs it statement by statement, outside a
	// transaction). Through a transaction pooler the setting would stay
	// with a server session that other clients use next, so migrate
	// applies it over sessions of its own only.
	Session bool
}

// Contract reports whether m removes or tightens what an older release
// uses.
func (m Migration) Contract() bool { return m.RunsFrom > 0 }

// contractMark is how a contract migration says so, on a line of its own.
var contractMark = regexp.MustCompile(`(?m)^-- \+billing contract: releases of schema (\d+) and newer`)

// sessionSetting is a statement that changes its session's settings: SET
// name = / TO, SET SESSION, RESET, set_config(..., false). (SET LOCAL
// changes a transaction's only; a plain SET in a transaction outlives it.)
var sessionSetting = regexp.MustCompile(`(?im)^\s*(reset\s+\w|set\s+session\s|set\s+[a-z_.]+\s*(=|to\s))|set_config\s*\([^;]*,\s*false\s*\)`)

// upSection is the Up section of a migration's source.
func upSection(body []byte) []byte {
	s := string(body)
	if i := strings.Index(s, "-- +goose Up"); i >= 0 {
		s = s[i:]
	}
	if i := strings.Index(s, "-- +goose Down"); i >= 0 {
		s = s[:i]
	}
	return []byte(s)
}

// Migrations returns the migrations embedded in the binary, in version
// order.
func Migrations() ([]Migration, error) {
	return migrationsOf(embedded())
}

func migrationsOf(fsys fs.FS) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("list migrations: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		v, err := goose.NumericComponent(e.Name())
		if err != nil {
			continue // not a migration (embed.go's neighbours)
		}
		body, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, err
		}
		m := Migration{Version: v, Path: e.Name(), Session: sessionSetting.Match(upSection(body))}
		if match := contractMark.FindSubmatch(body); match != nil {
			if m.RunsFrom, err = strconv.ParseInt(string(match[1]), 10, 64); err != nil || m.RunsFrom <= 0 {
				return nil, fmt.Errorf("migration %s: contract mark %q", e.Name(), match[0])
			}
		}
		out = append(out, m)
	}
	return out, nil
}

// Version returns the newest schema this binary embeds.
func Version() (int64, error) {
	ms, err := Migrations()
	if err != nil {
		return 0, err
	}
	if len(ms) == 0 {
		return 0, errors.New("no migration embedded")
	}
	return ms[len(ms)-1].Version, nil
}

// releasesVersion is the migration that records the releases running and
// the schema's floor (00009_releases.sql).
const releasesVersion = 9

// LeasesVersion is the migration that added the leases (00012_leases.sql):
// releases of an older schema decide their relay and maintainers with
// session advisory locks instead, which a lease does not exclude.
const LeasesVersion = 12

// versionTable is where goose records the migrations applied to a
// database: its default name, which Migrate keeps.
const versionTable = "goose_db_version"

// Current returns the highest migration version applied to db, 0 when
// none is (goose's table does not exist yet). It is one short query, cheap
// enough for a readiness probe, and an answer also says that the database
// is reachable. It never creates goose's table, as goose's own
// GetDBVersion would.
func Current(ctx context.Context, db sqlx.QueryerContext) (int64, error) {
	var v sql.NullInt64
	err := db.QueryRowxContext(ctx, `SELECT max(version_id) FROM `+versionTable).Scan(&v)
	if undefinedTable(err) { // never migrated
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	return v.Int64, nil
}

// Compatibility is what a database lets run: its schema version and the
// oldest release schema that may run on it.
type Compatibility struct {
	Version  int64
	RunsFrom int64
}

// Read returns db's compatibility, in one query.
func Read(ctx context.Context, db sqlx.QueryerContext) (Compatibility, error) {
	c := Compatibility{}
	var err error
	if c.Version, err = Current(ctx, db); err != nil || c.Version < releasesVersion {
		return c, err // before it, every release runs
	}
	if err := sqlx.GetContext(ctx, db, &c.RunsFrom, `SELECT runs_from FROM schema_compatibility`); err != nil {
		return c, fmt.Errorf("read the schema's floor: %w", err)
	}
	return c, nil
}

// Check returns nil when a release that embeds migrations up to newest and
// runs on schemas from oldest on runs on c, else what keeps it from
// running: a schema too old (run its billing migrate), or one that a
// contract migration made for newer releases only (deploy a newer one).
func (c Compatibility) Check(oldest, newest int64) error {
	switch {
	case c.Version < oldest:
		return fmt.Errorf("the database schema is at version %d; this release runs on schemas %d and newer (it embeds %d): run billing migrate of this release first", c.Version, oldest, newest)
	case c.RunsFrom > newest:
		return fmt.Errorf("the database schema (version %d) runs releases of schema %d and newer only, after a contract migration removed what older ones use; this release (schema %d) runs on schemas %d and newer as long as they keep releases of schema %d running: deploy a newer release",
			c.Version, c.RunsFrom, newest, oldest, newest)
	}
	return nil
}

// Report says what one Migrate did.
type Report struct {
	// Applied are the versions applied now, in order; Version is the
	// schema's version afterwards.
	Applied []int64
	Version int64
	// Pending are the migrations not applied, from the first one refused.
	Pending []Migration
	// Refused says why the first pending one was not applied: replicas of
	// an older release are alive.
	Refused error
}

// Migrate applies the embedded migrations to db, in order: every expand
// migration, and a contract migration unless a replica of a release older
// than its floor is alive; then it stops, leaving that one and the later
// ones pending for a later run (Report.Refused says why). It is safe to run
// twice and from several processes at once: goose's lock table serializes
// them, and billing_contract checks again, in the migration's transaction,
// what the registry says. Through a transaction pooler it applies every
// migration but one that changes its session's settings
// (Migration.Session): it stops there with an error naming the pool mode.
func Migrate(ctx context.Context, db *sql.DB, log *slog.Logger) (Report, error) {
	return migrate(ctx, db, embedded(), log)
}

// migrate is Migrate with the migrations of fsys.
func migrate(ctx context.Context, db *sql.DB, fsys fs.FS, log *slog.Logger) (Report, error) {
	var rep Report
	// goose's lock table (goose_lock), not its session advisory lock: a
	// lease, taken, renewed and given back by statements of their own, so
	// that it holds through a transaction pooler. Asked every second: a
	// concurrent migrate is usually over in a moment.
	locker, err := lock.NewPostgresTableLocker(lock.WithTableLockID(postgres.LockMigrations),
		lock.WithTableLockTimeout(time.Second, 300), lock.WithTableLogger(log))
	if err != nil {
		return rep, fmt.Errorf("migration lock: %w", err)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, db, fsys,
		goose.WithLocker(locker), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return rep, fmt.Errorf("load migrations: %w", err)
	}
	all, err := migrationsOf(fsys)
	if err != nil {
		return rep, err
	}
	xdb := sqlx.NewDb(db, "postgres")
	for i, m := range all {
		have, err := Current(ctx, xdb)
		if err != nil {
			return rep, err
		}
		if m.Version <= have {
			continue
		}
		if m.Contract() {
			if err := contractAllowed(ctx, xdb, m); err != nil {
				rep.Pending, rep.Refused = all[i:], err
				break
			}
		}
		if m.Session {
			if err := ownSessions(ctx, xdb, m); err != nil {
				return rep, err
			}
		}
		results, err := provider.UpTo(ctx, m.Version)
		if err != nil {
			var pe *pq.Error
			if m.Contract() && errors.As(err, &pe) && pe.Code == "55006" { // object_in_use: billing_contract refused
				rep.Pending, rep.Refused = all[i:], fmt.Errorf("migration %d: %s", m.Version, pe.Message)
				break
			}
			return rep, fmt.Errorf("apply migration %s: %w", m.Path, err)
		}
		for _, r := range results {
			rep.Applied = append(rep.Applied, r.Source.Version)
			log.Info("migration applied", "version", r.Source.Version, "file", r.Source.Path, "duration", r.Duration)
		}
	}
	if rep.Version, err = Current(ctx, xdb); err != nil {
		return rep, err
	}
	if rep.Refused != nil {
		log.Warn("contract migration not applied: replicas of an older release are alive; run billing migrate again once they are replaced (billing migrate status lists them)",
			"version", rep.Pending[0].Version, "file", rep.Pending[0].Path, "reason", rep.Refused.Error(), "pending", len(rep.Pending))
	}
	log.Info("schema migrated", "version", rep.Version, "applied_now", len(rep.Applied), "pending", len(rep.Pending))
	return rep, nil
}

// ownSessions returns nil when db's connections keep server sessions of
// their own, so that m, which changes its session's settings, can be
// applied; else an error naming m and the pool mode.
func ownSessions(ctx context.Context, db *sqlx.DB, m Migration) error {
	sessions, err := postgres.DetectSessions(ctx, db)
	if err != nil {
		return err
	}
	if sessions == postgres.SharedSessions {
		return fmt.Errorf("migration %s changes its session's settings (a SET that is not SET LOCAL), and DATABASE_URL's connections share server sessions (pool mode %s): "+
			"the setting would stay with a server session other clients use next. Run this billing migrate over a direct connection to PostgreSQL, or a pooler in session mode (e.g. CloudNativePG's <cluster>-rw service)",
			m.Path, sessions.Mode())
	}
	return nil
}

// contractAllowed returns nil when no replica of a release older than m's
// floor is alive, else an error that names them.
func contractAllowed(ctx context.Context, db sqlx.QueryerContext, m Migration) error {
	alive, err := Alive(ctx, db)
	if err != nil {
		return err
	}
	return blockedBy(m, alive)
}

// blockedBy returns the error that the replicas of alive older than m's
// floor keep m from running, nil when none is.
func blockedBy(m Migration, alive []Replica) error {
	var older []Replica
	for _, r := range alive {
		if r.Schema < m.RunsFrom {
			older = append(older, r)
		}
	}
	if len(older) == 0 {
		return nil
	}
	return &OlderReplicasError{Migration: m, Replicas: older}
}

// OlderReplicasError: a contract migration waits for replicas of an older
// release to be replaced.
type OlderReplicasError struct {
	Migration Migration
	Replicas  []Replica
}

func (e *OlderReplicasError) Error() string {
	s := fmt.Sprintf("migration %d keeps releases of schema %d and newer only, and %d replicas of an older release are alive:", e.Migration.Version, e.Migration.RunsFrom, len(e.Replicas))
	for _, r := range e.Replicas {
		s += fmt.Sprintf(" %s on %s (release %s, schema %d);", r.Instance, r.Host, r.Release, r.Schema)
	}
	return s
}

// undefinedTable reports whether err is PostgreSQL's undefined_table.
func undefinedTable(err error) bool {
	var pe *pq.Error
	return errors.As(err, &pe) && pe.Code == "42P01"
}

// Queryer is what reading the schema's state takes.
type Queryer = sqlx.QueryerContext

// Status is where a database's schema stands, for billing migrate status.
type Status struct {
	Compatibility Compatibility
	// Embedded is the newest schema this binary embeds.
	Embedded int64
	Alive    []Replica
	// Pending are the embedded migrations not applied, in order.
	Pending []Pending
}

// Pending is a migration not applied yet, and what keeps a contract
// migration from running (nil when nothing does).
type Pending struct {
	Migration Migration
	Blocked   error
}

// ReadStatus reads db's schema state. It applies nothing.
func ReadStatus(ctx context.Context, db Queryer) (Status, error) {
	var st Status
	var err error
	if st.Compatibility, err = Read(ctx, db); err != nil {
		return st, err
	}
	if st.Alive, err = Alive(ctx, db); err != nil {
		return st, err
	}
	all, err := Migrations()
	if err != nil {
		return st, err
	}
	st.Embedded = all[len(all)-1].Version
	for _, m := range all {
		if m.Version <= st.Compatibility.Version {
			continue
		}
		p := Pending{Migration: m}
		if m.Contract() {
			p.Blocked = blockedBy(m, st.Alive)
		}
		st.Pending = append(st.Pending, p)
	}
	return st, nil
}
