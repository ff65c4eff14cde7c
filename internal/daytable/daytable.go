// Package daytable keeps tables that are range-partitioned by the day of
// a UUID v7 key: processed_event (by the event's id) and outbox (by the
// outcome event's id).
//
// A UUID v7's leading 48 bits are its creation time in milliseconds, so one
// UTC day of ids is one contiguous key range, and a day of rows is removed
// by dropping its partition: instant, no bloat, no long DELETE. The SQL side
// is the function ensure_day_partition(parent, day) (migrations 5 and 7),
// which creates and attaches the partition named <parent>_pYYYYMMDD as the
// tables' owner, whoever calls it.
package daytable

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"example.com/billing/internal/lease"
)

// Table is a table partitioned by the day of its UUID v7 key.
type Table string

// Day is the UTC day of id's partition: the day of the time inside the
// UUID v7 (the zero time for an id of another version).
func Day(id uuid.UUID) time.Time {
	ts, err := uuid.TimestampFromV7(id)
	if err != nil {
		return time.Time{}
	}
	t, err := ts.Time()
	if err != nil {
		return time.Time{}
	}
	return t.UTC().Truncate(24 * time.Hour)
}

// Name is the name of t's partition of day.
func (t Table) Name(day time.Time) string {
	return string(t) + "_p" + day.UTC().Format("20060102")
}

// Ensure creates and attaches the partition of day unless it exists.
func (t Table) Ensure(ctx context.Context, db sqlx.ExecerContext, day time.Time) error {
	if _, err := db.ExecContext(ctx, `SELECT ensure_day_partition($1::regclass, $2::date)`, string(t), day.UTC().Format(time.DateOnly)); err != nil {
		return fmt.Errorf("create partition %s: %w", t.Name(day), err)
	}
	return nil
}

// EnsureFor creates the partitions of the days of ids that lack one. A
// writer calls it when an insert found no partition (maintenance did not
// run, or the row belongs to an older day), rather than fail for ever.
func (t Table) EnsureFor(ctx context.Context, db sqlx.ExecerContext, ids []uuid.UUID) error {
	days := map[time.Time]bool{}
	for _, id := range ids {
		days[Day(id)] = true
	}
	for d := range days {
		if err := t.Ensure(ctx, db, d); err != nil {
			return err
		}
	}
	return nil
}

// MissingError says that rows of Table fall on days that have no
// partition (yet): maintenance has not created them, or a row belongs to
// an older day. The writer creates them and tries again (EnsureFor) rather
// than fail for ever.
type MissingError struct {
	Table Table
	IDs   []uuid.UUID // the keys of the rows written
	Err   error
}

func (e *MissingError) Error() string {
	return fmt.Sprintf("%s has no partition for a row's day: %v", e.Table, e.Err)
}

func (e *MissingError) Unwrap() error { return e.Err }

// Missing returns err as a *MissingError when it is a write into t of the
// rows ids whose key falls on a day without a partition, else err itself.
func (t Table) Missing(err error, ids []uuid.UUID) error {
	var pqErr *pq.Error
	// A check_violation: `no partition of relation "processed_event" found for row`.
	if errors.As(err, &pqErr) && pqErr.Code == "23514" &&
		strings.HasPrefix(pqErr.Message, `no partition of relation "`+string(t)+`"`) {
		return &MissingError{Table: t, IDs: ids, Err: err}
	}
	return err
}

// Info describes one existing partition.
type Info struct {
	Day time.Time
	// DetachPending: an earlier DETACH ... CONCURRENTLY was interrupted;
	// it must be finalized before the partition can be dropped.
	DetachPending bool
}

// List returns t's daily partitions by name. Partitions not named by this
// package are left out: not ours to touch.
func (t Table) List(ctx context.Context, db sqlx.QueryerContext) (map[string]Info, error) {
	const q = `
SELECT c.relname, i.inhdetachpending
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass`
	rows, err := db.QueryContext(ctx, q, string(t))
	if err != nil {
		return nil, fmt.Errorf("list partitions of %s: %w", t, err)
	}
	defer rows.Close()
	prefix := string(t) + "_p"
	out := map[string]Info{}
	for rows.Next() {
		var name string
		var pending bool
		if err := rows.Scan(&name, &pending); err != nil {
			return nil, fmt.Errorf("list partitions of %s: %w", t, err)
		}
		day, err := time.Parse("20060102", strings.TrimPrefix(name, prefix))
		if err != nil || !strings.HasPrefix(name, prefix) {
			continue
		}
		out[name] = Info{Day: day, DetachPending: pending}
	}
	return out, rows.Err()
}

