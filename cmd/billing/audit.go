package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"example.com/billing/internal/audit"
	"example.com/billing/internal/config"
	"example.com/billing/internal/postgres"
)

const auditHelp = `
Lists the operator actions recorded in operator_action since --since ago,
oldest first: who (--by), when, the command and what it acted on, why
(--reason) and what it was about to do (its details). Every command that
changes money-relevant state records one before it acts: pause, resume,
dlq replay, payment-methods import, resolve, and maintain when it drops
data earlier than its default retention. The table is append-only: no
role may change or delete a row. Human text by default, --json for tools.`

// auditConfig is what audit reads from the environment.
type auditConfig struct {
	Database config.Database
	Log      config.Log
}

func (c *auditConfig) Validate() error { return errors.Join(c.Database.Validate(), c.Log.Validate()) }

// auditListing is billing audit --json's document.
type auditListing struct {
	Since   time.Time      `json:"since"`
	Actions []audit.Action `json:"actions"`
}

// auditCmd lists the operator actions.
func auditCmd(ctx context.Context, args []string, environ map[string]string, stdout io.Writer) error {
	var cfg auditConfig
	fs := newFlagSet("audit", about{synopsis: "[--since DURATION] [--json]", description: auditHelp, env: &cfg,
		example: "DATABASE_URL=... billing audit --since 168h"})
	since := fs.Duration("since", 24*time.Hour, "list the actions recorded within this long before now")
	asJSON := fs.Bool("json", false, "print JSON for tools instead of text")
	if help, err := parseSubcommandFlags(fs, args, stdout); help || err != nil {
		return err
	}
	if *since <= 0 {
		return errors.New("audit: --since must be positive")
	}
	if err := config.Load(environ, &cfg); err != nil {
		return err
	}
	db, err := postgres.Open(cfg.Database.URL, 1)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer db.Close()
	from := time.Now().Add(-*since).UTC()
	actions, err := audit.Since(ctx, db, from)
	if err != nil {
		if postgres.IsConfigError(err) {
			return fmt.Errorf("DATABASE_URL: %w", err)
		}
		return fmt.Errorf("audit: %w", err)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(auditListing{Since: from, Actions: append([]audit.Action{}, actions...)})
	}
	for _, a := range actions {
		fmt.Fprintln(stdout, a.Text())
	}
	fmt.Fprintf(stdout, "%d operator actions since %s\n", len(actions), from.Format(time.RFC3339))
	return nil
}
