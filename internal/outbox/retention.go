package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"example.com/billing/internal/daytable"
	"example.com/billing/internal/lease"
	"example.com/billing/internal/postgres"
)

// Retention keeps the outbox bounded: it creates the daily partitions ahead
// of time and drops the days older than keep once every row in them is
// published (or dead), and removes such rows from the default partition.
//
// Writers never create a day: an outcome whose day has no partition (an
// order event older than the retention: a backlog, a replay) lands in the
// default partition (migration 8). A day that still holds an unpublished
// row is kept, whatever its age. It is counted under the lock that detaches
// it, in the transaction that drops it, so that no writer can commit a row
// into it unseen. (PostgreSQL detaches no partition CONCURRENTLY beside a
// default one: the detach takes the outbox's exclusive lock for the count,
// an index scan, and is given up after busyTimeout rather than queue the
// settles behind it.)
type Retention struct {
	db    *sqlx.DB
	keep  time.Duration
	ahead int
	log   *slog.Logger
	now   func() time.Time
}

// stuckAfter is how long an outcome may wait unpublished in an expired day
// before its being kept is an error (the relay is not publishing) rather
// than the ordinary end of a backlog being published.
const stuckAfter = 15 * time.Minute

// NewRetention returns a maintainer that keeps keep of published outcomes
// and ahead days of partitions in the future.
func NewRetention(db *sqlx.DB, keep time.Duration, ahead int, log *slog.Logger) *Retention {
	return &Retention{db: db, keep: keep, ahead: ahead, log: log, now: time.Now}
}

// AsOf has every later run judge the retention as of t instead of the
// time it runs: billing maintain records the days it drops earlier than
// the default retention as of one instant, and then drops exactly those.
func (r *Retention) AsOf(t time.Time) { r.now = func() time.Time { return t } }

// RetentionReport says what one run did.
type RetentionReport struct {
	Skipped bool `json:"skipped"` // another maintainer held the lease
	// HeldBy names that maintainer (its host, process id and a random
	// part) when Skipped.
	HeldBy  string   `json:"heldBy,omitempty"`
	Created []string `json:"created"`
	Dropped []string `json:"dropped"`
	// Kept lists expired days still holding unpublished rows.
	Kept []string `json:"kept"`
	// Pruned counts the published (or dead) rows removed from the default
	// partition, and the dead outcomes removed from outbox_dead.
	Pruned int64 `json:"pruned"`
	// NotOwner: the session's role does not own outbox, so it created
	// partitions but dropped none (the owner's billing maintain does).
	NotOwner bool `json:"notOwner,omitempty"`
}

// defaultPartition holds the outcomes of days without a partition.
const defaultPartition = "outbox_default"

// Run creates the partitions from today to ahead days after it, drops the
// expired days whose rows are all published, and prunes the default
// partition.
func (r *Retention) Run(ctx context.Context) (RetentionReport, error) {
	var rep RetentionReport
	now := r.now().UTC()
	err := daytable.Exclusive(ctx, r.db, lease.OutboxRetention, func(ctx context.Context, t lease.Tenure, conn *sqlx.Conn) error {
		existing, err := Table.List(ctx, conn)
		if err != nil {
			return err
		}
		today := now.Truncate(24 * time.Hour)
		for day := today; !day.After(today.AddDate(0, 0, r.ahead)); day = day.AddDate(0, 0, 1) {
			if _, ok := existing[Table.Name(day)]; ok {
				continue
			}
			if err := daytable.Fenced(ctx, conn, t, func(tx *sqlx.Tx) error { return Table.Ensure(ctx, tx, day) }); err != nil {
				return err
			}
			rep.Created = append(rep.Created, Table.Name(day))
		}
		owned, err := Table.Owned(ctx, conn)
		if err != nil {
			return err
		}
		if rep.NotOwner = !owned; !owned {
			return nil
		}
		horizon := now.Add(-r.keep)
		for _, name := range slices.Sorted(maps.Keys(existing)) {
			p := existing[name]
			if p.Day.AddDate(0, 0, 1).After(horizon) {
				continue
			}
			dropped, err := r.drop(ctx, t, conn, name, p, now, &rep)
			if err != nil {
				return err
			}
			if dropped {
				rep.Dropped = append(rep.Dropped, name)
			}
		}
		rep.Pruned, err = prune(ctx, t, conn, horizon)
		return err
	})
	var held *lease.HeldError
	if errors.As(err, &held) {
		rep.Skipped, rep.HeldBy = true, held.Holder
		return rep, nil
	}
	if err == nil {
		attrs := []any{"created", rep.Created, "dropped", rep.Dropped, "kept", rep.Kept, "pruned", rep.Pruned}
		if rep.NotOwner {
			attrs = append(attrs, "drops", "left to billing maintain, run as the owner: this role does not own outbox")
		}
		r.log.Info("outbox maintenance done", attrs...)
	}
	return rep, err
}

// busyTimeout is how long retention waits for the outbox's exclusive lock
// to detach a day: the settles queue behind it meanwhile. A day it cannot
// lock by then is dropped at a later run.
const busyTimeout = time.Second

