package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"example.com/billing/internal/partition"
	"example.com/billing/internal/postgres"
)

// Retention keeps the outbox bounded: it creates the daily partitions ahead
// of time and drops the days older than keep once every row in them is
// published (or dead). A day that still holds an unpublished row is kept,
// whatever its age, and said loudly: dropping it would lose an outcome.
type Retention struct {
	db    *sqlx.DB
	keep  time.Duration
	ahead int
	log   *slog.Logger
	now   func() time.Time
}

// NewRetention returns a maintainer that keeps keep of published outcomes
// and ahead days of partitions in the future.
func NewRetention(db *sqlx.DB, keep time.Duration, ahead int, log *slog.Logger) *Retention {
	return &Retention{db: db, keep: keep, ahead: ahead, log: log, now: time.Now}
}

// RetentionReport says what one run did.
type RetentionReport struct {
	Skipped bool     `json:"skipped"` // another maintainer held the lock
	Created []string `json:"created"`
	Dropped []string `json:"dropped"`
	// Kept lists expired days still holding unpublished rows.
	Kept []string `json:"kept"`
	// NotOwner: the session's role does not own outbox, so it created
	// partitions but dropped none (the owner's billing maintain does).
	NotOwner bool `json:"notOwner,omitempty"`
}

// Run creates the partitions from today to ahead days after it and drops
// the expired days whose rows are all published.
func (r *Retention) Run(ctx context.Context) (RetentionReport, error) {
	var rep RetentionReport
	now := r.now().UTC()
	ran, err := partition.Exclusive(ctx, r.db, postgres.LockOutboxRetention, func(conn *sqlx.Conn) error {
		existing, err := Table.List(ctx, conn)
		if err != nil {
			return err
		}
		today := now.Truncate(24 * time.Hour)
		for day := today; !day.After(today.AddDate(0, 0, r.ahead)); day = day.AddDate(0, 0, 1) {
			if _, ok := existing[Table.Name(day)]; ok {
				continue
			}
			if err := Table.Ensure(ctx, conn, day); err != nil {
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
		for name, p := range existing {
			if p.Day.AddDate(0, 0, 1).After(horizon) {
				continue
			}
			var unpublished int
			q := `SELECT count(*) FROM ` + pq.QuoteIdentifier(name) + ` WHERE published_at IS NULL AND NOT dead`
			if err := conn.GetContext(ctx, &unpublished, q); err != nil {
				return fmt.Errorf("count unpublished rows of %s: %w", name, err)
			}
			if unpublished > 0 {
				rep.Kept = append(rep.Kept, name)
				r.log.Error("an expired outbox day still holds unpublished outcome events; kept (is the relay running? see billing_outbox_oldest_pending_seconds)",
					"partition", name, "unpublished", unpublished)
				continue
			}
			if err := Table.Drop(ctx, conn, name, p); err != nil {
				return err
			}
			rep.Dropped = append(rep.Dropped, name)
		}
		return nil
	})
	rep.Skipped = !ran
	if err == nil && ran {
		attrs := []any{"created", rep.Created, "dropped", rep.Dropped, "kept", rep.Kept}
		if rep.NotOwner {
			attrs = append(attrs, "drops", "left to billing maintain, run as the owner: this role does not own outbox")
		}
		r.log.Info("outbox maintenance done", attrs...)
	}
	return rep, err
}
