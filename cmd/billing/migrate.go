package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"example.com/billing/internal/config"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/schema"
)

const migrateHelp = `
Applies the database migrations embedded in this binary to DATABASE_URL and
exits. It is safe to run twice, and from several processes at once (goose's
lock table, goose_lock, serializes them). Through a pooler in transaction
mode it applies every migration but one that changes its session's
settings (migration 10's SET lock_timeout): it stops there, naming the pool
mode; apply that one over a direct connection.

Expand migrations (additive: the previous release runs on them) are always
applied. A contract migration (it removes what an older release uses) is
applied only when no replica of such a release is alive (every serve
records itself in the database, with a heartbeat); otherwise it and the
later ones stay pending, billing migrate says which replicas it waits for
and exits 0: run it again once they are replaced. billing serve refuses to
start on a schema older than the oldest it runs on.

billing migrate status prints the schema's version and floor, the replicas
alive and their releases, and the pending migrations, and applies nothing.`

// migrate applies the embedded migrations to DATABASE_URL, or with
// "status" says where the schema stands.
func migrate(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	status := len(args) > 0 && args[0] == "status"
	if status {
		args = args[1:]
	}
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
	if status {
		err = printSchemaStatus(ctx, db, stdout)
	} else {
		_, err = schema.Migrate(ctx, db.DB, log)
	}
	if err != nil && postgres.IsConfigError(err) {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	return err
}

// printSchemaStatus writes where db's schema stands: its version and
// floor, the replicas alive, and the migrations this binary would apply or
// leave pending.
func printSchemaStatus(ctx context.Context, db schema.Queryer, w io.Writer) error {
	st, err := schema.ReadStatus(ctx, db)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "schema version %d; runs releases of schema %d and newer\n", st.Compatibility.Version, st.Compatibility.RunsFrom)
	fmt.Fprintf(w, "this binary (%s) embeds schema %d and runs on schemas %d and newer: %s\n", version, st.Embedded, schema.Oldest, okOr(st.Compatibility.Check(schema.Oldest, st.Embedded)))
	fmt.Fprintf(w, "\nreplicas alive (heartbeat within 30s): %d\n", len(st.Alive))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(st.Alive) > 0 {
		fmt.Fprintln(tw, "  instance\thost\trelease\tschema\truns on\tup\theartbeat")
	}
	now := time.Now()
	for _, r := range st.Alive {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%d+\t%s\t%s ago\n", r.Instance, r.Host, r.Release, r.Schema, r.Oldest,
			now.Sub(r.Started).Round(time.Second), now.Sub(r.Heartbeat).Round(time.Second))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\npending migrations: %d\n", len(st.Pending))
	for _, p := range st.Pending {
		switch {
		case !p.Migration.Contract():
			fmt.Fprintf(w, "  %d %s: expand; billing migrate applies it\n", p.Migration.Version, p.Migration.Path)
		case p.Blocked != nil:
			fmt.Fprintf(w, "  %d %s: contract (releases of schema %d and newer); refused: %v\n", p.Migration.Version, p.Migration.Path, p.Migration.RunsFrom, p.Blocked)
		default:
			fmt.Fprintf(w, "  %d %s: contract (releases of schema %d and newer); no older replica is alive: billing migrate applies it\n", p.Migration.Version, p.Migration.Path, p.Migration.RunsFrom)
		}
	}
	return nil
}

func okOr(err error) string {
	if err != nil {
		return "it does not run here: " + err.Error()
	}
	return "it runs here"
}
