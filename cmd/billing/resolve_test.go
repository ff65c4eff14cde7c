package main

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/outbox"
	"example.com/billing/internal/testenv/kafkatest"
	"example.com/billing/internal/testenv/wait"
)

// status is the charge attempt of id's status, "" when it has none.
func (h *harness) status(id uuid.UUID) string {
	h.t.Helper()
	var s []string
	if err := h.db.Select(&s, `SELECT status FROM charge WHERE event_id = $1`, id.String()); err != nil {
		h.t.Fatal(err)
	}
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// outcomesOf are the types of the outcome events of the order event id on
// the outcome topic.
func (h *harness) outcomesOf(id uuid.UUID) []string {
	h.t.Helper()
	var types []string
	for _, m := range kafkatest.ReadAll(h.t, h.client, h.broker.OutcomeTopic) {
		var v struct {
			EventType   string    `json:"eventType"`
			CausationID uuid.UUID `json:"causationId"`
		}
		if err := json.Unmarshal(m.Value, &v); err != nil {
			h.t.Fatal(err)
		}
		if v.CausationID == id {
			types = append(types, v.EventType)
		}
	}
	return types
}

// billing resolve records an operator's verdict through billing's settle:
// an in_progress payment settled by hand publishes its outcome once and
// decides the event that waited for its order; an attempt the provider has
// no payment for is sent again and charged by serve's recovery. It refuses
// without a reason, refuses an attempt billing may still send, and does
// nothing when its record fails.
func TestResolve_ThroughTheSettle(t *testing.T) {
	h := newHarness(t, 2)
	// Order 60's payment is processing for an hour: in_progress, and
	// looked up only after PAYMENT_RESOLVE_AFTER.
	psp := fakepsp.New(fakepsp.Options{Seed: 1, ProcessingEvery: 60, ProcessingDelay: time.Hour})
	srv := httptest.NewServer(psp)
	t.Cleanup(srv.Close)
	env := h.environ("PAYMENT_BASE_URL", srv.URL, "PAYMENT_RESOLVE_AFTER", "1h", "PAYMENT_RECOVER_AFTER", "20s")
	h.serve(env)

	held, heldValue := event(t, 60, 6000, "EUR")
	h.publish(0, "60", heldValue)
	wait.For(t, 30*time.Second, "order 60's payment in progress", func() bool { return h.status(held.ID) == "in_progress" })
	waiting, waitingValue := event(t, 60, 6000, "EUR") // the order confirmed again: it waits
	h.publish(0, "60", waitingValue)
	h.waitCaughtUp()
	if n := h.count(`SELECT count(*) FROM charge_waiting WHERE event_id = $1`, waiting.ID.String()); n != 1 {
		t.Fatalf("%d waiting rows of the second event, want 1", n)
	}
	var providerID string
	if err := h.db.Get(&providerID, `SELECT provider_charge_id FROM charge WHERE event_id = $1`, held.ID.String()); err != nil {
		t.Fatal(err)
	}

	// A pending attempt older than the window (the provider found nothing
	// under its key), and one billing is still completing.
	lost, _ := event(t, 62, 6200, "EUR")
	fresh, _ := event(t, 63, 6300, "EUR")
	for _, a := range []struct {
		id  uuid.UUID
		ord int64
		age string
	}{{lost.ID, 62, "25 hours"}, {fresh.ID, 63, "0 seconds"}} {
		if _, err := h.db.Exec(`INSERT INTO charge (event_id, order_id, customer_id, amount_minor, currency, status, created_at, updated_at)
VALUES ($1, $2, $3, 100, 'EUR', 'pending', now() - $4::interval, now() - $4::interval)`, a.id.String(), a.ord, 1000+a.ord, a.age); err != nil {
			t.Fatal(err)
		}
	}

	resolve := func(args ...string) (string, error) {
		return runBilling(t, env, append([]string{"resolve"}, args...)...)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"ErrNoReason", []string{held.ID.String(), "--outcome", "succeeded"}, "--reason is required"},
		{"ErrOutcome", []string{held.ID.String(), "--outcome", "paid", "--reason", "x"}, "--outcome must be"},
		{"ErrNotAnID", []string{"4711", "--outcome", "declined", "--reason", "x"}, "not an event id"},
		{"ErrOtherPayment", []string{held.ID.String(), "--outcome", "succeeded", "--provider-id", "ch_other", "--reason", "x"}, "records the provider's payment"},
		{"ErrStillSent", []string{fresh.ID.String(), "--outcome", "declined", "--reason", "x"}, "billing may still send it"},
		{"ErrResendAPayment", []string{held.ID.String(), "--outcome", "resend", "--reason", "x"}, "the provider has a payment"},
		{"ErrNoAttempt", []string{uuid.Must(uuid.NewV7()).String(), "--outcome", "declined", "--reason", "x"}, "no charge attempt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := resolve(tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("billing resolve %s: err = %v, want %q", strings.Join(tc.args, " "), err, tc.want)
			}
		})
	}
	// A failed record: nothing changes.
	allow := refuseRecords(t, h.db)
	if _, err := resolve(held.ID.String(), "--outcome", "succeeded", "--reason", "INC-7"); err == nil || !strings.Contains(err.Error(), "nothing done") {
		t.Errorf("resolve with its record refused: err = %v", err)
	}
	allow()
	if s := h.status(held.ID); s != "in_progress" {
		t.Fatalf("after the refused resolves the attempt is %s, want in_progress", s)
	}
	if n := h.count(`SELECT count(*) FROM operator_action`); n != 0 {
		t.Fatalf("%d operator actions recorded by refused resolves, want 0", n)
	}

	// The bank confirmed the debit: settled by hand, through the settle.
	out, err := resolve(held.ID.String(), "--outcome", "succeeded", "--reason", "INC-7: the bank confirmed the debit", "--by", "bob")
	if err != nil || !strings.Contains(out, "in_progress -> succeeded") {
		t.Fatalf("billing resolve: %v\n%s", err, out)
	}
	if s := h.status(held.ID); s != "succeeded" {
		t.Errorf("the attempt is %s, want succeeded", s)
	}
	if n := h.count(`SELECT count(*) FROM charge WHERE event_id = $1 AND provider_charge_id = $2 AND counted_by = 'deferred'`, held.ID.String(), providerID); n != 1 {
		t.Errorf("the settled attempt does not keep its provider id %s and count its deferred outcome", providerID)
	}
	if n := h.count(`SELECT count(*) FROM charge_waiting WHERE order_id = 60`); n != 0 || h.status(waiting.ID) != "" {
		t.Errorf("the waiting event was not decided already charged: %d waiting, its attempt %q", n, h.status(waiting.ID))
	}
	wait.For(t, 30*time.Second, "the outcome published", func() bool { return len(h.outcomesOf(held.ID)) > 0 })
	if got := h.outcomesOf(held.ID); len(got) != 1 || got[0] != outbox.Succeeded {
		t.Errorf("outcome events of the settled event: %q, want one %s", got, outbox.Succeeded)
	}
	if got := h.outcomesOf(waiting.ID); len(got) != 0 {
		t.Errorf("outcome events of the waiting event: %q, want none (already charged)", got)
	}
	if _, err := resolve(held.ID.String(), "--outcome", "declined", "--reason", "again"); err == nil || !strings.Contains(err.Error(), "succeeded already") {
		t.Errorf("resolving a settled attempt: err = %v", err)
	}

	// The provider has nothing under the lost attempt's key: sent again,
	// and charged by serve's recovery.
	out, err = resolve(lost.ID.String(), "--outcome", "resend", "--reason", "INC-8: the provider has no payment; charge it", "--by", "bob")
	if err != nil || !strings.Contains(out, "pending -> pending") {
		t.Fatalf("billing resolve --outcome resend: %v\n%s", err, out)
	}
	wait.For(t, 60*time.Second, "the lost attempt charged", func() bool { return h.status(lost.ID) == "succeeded" })

	// billing audit lists both, and explain shows them on their events.
	var listing auditListing
	out, err = runBilling(t, env, "audit", "--json")
	if err != nil || json.Unmarshal([]byte(out), &listing) != nil || len(listing.Actions) != 2 {
		t.Fatalf("billing audit --json: %v\n%s", err, out)
	}
	for i, want := range []struct{ subject, outcome string }{{held.ID.String(), "succeeded"}, {lost.ID.String(), "resend"}} {
		a := listing.Actions[i]
		var rec resolveRecord
		if err := json.Unmarshal(a.Details, &rec); err != nil || a.Command != "resolve" || a.By != "bob" || a.Subject != want.subject || rec.Outcome != want.outcome {
			t.Errorf("action %d: %+v (details %s), want bob's resolve of %s as %s", i, a, a.Details, want.subject, want.outcome)
		}
	}
	st := explainJSON(t, env, held.ID.String())
	if len(st.Actions) != 1 || st.Actions[0].ID != listing.Actions[0].ID || st.Events[0].Attempt.Status != "succeeded" {
		t.Errorf("billing explain of the resolved event: actions %+v, attempt %+v", st.Actions, st.Events[0].Attempt)
	}
	st = explainJSON(t, env, waiting.ID.String())
	if ev := st.Events[0]; ev.ChargedBy == nil || *ev.ChargedBy != held.ID || !strings.Contains(ev.Summary, "already charged") {
		t.Errorf("billing explain of the waiting event: %+v", ev)
	}
}