// drop drops the expired day name unless it holds an unpublished row, and
// reports whether it did. The count that decides is taken after the detach,
// in its transaction: a writer that was inserting into the day has
// committed by then, and none can start.
func (r *Retention) drop(ctx context.Context, t lease.Tenure, conn *sqlx.Conn, name string, p daytable.Info, now time.Time, rep *RetentionReport) (bool, error) {
	if p.DetachPending { // an interrupted DETACH ... CONCURRENTLY of an earlier release
		if err := t.Check(ctx, conn); err != nil {
			return false, err
		}
		return true, Table.Drop(ctx, conn, name, p)
	}
	n, oldest, err := unpublished(ctx, conn, name) // no lock: most days need none
	if err != nil {
		return false, err
	}
	if n > 0 {
		r.kept(name, n, oldest, now, rep)
		return false, nil
	}
	tx, err := conn.BeginTxx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("drop %s: %w", name, err)
	}
	defer tx.Rollback() //nolint:errcheck // committed below; rolled back, the day stays attached as it was
	if _, err := tx.ExecContext(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = '%dms'`, busyTimeout.Milliseconds())); err != nil {
		return false, fmt.Errorf("drop %s: %w", name, err)
	}
	if _, err := tx.ExecContext(ctx, `ALTER TABLE `+pq.QuoteIdentifier(string(Table))+` DETACH PARTITION `+pq.QuoteIdentifier(name)); err != nil {
		if postgres.SQLState(err) == "55P03" { // lock_timeout
			r.log.Info("the outbox was busy; the expired day is dropped at a later run", "partition", name)
			return false, nil
		}
		return false, fmt.Errorf("detach partition %s: %w", name, err)
	}
	if n, oldest, err = unpublished(ctx, tx, name); err != nil {
		return false, err
	}
	if n > 0 {
		r.kept(name, n, oldest, now, rep)
		return false, nil
	}
	if _, err := tx.ExecContext(ctx, `DROP TABLE `+pq.QuoteIdentifier(name)); err != nil {
		return false, fmt.Errorf("drop partition %s: %w", name, err)
	}
	if err := t.Check(ctx, tx); err != nil { // the drop commits under the lease
		return false, err
	}
	return true, tx.Commit()
}

// kept records that the expired day name was kept for its n unpublished
// rows, the oldest recorded at oldest. Outcomes of a backlog's old events
// are published within moments: an error only when one has waited for
// longer than stuckAfter.
func (r *Retention) kept(name string, n int, oldest, now time.Time, rep *RetentionReport) {
	rep.Kept = append(rep.Kept, name)
	if waited := now.Sub(oldest); waited > stuckAfter {
		r.log.Error("an expired outbox day holds outcome events unpublished for longer than 15 minutes; kept (is the relay running? see billing_outbox_oldest_pending_seconds)",
			"partition", name, "unpublished", n, "oldest_recorded", oldest, "waited", waited.Round(time.Second))
		return
	}
	r.log.Info("an expired outbox day holds outcome events still being published; dropped once they are", "partition", name, "unpublished", n)
}

// unpublished counts the rows of table name that wait to be published, and
// when the oldest of them was recorded.
func unpublished(ctx context.Context, db sqlx.QueryerContext, name string) (int, time.Time, error) {
	q := `SELECT count(*), coalesce(min(recorded_at), now()) FROM ` + pq.QuoteIdentifier(name) + ` WHERE published_at IS NULL AND NOT dead`
	var n int
	var oldest time.Time
	if err := db.QueryRowxContext(ctx, q).Scan(&n, &oldest); err != nil {
		return 0, time.Time{}, fmt.Errorf("count unpublished rows of %s: %w", name, err)
	}
	return n, oldest, nil
}

// prune removes from the default partition the rows published (or dead)
// and recorded before horizon, a batch per transaction so that none grows
// with a backlog, and from outbox_dead the outcomes dead since before
// horizon. Each transaction is t's (daytable.Fenced).
func prune(ctx context.Context, t lease.Tenure, conn *sqlx.Conn, horizon time.Time) (int64, error) {
	dead, err := deleteFenced(ctx, t, conn, `DELETE FROM outbox_dead WHERE died_at < $1`, horizon)
	if err != nil {
		return 0, fmt.Errorf("prune outbox_dead: %w", err)
	}
	n, err := pruneDefault(ctx, t, conn, horizon)
	return dead + n, err
}

// pruneDefault is prune's part of the default partition.
func pruneDefault(ctx context.Context, t lease.Tenure, conn *sqlx.Conn, horizon time.Time) (int64, error) {
	const q = `
DELETE FROM ` + defaultPartition + ` WHERE ctid IN (
  SELECT ctid FROM ` + defaultPartition + ` WHERE (published_at IS NOT NULL OR dead) AND recorded_at < $1 LIMIT 10000)`
	var total int64
	for {
		n, err := deleteFenced(ctx, t, conn, q, horizon)
		if err != nil {
			return total, fmt.Errorf("prune %s: %w", defaultPartition, err)
		}
		if total += n; n < 10000 {
			return total, nil
		}
	}
}

// deleteFenced runs the DELETE q in a transaction of t's, and returns how
// many rows it removed.
func deleteFenced(ctx context.Context, t lease.Tenure, conn *sqlx.Conn, q string, args ...any) (int64, error) {
	var n int64
	err := daytable.Fenced(ctx, conn, t, func(tx *sqlx.Tx) error {
		res, err := tx.ExecContext(ctx, q, args...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return n, err
}

// CountDead counts the outcome events in outbox_dead that died in
// [from, to): what a retention whose horizon moves from from to to prunes.
func CountDead(ctx context.Context, db sqlx.QueryerContext, from, to time.Time) (int, error) {
	var n int
	if err := sqlx.GetContext(ctx, db, &n, `SELECT count(*) FROM outbox_dead WHERE died_at >= $1 AND died_at < $2`, from, to); err != nil {
		return 0, fmt.Errorf("count outbox_dead: %w", err)
	}
	return n, nil
}
