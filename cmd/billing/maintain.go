package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/prometheus/client_golang/prometheus"

	"example.com/billing/internal/config"
	"example.com/billing/internal/dedup"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/postgres"
)

const maintainHelp = `
Runs the dedup store's retention once, for a Kubernetes CronJob: creates
processed_event's daily partitions DEDUP_PARTITIONS_AHEAD days ahead and
drops those older than DEDUP_RETENTION, then prints what it did as JSON on
stdout. serve does the same every DEDUP_MAINTENANCE_INTERVAL; an advisory
lock lets one of them work at a time.`

// maintain runs dedup-store retention once.
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
	db, err := postgres.Open(cfg.Database.URL, 2)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer db.Close()
	r := dedup.NewRetention(db, cfg.Dedup.Retention, cfg.Dedup.PartitionsAhead, metrics.New(prometheus.NewRegistry()), log)
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
	return json.NewEncoder(stdout).Encode(rep)
}
