package reconcile_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"

	"example.com/billing/internal/charge"
	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/payment"
	"example.com/billing/internal/payment/contract"
	"example.com/billing/internal/reconcile"
	"example.com/billing/internal/testenv/dbtest"
)

// world is a real database and a fake provider over HTTP.
type world struct {
	t      *testing.T
	db     *sqlx.DB
	psp    *fakepsp.Server
	url    string
	ledger *payment.Client
}

// newWorld starts the provider and, withDB, creates a database.
func newWorld(t *testing.T, withDB bool) *world {
	t.Helper()
	t.Parallel() // a database takes seconds to create and migrate
	psp := fakepsp.New(fakepsp.Options{APIKey: "sk_test", Seed: 1})
	srv := httptest.NewServer(psp)
	t.Cleanup(srv.Close)
	w := &world{t: t, psp: psp, url: srv.URL,
		ledger: payment.New(contract.New(srv.URL, "sk_test"), payment.Config{Timeout: 5 * time.Second}, metrics.New(prometheus.NewRegistry()))}
	if withDB {
		w.db, _ = dbtest.New(t)
	}
	return w
}

// charge makes the provider charge orderID under key and returns the charge id.
func (w *world) charge(key string, orderID, amount int64) string {
	w.t.Helper()
	body := fmt.Sprintf(`{"orderId":%d,"customerId":%d,"amount":%d,"currency":"EUR"}`, orderID, 1000+orderID, amount)
	req, _ := http.NewRequest(http.MethodPost, w.url+"/v1/charges", strings.NewReader(body))
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Authorization", "Bearer sk_test")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	var c struct{ ID string }
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || resp.StatusCode != http.StatusOK {
		w.t.Fatalf("charge %s: %s %v", key, resp.Status, err)
	}
	return c.ID
}

// row records a charge row; chargeID "" records a decline.
func (w *world) row(key string, orderID, amount int64, chargeID string, at time.Time) {
	w.t.Helper()
	status := charge.Succeeded
	var pid *string
	if chargeID == "" {
		status = charge.Declined
	} else {
		pid = &chargeID
	}
	_, err := w.db.Exec(`INSERT INTO charge (event_id, order_id, customer_id, amount_minor, currency, status, provider_charge_id, created_at)
VALUES ($1, $2, $3, $4, 'EUR', $5, $6, $7)`, key, orderID, 1000+orderID, amount, status, pid, at)
	if err != nil {
		w.t.Fatal(err)
	}
}

func newKey(t *testing.T) string {
	t.Helper()
	return uuid.Must(uuid.NewV7()).String()
}

func TestReconcile_DatabaseAndProvider(t *testing.T) {
	w := newWorld(t, true)
	start := time.Now().UTC().Add(-time.Minute)

	agree, rowOnly, provOnly, oldRow, declined, late, amount := newKey(t), newKey(t), newKey(t), newKey(t), newKey(t), newKey(t), newKey(t)
	w.row(agree, 1, 100, w.charge(agree, 1, 100), time.Now())
	w.row(rowOnly, 2, 100, "ch_lost", time.Now())
	w.charge(provOnly, 3, 100)
	// Recorded long before the window (a retry after an outage may do
	// that): found by key, not missing in the database.
	w.row(oldRow, 4, 100, w.charge(oldRow, 4, 100), start.Add(-48*time.Hour))
	w.row(declined, 5, 100, "", time.Now())
	w.row(amount, 7, 100, w.charge(amount, 7, 250), time.Now())
	cut := time.Now().UTC()
	time.Sleep(5 * time.Millisecond)
	// Recorded just inside the window, charged just after it: found by the
	// slack, not missing at the provider.
	w.row(late, 6, 100, w.charge(late, 6, 100), cut.Add(-time.Millisecond))

	win := reconcile.Window{From: start, To: cut}
	rep, err := reconcile.Reconcile(context.Background(), reconcile.NewStore(w.db), w.ledger, win, reconcile.Options{Slack: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	want := reconcile.Summary{Records: 5, Charges: 4, Matched: 3, Declined: 1, MissingAtProvider: 1, MissingInDB: 1, Mismatched: 1}
	if rep.Summary != want {
		t.Errorf("summary = %+v, want %+v", rep.Summary, want)
	}
	got := map[string]reconcile.Kind{}
	for _, d := range rep.Discrepancies {
		got[d.Key] = d.Kind
	}
	wantDisc := map[string]reconcile.Kind{rowOnly: reconcile.MissingAtProvider, provOnly: reconcile.MissingInDB, amount: reconcile.Mismatch}
	if fmt.Sprint(got) != fmt.Sprint(wantDisc) {
		t.Errorf("discrepancies = %v, want %v", got, wantDisc)
	}

	// Without the slack the late charge is not seen.
	rep, err = reconcile.Reconcile(context.Background(), reconcile.NewStore(w.db), w.ledger, win, reconcile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Summary.MissingAtProvider != 2 {
		t.Errorf("without slack: missing at provider = %d, want 2 (the late one too)", rep.Summary.MissingAtProvider)
	}
}

func TestReconcile_EmptyWindow(t *testing.T) {
	w := newWorld(t, true)
	now := time.Now()
	rep, err := reconcile.Reconcile(context.Background(), reconcile.NewStore(w.db), w.ledger,
		reconcile.Window{From: now.Add(-time.Hour), To: now}, reconcile.Options{Slack: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Summary != (reconcile.Summary{}) || len(rep.Discrepancies) != 0 {
		t.Errorf("report = %+v, want nothing", rep)
	}
	if _, err := reconcile.Reconcile(context.Background(), reconcile.NewStore(w.db), w.ledger,
		reconcile.Window{From: now, To: now}, reconcile.Options{}); err == nil {
		t.Error("an empty window was accepted")
	}
}

func TestReconcile_DatabaseDown(t *testing.T) {
	w := newWorld(t, true)
	w.db.Close()
	now := time.Now()
	_, err := reconcile.Reconcile(context.Background(), reconcile.NewStore(w.db), w.ledger,
		reconcile.Window{From: now.Add(-time.Hour), To: now}, reconcile.Options{})
	if err == nil || !strings.Contains(err.Error(), "select charges created in") {
		t.Errorf("err = %v, want the failing query named", err)
	}
}

// The payment client, as reconcile's ledger, lists the fake provider's
// charges of a window.
func TestLedger_FakeProviderWindow(t *testing.T) {
	w := newWorld(t, false)
	before := time.Now().UTC()
	k := newKey(t)
	id := w.charge(k, 9, 500)
	after := time.Now().UTC()
	got, err := w.ledger.Charges(context.Background(), before, after.Add(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID != id || got[0].IdempotencyKey != k || got[0].Amount != 500 || got[0].Currency != "EUR" || got[0].OrderID != 9 {
		t.Fatalf("charges = %+v, want the one of key %s", got, k)
	}
	// created_lt is exclusive, to the nanosecond.
	got, err = w.ledger.Charges(context.Background(), before, got[0].Created)
	if err != nil || len(got) != 0 {
		t.Errorf("charges before its creation = %+v, %v; want none", got, err)
	}
}
