package main

import (
	"context"
	"fmt"
	"io"

	"example.com/billing/internal/config"
	"example.com/billing/internal/postgres"
)

// migrate applies the embedded migrations to DATABASE_URL.
func migrate(ctx context.Context, args []string, environ map[string]string, stderr io.Writer) error {
	if err := noArgs("migrate", args); err != nil {
		return err
	}
	var cfg config.Migrate
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
