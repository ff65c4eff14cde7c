package migrations_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pressly/goose/v3"

	"example.com/billing/db/migrations"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/schema"
	"example.com/billing/internal/testenv/dbtest"
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

	if _, err := schema.Migrate(ctx, db.DB, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
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
		if err := db.Get(&inserted, `WITH ins AS (INSERT INTO processed_event (event_id, consumer_group, claimed_with) VALUES ($1, 'billing-order-confirmed', 2)
			ON CONFLICT DO NOTHING RETURNING 1) SELECT count(*) FROM ins`, id); err != nil {
			t.Fatal(err)
		}
		if inserted != 0 {
			t.Errorf("event %s is no longer known after the migration", id)
		}
	}
}

// Migration 4 (claim → charge → settle) carries the settled charges of the
// one-transaction design over unchanged, and fences out a binary of that
// design: its claim, which does not say which protocol recorded it, fails
// before it could reach the provider, so during a rolling update it cannot
// charge an order whose attempt a new binary left pending.
func TestChargeAttemptsKeepOldRowsAndFenceOutTheOldClaim(t *testing.T) {
	ctx := context.Background()
	db, provider := atPipelineSchema(t)
	if _, err := provider.UpTo(ctx, 3); err != nil {
		t.Fatal(err)
	}
	old, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	// What the earlier binary wrote for a charged event.
	if _, err := db.Exec(`INSERT INTO processed_event (event_id, consumer_group, fingerprint) VALUES ($1, 'g', NULL)`, old); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO charge (event_id, order_id, customer_id, amount_minor, currency, status, provider_charge_id, created_at)
		VALUES ($1, 7, 8, 1999, 'EUR', 'succeeded', 'ch_1', now() - interval '1 hour')`, old); err != nil {
		t.Fatal(err)
	}
	if _, err := provider.Up(ctx); err != nil {
		t.Fatal(err)
	}

	var row struct {
		Status   string    `db:"status"`
		Created  time.Time `db:"created_at"`
		Settled  time.Time `db:"settled_at"`
		Requests int       `db:"requests"`
	}
	if err := db.Get(&row, `SELECT status, created_at, settled_at, requests FROM charge WHERE event_id = $1`, old); err != nil {
		t.Fatal(err)
	}
	if row.Status != "succeeded" || !row.Settled.Equal(row.Created) {
		t.Errorf("the old charge became %+v; want it succeeded, settled when it was created", row)
	}
	var claimedWith int
	if err := db.Get(&claimedWith, `SELECT claimed_with FROM processed_event WHERE event_id = $1`, old); err != nil || claimedWith != 1 {
		t.Errorf("the old claim's protocol = %d (%v), want 1", claimedWith, err)
	}

	// The earlier binary's claim statement, as it was written.
	next, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.Exec(`INSERT INTO processed_event (event_id, consumer_group, fingerprint)
		SELECT id, $3, fp FROM unnest($1::uuid[], $2::bytea[]) AS e(id, fp) ORDER BY id ON CONFLICT DO NOTHING RETURNING event_id`,
		pq.StringArray{next.String()}, pq.ByteaArray{make([]byte, 32)}, "g")
	var pqErr *pq.Error
	if !errors.As(err, &pqErr) || pqErr.Code != "23502" {
		t.Fatalf("the earlier binary's claim = %v, want a not-null violation (23502)", err)
	}
	// Two pending attempts for one order cannot coexist.
	for i, id := range []uuid.UUID{uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())} {
		_, err := db.Exec(`INSERT INTO charge (event_id, order_id, customer_id, amount_minor, currency, status) VALUES ($1, 9, 8, 100, 'EUR', 'pending')`, id)
		if i == 1 && (!errors.As(err, &pqErr) || pqErr.Code != "23505") {
			t.Errorf("a second pending attempt for order 9: %v, want a unique violation", err)
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
