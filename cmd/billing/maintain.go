package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/prometheus/client_golang/prometheus"

	"example.com/billing/internal/billing"
	"example.com/billing/internal/config"
	"example.com/billing/internal/metrics"
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
another role it creates and reports, then fails.`

// maintain runs billing's maintenance once.
func maintain(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	var cfg config.Maintain
	fs := newFlagSet("maintain", about{description: maintainHelp, env: &cfg,
		example: `DATABASE_URL='postgres://billing:secret@db:5432/billing?sslmode=verify-full' DEDUP_RETENTION=720h billing maintain`})
	if help, err := parseSubcommandFlags(fs, args, stdout); help || err != nil {
		return err
	}
	if err := config.Load(environ, &cfg); err != nil {
		return err
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
	rep, err := newMaintenance(db, cfg.Dedup, cfg.Outbox, cfg.Partitions, recoverer, cfg.Payment.RecoverAfter, m, log).once(ctx)
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
