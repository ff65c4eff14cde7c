package outbox_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"example.com/billing/internal/order"
	"example.com/billing/internal/outbox"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/testenv/dbtest"
	"example.com/billing/internal/testenv/wait"
)

// retentionDB is a migrated database and the outbox's retention over it,
// keeping a day of published outcomes.
func retentionDB(t *testing.T) (*sqlx.DB, *outbox.Retention) {
	t.Helper()
	db, _ := dbtest.New(t)
	return db, outbox.NewRetention(db, 24*time.Hour, 2, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// outcomeOf is the succeeded outcome of an order event created at.
func outcomeOf(t *testing.T, orderID int64, at time.Time) outbox.Event {
	t.Helper()
	ev := order.Event{ID: uuid.Must(uuid.NewV7AtTime(at)), OrderID: orderID, CustomerID: 9, Amount: order.Money{Minor: 100, Currency: "EUR"}}
	return outbox.NewEvent(outbox.Succeeded, ev, "", time.Now())
}

func recordIn(t *testing.T, db sqlx.ExtContext, o outbox.Event) {
	t.Helper()
	tx, ok := db.(*sqlx.Tx)
	if !ok {
		if err := postgres.InTx(context.Background(), db.(*sqlx.DB), func(tx *sqlx.Tx) error {
			return outbox.Record(context.Background(), tx, []outbox.Event{o})
		}); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err := outbox.Record(context.Background(), tx, []outbox.Event{o}); err != nil {
		t.Fatal(err)
	}
}

// partitionOf is the outbox partition that holds the outcome eventID.
func partitionOf(t *testing.T, db *sqlx.DB, eventID uuid.UUID) string {
	t.Helper()
	var name string
	if err := db.Get(&name, `SELECT tableoid::regclass::text FROM outbox WHERE event_id = $1`, eventID); err != nil {
		t.Fatalf("outcome %s: %v", eventID, err)
	}
	return name
}

// The outcome of an order event days older than the outbox keeps lands in
// the default partition: no writer creates a day, and retention never
// drops an expired day for it, or brings one back.
func TestRecord_AnOldEventsOutcomeLandsInTheDefaultPartition(t *testing.T) {
	db, ret := retentionDB(t)
	if _, err := ret.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	old := outcomeOf(t, 1, time.Now().Add(-5*24*time.Hour))
	recordIn(t, db, old)
	if got := partitionOf(t, db, old.EventID); got != "outbox_default" {
		t.Errorf("the outcome of a 5-day-old event is in %s, want outbox_default", got)
	}
	rep, err := ret.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Created) != 0 || len(rep.Kept) != 0 {
		t.Errorf("retention created %v and kept %v, want neither: the old outcome creates no day", rep.Created, rep.Kept)
	}
}

// Once maintenance creates a day whose outcomes landed in the default
// partition (it had fallen behind), they move into the day with it.
func TestEnsure_ADayTakesItsRowsFromTheDefaultPartition(t *testing.T) {
	db, _ := retentionDB(t)
	day := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, 10) // far ahead: no partition yet
	o := outcomeOf(t, 2, day.Add(time.Hour))
	recordIn(t, db, o)
	if got := partitionOf(t, db, o.EventID); got != "outbox_default" {
		t.Fatalf("outcome in %s, want outbox_default before its day exists", got)
	}
	if err := outbox.Table.Ensure(context.Background(), db, day); err != nil {
		t.Fatal(err)
	}
	if got, want := partitionOf(t, db, o.EventID), outbox.Table.Name(day); got != want {
		t.Errorf("outcome in %s after its day was created, want %s", got, want)
	}
}

// Retention must not drop an unpublished outcome with its day. A writer
// that commits a row into an expired day while retention drops it (its
// transaction began before, here: an outcome of a 3-day-old event recorded
// into the day that still exists) used to lose it: retention counted the
// day's unpublished rows, then detached and dropped it, and the row
// committed in between went with it. The test widens that window: the
// writer's row is uncommitted while retention looks, and committed while
// retention waits to detach the day. The count that decides now comes
// after the detach, under its lock.
func TestRetention_ARowCommittedWhileItsDayIsDroppedIsNotLost(t *testing.T) {
	db, ret := retentionDB(t)
	ctx := context.Background()
	day := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, -3)
	if err := outbox.Table.Ensure(ctx, db, day); err != nil {
		t.Fatal(err)
	}
	published := outcomeOf(t, 3, day.Add(time.Hour))
	recordIn(t, db, published)
	if _, err := db.Exec(`UPDATE outbox SET published_at = now()`); err != nil {
		t.Fatal(err)
	}

	writer, err := db.Beginx()
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Rollback() //nolint:errcheck // committed below
	late := outcomeOf(t, 4, day.Add(2*time.Hour))
	recordIn(t, writer, late)

	done := make(chan error, 1)
	go func() { _, err := ret.Run(ctx); done <- err }()
	wait.For(t, 20*time.Second, "retention waiting to detach the day", func() bool {
		var n int
		_ = db.Get(&n, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%DETACH PARTITION%' AND wait_event_type = 'Lock'`)
		return n > 0
	})
	if err := writer.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	unpublishedLate := func() int {
		var n int
		if err := db.Get(&n, `SELECT count(*) FROM outbox WHERE event_id = $1 AND published_at IS NULL`, late.EventID); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if unpublishedLate() != 1 {
		t.Fatal("the outcome committed while its day was being dropped is gone: lost")
	}
	rep, err := ret.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Kept) != 1 || len(rep.Dropped) != 0 || unpublishedLate() != 1 {
		t.Errorf("kept %v, dropped %v: want the day kept for its unpublished outcome", rep.Kept, rep.Dropped)
	}

	// Published, the day goes at the next run.
	if _, err := db.Exec(`UPDATE outbox SET published_at = now()`); err != nil {
		t.Fatal(err)
	}
	if rep, err = ret.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if len(rep.Dropped) != 1 || rep.Dropped[0] != outbox.Table.Name(day) {
		t.Errorf("retention dropped %v once everything was published, want %s", rep.Dropped, outbox.Table.Name(day))
	}
}

// The default partition keeps unpublished rows whatever their age, and
// loses the published ones once they are as old as a day retention drops.
func TestRetention_PrunesPublishedRowsOfTheDefaultPartition(t *testing.T) {
	db, ret := retentionDB(t)
	ctx := context.Background()
	var ids []uuid.UUID
	for i := range 3 {
		o := outcomeOf(t, int64(10+i), time.Now().Add(-5*24*time.Hour))
		recordIn(t, db, o)
		ids = append(ids, o.EventID)
	}
	// Two recorded two days ago, of which one published; one published now.
	if _, err := db.Exec(`UPDATE outbox SET recorded_at = now() - interval '2 days' WHERE event_id = ANY($1::uuid[])`, uuidArray(ids[:2])); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE outbox SET published_at = now() WHERE event_id = ANY($1::uuid[])`, uuidArray([]uuid.UUID{ids[0], ids[2]})); err != nil {
		t.Fatal(err)
	}
	rep, err := ret.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Pruned != 1 {
		t.Errorf("pruned %d rows, want 1 (published, recorded before the retention)", rep.Pruned)
	}
	var left []uuid.UUID
	if err := db.Select(&left, `SELECT event_id FROM outbox_default ORDER BY event_id`); err != nil {
		t.Fatal(err)
	}
	if len(left) != 2 {
		t.Errorf("%d rows left in the default partition, want the unpublished one and the recent one", len(left))
	}
}

func uuidArray(ids []uuid.UUID) pq.StringArray {
	out := make(pq.StringArray, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}
