package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace/noop"

	"example.com/billing/internal/billing"
	"example.com/billing/internal/config"
	"example.com/billing/internal/dedup"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/payment"
	"example.com/billing/internal/postgres"
)

// maintain runs billing's maintenance once, for a Kubernetes CronJob, and
// prints what it did as JSON:
//   - dedup-store retention: it creates processed_event partitions ahead and
//     drops the expired ones (serve does the same every
//     DEDUP_MAINTENANCE_INTERVAL; an advisory lock lets one of them work at
//     a time);
//   - charge attempts: it reports the pending ones and those past the
//     provider's idempotency window and, with PAYMENT_BASE_URL set,
//     completes the ones idle for PAYMENT_RECOVER_AFTER (serve does that
//     too; several at once is safe).
func maintain(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	if err := noArgs("maintain", args); err != nil {
		return err
	}
	var cfg config.Maintain
	if err := config.Load(environ, &cfg); err != nil {
		return err
	}
	log := newLogger(stderr, slog.LevelInfo)
	db, err := postgres.Open(cfg.Database.URL, 2)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer db.Close()
	m := metrics.New(prometheus.NewRegistry())
	r := dedup.NewRetention(db, cfg.Dedup.Retention, cfg.Dedup.PartitionsAhead, m, log)
	rep, err := r.Run(ctx)
	if err != nil {
		if postgres.IsConfigError(err) {
			return fmt.Errorf("DATABASE_URL: %w", err)
		}
		return err
	}
	if rep.Skipped {
		log.Info("another maintainer is running; nothing to do")
	}

	pay := cfg.Payment.Payment()
	horizon := billing.Horizon{Retention: cfg.Dedup.Retention, ProviderWindow: pay.IdempotencyWindow}
	var attempts billing.RecoveryReport
	if pay.BaseURL == "" {
		log.Info("PAYMENT_BASE_URL is not set: charge attempts left pending are reported, not completed")
		proc := billing.NewProcessor(db, dedup.NewStore(""), nil, horizon, m, noop.NewTracerProvider(), log)
		attempts, err = proc.ReportPending(ctx)
	} else {
		client := payment.New(payment.Config{BaseURL: pay.BaseURL, APIKey: pay.APIKey, Timeout: pay.Timeout,
			MaxConcurrency: pay.MaxConcurrency, MaxRPS: pay.MaxRPS}, m)
		defer client.Close()
		proc := billing.NewProcessor(db, dedup.NewStore(""), client, horizon, m, noop.NewTracerProvider(), log)
		attempts, err = proc.Recover(ctx, pay.RecoverAfter)
	}
	if err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(struct {
		dedup.Report
		Attempts billing.RecoveryReport `json:"chargeAttempts"`
	}{rep, attempts})
}
