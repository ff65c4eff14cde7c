package dedup

import (
	"context"
	"database/sql/driver"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"example.com/billing/internal/metrics"
)

// maintenanceLock is the session advisory lock that makes one maintainer of
// many do the work (replicas of serve, the CronJob).
const maintenanceLock = 0x62696c6c_64656475 // "billdedu"

// partitionPrefix names the daily partitions: processed_event_pYYYYMMDD.
const partitionPrefix = "processed_event_p"

// Retention keeps processed_event bounded: it creates the daily partitions
// ahead of time and drops the ones wholly older than the retention.
//
// Dropping a whole partition is instant and leaves no bloat, unlike a DELETE
// of millions of rows. The partition is first detached CONCURRENTLY, which
// does not block the consumers' inserts, then dropped.
type Retention struct {
	db      *sqlx.DB
	keep    time.Duration
	ahead   int
	metrics *metrics.Metrics
	log     *slog.Logger
	now     func() time.Time
}

// NewRetention returns a maintainer that keeps keep of history and ahead
// days of partitions in the future.
func NewRetention(db *sqlx.DB, keep time.Duration, ahead int, m *metrics.Metrics, log *slog.Logger) *Retention {
	return &Retention{db: db, keep: keep, ahead: ahead, metrics: m, log: log, now: time.Now}
}

// Report says what one maintenance run did.
type Report struct {
	// Skipped: another maintainer held the lock; nothing was done.
	Skipped    bool      `json:"skipped"`
	Created    []string  `json:"created"`
	Dropped    []string  `json:"dropped"`
	Partitions int       `json:"partitions"`
	Oldest     time.Time `json:"oldest"`
	Horizon    time.Time `json:"horizon"`
}

// Run creates the partitions from the retention horizon to ahead days after
// today and drops the partitions wholly older than the horizon. When another
// maintainer is running, it returns a Report with Skipped set.
func (r *Retention) Run(ctx context.Context) (Report, error) {
	now := r.now().UTC()
	rep := Report{Horizon: now.Add(-r.keep)}

	conn, err := r.db.Connx(ctx)
	if err != nil {
		return rep, fmt.Errorf("maintenance connection: %w", err)
	}
	defer conn.Close()
	var locked bool
	if err := conn.GetContext(ctx, &locked, `SELECT pg_try_advisory_lock($1)`, int64(maintenanceLock)); err != nil {
		return rep, fmt.Errorf("maintenance lock: %w", err)
	}
	if !locked {
		rep.Skipped = true
		return rep, nil
	}
	defer func() {
		// A fresh context: the unlock must happen even when ctx is done, or
		// the pooled connection would keep the lock.
		if _, err := conn.ExecContext(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, int64(maintenanceLock)); err != nil {
			// Discard the connection: closing the session releases its lock.
			conn.Raw(func(any) error { return driver.ErrBadConn }) //nolint:errcheck // the error is the point
		}
	}()
	// Never queue behind a long transaction for the parent's lock: that
	// would block every insert queued behind us. Fail and try next time.
	if _, err := conn.ExecContext(ctx, `SET lock_timeout = '5s'`); err != nil {
		return rep, fmt.Errorf("set lock_timeout: %w", err)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), `RESET lock_timeout`) //nolint:errcheck // the connection returns to the pool either way

	existing, err := r.partitions(ctx, conn)
	if err != nil {
		return rep, err
	}
	horizonDay := rep.Horizon.Truncate(24 * time.Hour)
	droppedBefore, err := DroppedBefore(ctx, conn)
	if err != nil {
		return rep, err
	}

	// Days before an earlier drop stay gone, even when this maintainer keeps
	// more history than the one that dropped them: an empty partition would
	// make their events look new.
	first := horizonDay
	if droppedBefore.After(first) {
		first = droppedBefore
	}
	for day := first; !day.After(now.Truncate(24*time.Hour).AddDate(0, 0, r.ahead)); day = day.AddDate(0, 0, 1) {
		name := partitionPrefix + day.Format("20060102")
		if _, ok := existing[name]; ok {
			continue
		}
		if _, err := conn.ExecContext(ctx, `SELECT ensure_processed_event_partition($1::date)`, day.Format(time.DateOnly)); err != nil {
			return rep, fmt.Errorf("create partition %s: %w", name, err)
		}
		existing[name] = partition{day: day}
		rep.Created = append(rep.Created, name)
	}

	// Record where the memory ends before forgetting anything (every
	// partition wholly older than the horizon is a day before horizonDay).
	if horizonDay.After(droppedBefore) && hasDayBefore(existing, horizonDay) {
		const q = `
INSERT INTO processed_event_horizon (dropped_before) VALUES ($1)
ON CONFLICT (only_row) DO UPDATE SET dropped_before = greatest(processed_event_horizon.dropped_before, excluded.dropped_before)`
		if _, err := conn.ExecContext(ctx, q, horizonDay.Format(time.DateOnly)); err != nil {
			return rep, fmt.Errorf("record the dedup horizon: %w", err)
		}
	}
	for name, p := range existing {
		// Wholly older than the horizon: its last instant is before it.
		if !p.day.AddDate(0, 0, 1).After(rep.Horizon) {
			if err := r.drop(ctx, conn, name, p.detachPending); err != nil {
				return rep, err
			}
			delete(existing, name)
			rep.Dropped = append(rep.Dropped, name)
			r.metrics.DedupPartitionsDropped.Inc()
		}
	}

	rep.Partitions = len(existing)
	for _, p := range existing {
		if rep.Oldest.IsZero() || p.day.Before(rep.Oldest) {
			rep.Oldest = p.day
		}
	}
	r.metrics.DedupPartitions.Set(float64(rep.Partitions))
	if !rep.Oldest.IsZero() {
		r.metrics.DedupOldestPartitionAge.Set(now.Sub(rep.Oldest).Seconds())
	}
	r.log.Info("dedup maintenance done", "created", rep.Created, "dropped", rep.Dropped,
		"partitions", rep.Partitions, "oldest", rep.Oldest, "horizon", rep.Horizon)
	return rep, nil
}

