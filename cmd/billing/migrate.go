package main

import (
	"context"
	"fmt"
	"io"

	"example.com/billing/internal/config"
	"example.com/billing/internal/postgres"
)

const migrateHelp = `
Applies the database migrations embedded in this binary to DATABASE_URL and
exits. It is safe to run twice, and from several processes at once (a
PostgreSQL advisory lock serializes them). billing serve refuses to start
on a schema older than its own.`

// migrate applies the embedded migrations to DATABASE_URL.
func migrate(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	var cfg config.Migrate
	fs := newFlagSet("migrate", about{description: migrateHelp, env: &cfg,
		example: `DATABASE_URL='postgres://billing:secret@db:5432/billing?sslmode=verify-full' billing migrate`})
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
	if err := postgres.Migrate(ctx, db.DB, log); err != nil {
		if postgres.IsConfigError(err) {
			return fmt.Errorf("DATABASE_URL: %w", err)
		}
		return err
	}
	return nil
}
