package migrations_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"github.com/pressly/goose/v3"

	"example.com/billing/db/migrations"
	"example.com/billing/internal/dbtest"
	"example.com/billing/internal/postgres"
)

// The pipeline's plain processed_event becomes the partitioned one without
// losing a row, and every old row is still a duplicate afterwards.
func TestPartitioningKeepsExistingRows(t *testing.T) {
	ctx := context.Background()
	db, _ := atPipelineSchema(t)

	// Rows of a deployment that ran the plain table for a month.
	var ids []uuid.UUID
	for _, age := range []time.Duration{30 * 24 * time.Hour, 10 * 24 * time.Hour, 25 * time.Hour, time.Minute} {
		id, err := uuid.NewV7AtTime(time.Now().Add(-age))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		for _, group := range []string{"billing-order-confirmed", "notifications"} {
			if _, err := db.Exec(`INSERT INTO processed_event (event_id, consumer_group) VALUES ($1, $2)`, id, group); err != nil {
				t.Fatal(err)
			}
		}
	}

	if err := postgres.Migrate(ctx, db.DB, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}

	var rows int
	if err := db.Get(&rows, `SELECT count(*) FROM processed_event`); err != nil {
		t.Fatal(err)
	}
	if rows != 2*len(ids) {
		t.Fatalf("%d rows after the migration, want %d", rows, 2*len(ids))
	}
	var partitioned bool
	if err := db.Get(&partitioned, `SELECT relkind = 'p' FROM pg_class WHERE relname = 'processed_event'`); err != nil {
		t.Fatal(err)
	}
	if !partitioned {
		t.Fatal("processed_event is not partitioned")
	}
	for _, id := range ids {
		var inserted int
		if err := db.Get(&inserted, `WITH ins AS (INSERT INTO processed_event (event_id, consumer_group) VALUES ($1, 'billing-order-confirmed')
			ON CONFLICT DO NOTHING RETURNING 1) SELECT count(*) FROM ins`, id); err != nil {
			t.Fatal(err)
		}
		if inserted != 0 {
			t.Errorf("event %s is no longer known after the migration", id)
		}
	}
}

func TestPartitioningRefusesIDsWithoutTime(t *testing.T) {
	ctx := context.Background()
	db, provider := atPipelineSchema(t)
	if _, err := db.Exec(`INSERT INTO processed_event (event_id, consumer_group) VALUES (gen_random_uuid(), 'g')`); err != nil {
		t.Fatal(err)
	}
	if _, err := provider.Up(ctx); err == nil {
		t.Fatal("a UUID v4 row was migrated into a time partition it does not belong to")
	}
	var rows int
	if err := db.Get(&rows, `SELECT count(*) FROM processed_event`); err != nil || rows != 1 {
		t.Fatalf("the failed migration lost rows: %d, %v", rows, err)
	}
}

// atPipelineSchema returns a fresh database migrated to version 1 only (the
// plain processed_event of the pipeline), and the provider that can take it
// further.
func atPipelineSchema(t *testing.T) (*sqlx.DB, *goose.Provider) {
	t.Helper()
	db, err := postgres.Open(dbtest.Empty(t), 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	provider, err := goose.NewProvider(goose.DialectPostgres, db.DB, migrations.FS, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := provider.UpTo(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	return db, provider
}