func hasDayBefore(ps map[string]partition, day time.Time) bool {
	for _, p := range ps {
		if p.day.Before(day) {
			return true
		}
	}
	return false
}

// DroppedBefore is the first day whose records the dedup store still holds
// after retention dropped older ones; the zero time when nothing was ever
// dropped. An event of an earlier day cannot be judged.
func DroppedBefore(ctx context.Context, db sqlx.QueryerContext) (time.Time, error) {
	var day []time.Time
	if err := sqlx.SelectContext(ctx, db, &day, `SELECT dropped_before FROM processed_event_horizon`); err != nil {
		return time.Time{}, fmt.Errorf("read the dedup horizon: %w", err)
	}
	if len(day) == 0 {
		return time.Time{}, nil
	}
	return day[0].UTC(), nil
}

type partition struct {
	day           time.Time
	detachPending bool
}

// partitions lists processed_event's daily partitions.
func (r *Retention) partitions(ctx context.Context, conn *sqlx.Conn) (map[string]partition, error) {
	const q = `
SELECT c.relname, i.inhdetachpending
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'processed_event'::regclass`
	rows, err := conn.QueryContext(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("list partitions: %w", err)
	}
	defer rows.Close()
	out := map[string]partition{}
	for rows.Next() {
		var name string
		var pending bool
		if err := rows.Scan(&name, &pending); err != nil {
			return nil, fmt.Errorf("list partitions: %w", err)
		}
		day, err := time.Parse("20060102", strings.TrimPrefix(name, partitionPrefix))
		if err != nil || !strings.HasPrefix(name, partitionPrefix) {
			continue // not ours: leave it alone
		}
		out[name] = partition{day: day, detachPending: pending}
	}
	return out, rows.Err()
}

// drop detaches a partition without blocking inserts, then drops it. A
// detach that was interrupted earlier is finalized instead.
func (r *Retention) drop(ctx context.Context, conn *sqlx.Conn, name string, detachPending bool) error {
	detach := `ALTER TABLE processed_event DETACH PARTITION %s CONCURRENTLY`
	if detachPending {
		detach = `ALTER TABLE processed_event DETACH PARTITION %s FINALIZE`
	}
	if _, err := conn.ExecContext(ctx, fmt.Sprintf(detach, quoteIdent(name))); err != nil {
		return fmt.Errorf("detach partition %s: %w", name, err)
	}
	if _, err := conn.ExecContext(ctx, `DROP TABLE `+quoteIdent(name)); err != nil {
		return fmt.Errorf("drop partition %s: %w", name, err)
	}
	return nil
}

func quoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// Every runs Run every interval until ctx is done. Failures are logged and
// retried at the next tick: a missed run only delays a drop, and partitions
// exist days ahead.
func (r *Retention) Every(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := r.Run(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("dedup maintenance failed; retrying at the next interval", "err", err, "interval", interval)
		}
	}
}