// Owned reports whether the session's role owns t (or inherits from its
// owner), and so may detach and drop its partitions. serve may run as a
// role that does not (billing_runtime, migration 7): it creates partitions
// through ensure_day_partition, which runs as the owner, and leaves the
// drops to `billing maintain`, run as the owner.
func (t Table) Owned(ctx context.Context, db sqlx.QueryerContext) (bool, error) {
	var owned bool
	if err := sqlx.GetContext(ctx, db, &owned, `SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = $1::regclass`, string(t)); err != nil {
		return false, fmt.Errorf("owner of %s: %w", t, err)
	}
	return owned, nil
}

// Drop detaches partition name without blocking writers, then drops it. A
// detach that was interrupted earlier is finalized instead. It must run
// outside a transaction (DETACH ... CONCURRENTLY cannot run inside one).
func (t Table) Drop(ctx context.Context, db sqlx.ExecerContext, name string, info Info) error {
	detach := `ALTER TABLE %s DETACH PARTITION %s CONCURRENTLY`
	if info.DetachPending {
		detach = `ALTER TABLE %s DETACH PARTITION %s FINALIZE`
	}
	if _, err := db.ExecContext(ctx, fmt.Sprintf(detach, pq.QuoteIdentifier(string(t)), pq.QuoteIdentifier(name))); err != nil {
		return fmt.Errorf("detach partition %s: %w", name, err)
	}
	if _, err := db.ExecContext(ctx, `DROP TABLE `+pq.QuoteIdentifier(name)); err != nil {
		return fmt.Errorf("drop partition %s: %w", name, err)
	}
	return nil
}

// maintainerLease is how long a maintainer's lease lasts unless renewed:
// one killed with -9 keeps the others from its table for at most that
// long.
const maintainerLease = 15 * time.Second

// Exclusive runs fn as the one maintainer of a table: the holder of the
// lease name, on a connection of its own; while another maintainer holds
// it, it returns that maintainer's *lease.HeldError without running fn.
// Maintainers of one table (replicas of serve, the CronJob) use it so that
// one of them works at a time. fn's context ends when the lease is lost,
// and fn writes through Fenced, or checks t before a statement that cannot
// run in a transaction.
func Exclusive(ctx context.Context, db *sqlx.DB, name lease.Name, fn func(ctx context.Context, t lease.Tenure, conn *sqlx.Conn) error) error {
	return lease.New(db, name, maintainerLease).Do(ctx, func(ctx context.Context, t lease.Tenure) error {
		conn, err := db.Connx(ctx)
		if err != nil {
			return fmt.Errorf("connection for %s: %w", name, err)
		}
		defer conn.Close()
		return fn(ctx, t, conn)
	})
}

// lockTimeout is how long a maintainer's statement waits for a table's
// lock: never long, since every insert that asks for the table after it
// queues behind it. A statement that times out fails, and is tried again
// at the next run.
const lockTimeout = 5 * time.Second

// Fenced runs fn in a transaction of conn that commits only while t holds
// its lease, and in which a statement waits at most lockTimeout for a
// lock. The lease is checked after fn, right before the commit: from the
// check on, it cannot pass to another maintainer before the commit, and
// its row is not kept locked while fn waits for a table's lock (the
// holder's renewals would wait behind it). The timeout is SET LOCAL, the
// transaction's own: a session setting would stay with the server session,
// which behind a transaction pooler is another client's next.
func Fenced(ctx context.Context, conn *sqlx.Conn, t lease.Tenure, fn func(tx *sqlx.Tx) error) error {
	tx, err := conn.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if _, err := tx.ExecContext(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = '%dms'`, lockTimeout.Milliseconds())); err != nil {
		return fmt.Errorf("set lock_timeout: %w", err)
	}
	if err := fn(tx); err != nil {
		return err
	}
	if err := t.Check(ctx, tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}
