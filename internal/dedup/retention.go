package dedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"

	"example.com/billing/internal/daytable"
	"example.com/billing/internal/lease"
	"example.com/billing/internal/metrics"
)

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

// AsOf has every later run judge the retention as of t instead of the
// time it runs: billing maintain records the days it drops earlier than
// the default retention as of one instant, and then drops exactly those.
func (r *Retention) AsOf(t time.Time) { r.now = func() time.Time { return t } }

// Report says what one maintenance run did.
type Report struct {
	// Skipped: another maintainer held the lease; nothing was done.
	Skipped bool `json:"skipped"`
	// HeldBy names that maintainer (its host, process id and a random
	// part) when Skipped.
	HeldBy     string    `json:"heldBy,omitempty"`
	Created    []string  `json:"created"`
	Dropped    []string  `json:"dropped"`
	Partitions int       `json:"partitions"`
	Oldest     time.Time `json:"oldest"`
	Horizon    time.Time `json:"horizon"`
	// NotOwner: the session's role does not own processed_event, so it
	// created partitions but dropped none (the owner's billing maintain
	// does).
	NotOwner bool `json:"notOwner,omitempty"`
}

// Run creates the partitions from the retention horizon to ahead days after
// today and drops the partitions wholly older than the horizon. When another
// maintainer is running, it returns a Report with Skipped set.
func (r *Retention) Run(ctx context.Context) (Report, error) {
	now := r.now().UTC()
	rep := Report{Horizon: now.Add(-r.keep)}
	err := daytable.Exclusive(ctx, r.db, lease.DedupRetention, func(ctx context.Context, t lease.Tenure, conn *sqlx.Conn) error {
		return r.run(ctx, t, conn, now, &rep)
	})
	var held *lease.HeldError
	if errors.As(err, &held) {
		rep.Skipped, rep.HeldBy = true, held.Holder
		return rep, nil
	}
	if err != nil {
		return rep, err
	}
	r.metrics.DedupPartitions.Set(float64(rep.Partitions))
	if !rep.Oldest.IsZero() {
		r.metrics.DedupOldestPartitionAge.Set(now.Sub(rep.Oldest).Seconds())
	}
	attrs := []any{"created", rep.Created, "dropped", rep.Dropped, "partitions", rep.Partitions, "oldest", rep.Oldest, "horizon", rep.Horizon}
	if rep.NotOwner {
		attrs = append(attrs, "drops", "left to billing maintain, run as the owner: this role does not own processed_event")
	}
	r.log.Info("dedup maintenance done", attrs...)
	return rep, nil
}

// run is one run as t's holder. Its writes are fenced (daytable.Fenced),
// but for the detach of an expired day, which cannot run in a transaction:
// the lease is checked right before it.
func (r *Retention) run(ctx context.Context, t lease.Tenure, conn *sqlx.Conn, now time.Time, rep *Report) error {
	existing, err := Table.List(ctx, conn)
	if err != nil {
		return err
	}
	horizonDay := rep.Horizon.Truncate(24 * time.Hour)
	droppedBefore, err := DroppedBefore(ctx, conn)
	if err != nil {
		return err
	}

	// Days before an earlier drop stay gone, even when this maintainer keeps
	// more history than the one that dropped them: an empty partition would
	// make their events look new.
	first := horizonDay
	if droppedBefore.After(first) {
		first = droppedBefore
	}
	for day := first; !day.After(now.Truncate(24*time.Hour).AddDate(0, 0, r.ahead)); day = day.AddDate(0, 0, 1) {
		name := Table.Name(day)
		if _, ok := existing[name]; ok {
			continue
		}
		if err := daytable.Fenced(ctx, conn, t, func(tx *sqlx.Tx) error { return Table.Ensure(ctx, tx, day) }); err != nil {
			return err
		}
		existing[name] = daytable.Info{Day: day}
		rep.Created = append(rep.Created, name)
	}

	owned, err := Table.Owned(ctx, conn)
	if err != nil {
		return err
	}
	rep.NotOwner = !owned
	// Record where the memory ends before forgetting anything (every
	// partition wholly older than the horizon is a day before horizonDay).
	if owned && horizonDay.After(droppedBefore) && hasDayBefore(existing, horizonDay) {
		const q = `
INSERT INTO processed_event_horizon (dropped_before) VALUES ($1)
ON CONFLICT (only_row) DO UPDATE SET dropped_before = greatest(processed_event_horizon.dropped_before, excluded.dropped_before)`
		if err := daytable.Fenced(ctx, conn, t, func(tx *sqlx.Tx) error {
			_, err := tx.ExecContext(ctx, q, horizonDay.Format(time.DateOnly))
			return err
		}); err != nil {
			return fmt.Errorf("record the dedup horizon: %w", err)
		}
	}
	for name, p := range existing {
		// Wholly older than the horizon: its last instant is before it.
		if owned && !p.Day.AddDate(0, 0, 1).After(rep.Horizon) {
			if err := t.Check(ctx, conn); err != nil {
				return err
			}
			if err := Table.Drop(ctx, conn, name, p); err != nil {
				return err
			}
			delete(existing, name)
			rep.Dropped = append(rep.Dropped, name)
			r.metrics.DedupPartitionsDropped.Inc()
		}
	}

	rep.Partitions = len(existing)
	for _, p := range existing {
		if rep.Oldest.IsZero() || p.Day.Before(rep.Oldest) {
			rep.Oldest = p.Day
		}
	}
	return nil
}

func hasDayBefore(ps map[string]daytable.Info, day time.Time) bool {
	for _, p := range ps {
		if p.Day.Before(day) {
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
