package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/prometheus/client_golang/prometheus"

	"example.com/billing/internal/billing"
	"example.com/billing/internal/config"
	"example.com/billing/internal/daytable"
	"example.com/billing/internal/dedup"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/outbox"
	"example.com/billing/internal/postgres"
)

const maintainHelp = `
Runs billing's maintenance once, for a Kubernetes CronJob, and prints what
it did as JSON on stdout:
  - the dedup store's retention: creates processed_event's daily partitions
    PARTITIONS_AHEAD days ahead and drops those older than DEDUP_RETENTION;
  - the outbox's retention: creates its partitions PARTITIONS_AHEAD days
    ahead and drops the days older than OUTBOX_RETENTION whose outcome
    events are all published;
  - charge attempts: reports those pending and those older than
    PAYMENT_IDEMPOTENCY_WINDOW (never retried: they need a human) and, with
    PAYMENT_BASE_URL set, completes the ones nobody worked on for
    PAYMENT_RECOVER_AFTER.
serve does the same on its own schedule; leases let several maintainers
run at once (one of them works on a table, the others skip it), also
through a transaction pooler. It must run as the role that owns the
schema (the one of billing migrate): only the owner may drop partitions,
and serve, running as billing_runtime, leaves the drops to it. Run as
another role it creates and reports, then fails.

A retention shorter than its default (DEDUP_RETENTION 168h, OUTBOX_RETENTION
72h) drops money-relevant records earlier than billing would: the dedup
store's memory (an older event is then parked stale-event instead of being
judged), or outcome events that could never be published. That is an
operator's decision: maintain then requires --reason, and when this run
would drop anything the default retention keeps (partitions of
processed_event or outbox, outcomes in outbox_dead), it records who, why
and what in operator_action before it drops anything; when the record
fails, it does nothing. billing audit lists it.`

// maintain runs billing's maintenance once.
func maintain(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	var cfg config.Maintain
	fs := newFlagSet("maintain", about{description: maintainHelp, env: &cfg,
		example: `DATABASE_URL='postgres://billing:secret@db:5432/billing?sslmode=verify-full' DEDUP_RETENTION=720h billing maintain`})
	op := operatorFlags(fs, "maintain")
	if help, err := parseSubcommandFlags(fs, args, stdout); help || err != nil {
		return err
	}
	if err := config.Load(environ, &cfg); err != nil {
		return err
	}
	early := cfg.Dedup.Retention < config.DefaultDedupRetention || cfg.Outbox.Retention < config.DefaultOutboxRetention
	if early {
		if err := op.check(); err != nil {
			return fmt.Errorf("%w (DEDUP_RETENTION %s and OUTBOX_RETENTION %s: shorter than the defaults %s and %s, this maintain drops records early)",
				err, cfg.Dedup.Retention, cfg.Outbox.Retention, config.DefaultDedupRetention, config.DefaultOutboxRetention)
		}
	}
	log := newLogger(stderr, cfg.Log)
	for _, notice := range config.Renamed(environ) {
		log.Warn(notice)
	}
	db, err := postgres.Open(cfg.Database.URL, 2)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer db.Close()
	m := metrics.New(prometheus.NewRegistry())

	// One instant for the record of early drops and for the drops: what is
	// recorded is what is dropped, however long the run takes.
	now := time.Now().UTC()
	if early {
		if err := recordEarlyDrops(ctx, db, op, cfg, now, log); err != nil {
			if postgres.IsConfigError(err) {
				return fmt.Errorf("DATABASE_URL: %w", err)
			}
			return err
		}
	}

	// Without a provider the recoverer only reports.
	var payer billing.Payer
	if cfg.Payment.BaseURL == "" {
		log.Info("PAYMENT_BASE_URL is not set (stripe: PAYMENT_API_KEY): charge attempts left pending are reported, not completed or looked up")
	} else {
		client := newPayer(cfg.Payment.API(), false, nil, m)
		defer client.Close()
		payer = client
	}
	recoverer := billing.NewRecoverer(db, payer, billing.Horizon{ProviderWindow: cfg.Payment.IdempotencyWindow, ResolveAfter: cfg.Payment.ResolveAfter}, m, log)
	mt := newMaintenance(db, cfg.Dedup, cfg.Outbox, cfg.Partitions, recoverer, cfg.Payment.RecoverAfter, m, log)
	mt.dedup.AsOf(now)
	mt.outbox.AsOf(now)
	rep, err := mt.once(ctx)
	if err != nil {
		if postgres.IsConfigError(err) {
			return fmt.Errorf("DATABASE_URL: %w", err)
		}
		return err
	}
	if rep.Skipped {
		log.Info("another maintainer holds processed_event's lease; its retention was left to it", "held_by", rep.HeldBy)
	}
	if rep.Outbox.Skipped {
		log.Info("another maintainer holds the outbox's lease; its retention was left to it", "held_by", rep.Outbox.HeldBy)
	}
	if err := json.NewEncoder(stdout).Encode(rep); err != nil {
		return err
	}
	if rep.NotOwner || rep.Outbox.NotOwner {
		// serve, running as billing_runtime, drops nothing either: the
		// CronJob must fail, and be alerted on, rather than let the dedup
		// store and the outbox grow for ever.
		return errors.New("maintain: the role of DATABASE_URL does not own processed_event and outbox, so no expired partition was dropped: run billing maintain with the schema owner's DATABASE_URL (docs/deployment.md#postgresql-roles-and-tls)")
	}
	return nil
}

