package notified_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"example.com/billing/internal/charge"
	"example.com/billing/internal/notified"
	"example.com/billing/internal/payment"
	"example.com/billing/internal/reconcile"
	"example.com/billing/internal/testenv/dbtest"
)

const (
	key1 = "01938d2e-8a41-7e5c-b3f2-5d0c3a9e7b21"
	key2 = "01938d2e-8a41-7e5c-b3f2-5d0c3a9e7b22"
	key3 = "01938d2e-8a41-7e5c-b3f2-5d0c3a9e7b23"
	key4 = "01938d2e-8a41-7e5c-b3f2-5d0c3a9e7b24"
)

var at = time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)

// note is a notification of the payment ref under key, succeeded or not,
// at when.
func note(ref, key, status string, when time.Time) payment.Notification {
	kind := payment.Succeeded
	if status == "declined" {
		kind = payment.Declined
	}
	return payment.Notification{ID: "AUTHORISATION " + ref, IdempotencyKey: key, Outcome: payment.Outcome{Kind: kind, Ref: ref},
		Payment: &payment.ListedCharge{ID: ref, IdempotencyKey: key, Amount: 1999, Currency: "EUR", Status: status, Created: when}}
}

func TestStore_KeepsEachVerdictOnce(t *testing.T) {
	t.Parallel()
	db, _ := dbtest.New(t)
	ctx := context.Background()
	adyen := notified.NewStore(db, "adyen")
	batch := []payment.Notification{
		note("PSP1", key1, "succeeded", at),
		note("PSP2", key2, "declined", at.Add(time.Minute)),
		{ID: "no payment", IdempotencyKey: key3, Outcome: payment.Outcome{Kind: payment.Succeeded, Ref: "PSP3"}},
	}
	for range 2 { // the same batch sent again
		if err := adyen.Keep(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	// Both verdicts of one payment, should a provider send them; one of
	// another provider's; one without the provider's time.
	if err := adyen.Keep(ctx, []payment.Notification{note("PSP2", key2, "succeeded", at.Add(2*time.Minute)), note("PSP9", "order-9", "succeeded", time.Time{})}); err != nil {
		t.Fatal(err)
	}
	if err := notified.NewStore(db, "other").Keep(ctx, []payment.Notification{note("PSP1", key1, "succeeded", at)}); err != nil {
		t.Fatal(err)
	}
	if err := adyen.Keep(ctx, nil); err != nil {
		t.Fatal(err)
	}

	got, err := adyen.Charges(ctx, at, at.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	want := []payment.ListedCharge{
		{ID: "PSP1", IdempotencyKey: key1, Amount: 1999, Currency: "EUR", Status: "succeeded", Created: at},
		{ID: "PSP2", IdempotencyKey: key2, Amount: 1999, Currency: "EUR", Status: "declined", Created: at.Add(time.Minute)},
		{ID: "PSP2", IdempotencyKey: key2, Amount: 1999, Currency: "EUR", Status: "succeeded", Created: at.Add(2 * time.Minute)},
	}
	if !slices.Equal(got, want) {
		t.Errorf("Charges =\n%+v\nwant\n%+v", got, want)
	}
	now, err := adyen.Charges(ctx, time.Now().Add(-time.Minute), time.Now().Add(time.Minute))
	if err != nil || len(now) != 1 || now[0].ID != "PSP9" {
		t.Errorf("a payment kept without the provider's time: %+v, %v; want it at its receipt", now, err)
	}
}

// billing reconcile for Adyen compares the charge table with the kept
// notifications: what agrees matches; a row succeeded without a success
// notified is missing at the provider; a row declined whose payment Adyen
// notified as authorised is a mismatch; a success notified for no row is
// missing in the database.
func TestStore_IsReconciliationsLedger(t *testing.T) {
	t.Parallel()
	db, _ := dbtest.New(t)
	ctx := context.Background()
	row(t, db, key1, 41, charge.Succeeded, "PSP1")
	row(t, db, key2, 42, charge.Succeeded, "PSP2")
	row(t, db, key3, 43, charge.Declined, "PSP3")
	kept := notified.NewStore(db, "adyen")
	err := kept.Keep(ctx, []payment.Notification{
		note("PSP1", key1, "succeeded", at.Add(time.Second)),
		note("PSP2", key2, "declined", at.Add(time.Second)),
		note("PSP3", key3, "succeeded", at.Add(time.Second)),
		note("PSP4", key4, "succeeded", at.Add(time.Second)),
	})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := reconcile.Reconcile(ctx, reconcile.NewStore(db), kept, reconcile.Window{From: at.Add(-time.Hour), To: at.Add(time.Hour)},
		reconcile.Options{Slack: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	want := reconcile.Summary{Records: 3, Charges: 3, Matched: 1, MissingAtProvider: 1, MissingInDB: 1, Mismatched: 1}
	if rep.Summary != want {
		t.Errorf("summary %+v, want %+v", rep.Summary, want)
	}
	kinds := map[string]reconcile.Kind{}
	for _, d := range rep.Discrepancies {
		kinds[d.Key] = d.Kind
	}
	if kinds[key2] != reconcile.MissingAtProvider || kinds[key3] != reconcile.Mismatch || kinds[key4] != reconcile.MissingInDB {
		t.Errorf("discrepancies %+v", rep.Discrepancies)
	}
}

// row records a charge row of key for order, recorded at at.
func row(t *testing.T, db *sqlx.DB, key string, order int64, status, ref string) {
	t.Helper()
	_, err := db.Exec(`INSERT INTO charge (event_id, order_id, customer_id, amount_minor, currency, status, provider_charge_id, created_at)
VALUES ($1, $2::bigint, 1000 + $2::bigint, 1999, 'EUR', $3, $4, $5)`, key, order, status, ref, at)
	if err != nil {
		t.Fatal(err)
	}
}