// earlyDrops is what a maintain with a retention shorter than its default
// drops that the default would keep, as it records it in operator_action.
type earlyDrops struct {
	DedupRetention  string   `json:"dedupRetention"`
	OutboxRetention string   `json:"outboxRetention"`
	Partitions      []string `json:"partitions"`
	DeadOutcomes    int      `json:"deadOutcomes"`
}

// recordEarlyDrops records, before anything is dropped, what this run
// drops that the default retentions keep: the daily partitions of
// processed_event and outbox that are past the configured horizon as of
// now (the instant the drops judge by too) but not the default one, and
// the outcomes of outbox_dead between the two. Nothing to drop early:
// nothing recorded.
func recordEarlyDrops(ctx context.Context, db *sqlx.DB, op operator, cfg config.Maintain, now time.Time, log *slog.Logger) error {
	plan := earlyDrops{DedupRetention: cfg.Dedup.Retention.String(), OutboxRetention: cfg.Outbox.Retention.String()}
	for _, t := range []struct {
		table       daytable.Table
		keep, usual time.Duration
	}{
		{dedup.Table, cfg.Dedup.Retention, config.DefaultDedupRetention},
		{outbox.Table, cfg.Outbox.Retention, config.DefaultOutboxRetention},
	} {
		if t.keep >= t.usual {
			continue
		}
		parts, err := t.table.List(ctx, db)
		if err != nil {
			return fmt.Errorf("maintain: %w", err)
		}
		for _, name := range slices.Sorted(maps.Keys(parts)) {
			// A day is dropped once its last instant is before the horizon.
			end := parts[name].Day.AddDate(0, 0, 1)
			if !end.After(now.Add(-t.keep)) && end.After(now.Add(-t.usual)) {
				plan.Partitions = append(plan.Partitions, name)
			}
		}
	}
	if cfg.Outbox.Retention < config.DefaultOutboxRetention {
		n, err := outbox.CountDead(ctx, db, now.Add(-config.DefaultOutboxRetention), now.Add(-cfg.Outbox.Retention))
		if err != nil {
			return fmt.Errorf("maintain: %w", err)
		}
		plan.DeadOutcomes = n
	}
	if len(plan.Partitions) == 0 && plan.DeadOutcomes == 0 {
		log.Info("the retention is shorter than the default, but nothing is due that the default keeps: nothing recorded")
		return nil
	}
	action, err := op.record(ctx, db, "", plan)
	if err != nil {
		return fmt.Errorf("maintain: nothing done: %w", err)
	}
	log.Warn("dropping records earlier than the default retention; operator action recorded", "action", action.ID, "by", action.By,
		"reason", action.Reason, "partitions", plan.Partitions, "dead_outcomes", plan.DeadOutcomes)
	return nil
}
