package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/testenv/kafkatest"
	"example.com/billing/internal/testenv/wait"
)

// adyenKey is the Adyen webhook endpoint's HMAC key, in hex.
const adyenKey = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056"

// adyenHarness is the harness with the fake provider speaking Adyen and
// notifying serve's webhook listener, set by tune, and serve's
// environment for Adyen.
func adyenHarness(t *testing.T, tune func(*fakepsp.Options)) (*harness, map[string]string) {
	t.Helper()
	h := newHarness(t, 1)
	webhookAddr := freeAddr(t)
	opts := fakepsp.Options{Profile: fakepsp.ProfileAdyen, Seed: 1, APIKey: "AQE_test_key", AdyenMerchantAccount: "BillingECOM",
		WebhookURL: "http://" + webhookAddr + "/webhooks/adyen", WebhookSecret: adyenKey,
		WebhookRetryMax: 100 * time.Millisecond, ProcessingDelay: 300 * time.Millisecond}
	if tune != nil {
		tune(&opts)
	}
	h.psp.SetOptions(opts)
	env := h.environ(
		"PAYMENT_PROVIDER", "adyen",
		"PAYMENT_BASE_URL", h.pspURL+"/v71",
		"PAYMENT_API_KEY", "AQE_test_key",
		"ADYEN_MERCHANT_ACCOUNT", "BillingECOM",
		"PAYMENT_WEBHOOK_SECRET", adyenKey,
		"WEBHOOK_ADDR", webhookAddr,
	)
	return h, env
}

// pays records that order's customer pays with the stored payment method
// pm at Adyen, as billing payment-methods import does.
func (h *harness) pays(order int64, pm string) {
	h.t.Helper()
	if _, err := h.db.Exec(`INSERT INTO payment_method (customer_id, provider, customer_ref, payment_method_ref) VALUES ($1, 'adyen', $2, $3)`,
		1000+order, fmt.Sprint("shopper-", 1000+order), pm); err != nil {
		h.t.Fatal(err)
	}
}

// charge publishes an event of order and returns its id and value.
func (h *harness) charge(order int64) (uuid.UUID, []byte) {
	h.t.Helper()
	ev, value := event(h.t, order, 1999, "EUR")
	h.publish(0, strconv.FormatInt(order, 10), value)
	return ev.ID, value
}

// attempt is the charge row of an event.
type attempt struct {
	Status      string  `db:"status"`
	ProviderID  *string `db:"provider_charge_id"`
	DeclineCode *string `db:"decline_code"`
}

func (h *harness) attempt(id uuid.UUID) attempt {
	h.t.Helper()
	var a attempt
	if err := h.db.Get(&a, `SELECT status, provider_charge_id, decline_code FROM charge WHERE event_id = $1`, id); err != nil {
		h.t.Fatalf("charge %s: %v", id, err)
	}
	return a
}

// outcomeTypes waits until the outcome topic holds an outcome event of
// the order event id, and returns the types of all of them.
func (h *harness) outcomeTypes(id uuid.UUID) []string {
	h.t.Helper()
	var types []string
	wait.For(h.t, 20*time.Second, "the outcome event of "+id.String(), func() bool {
		types = nil
		for _, m := range kafkatest.ReadAll(h.t, h.client, h.broker.OutcomeTopic) {
			var o struct {
				EventType   string `json:"eventType"`
				CausationID string `json:"causationId"`
			}
			if err := json.Unmarshal(m.Value, &o); err != nil {
				h.t.Fatalf("outcome value %s: %v", m.Value, err)
			}
			if o.CausationID == id.String() {
				types = append(types, o.EventType)
			}
		}
		return len(types) > 0
	})
	return types
}

// adyenIdle waits until the fake has sent every notification it will.
func (h *harness) adyenIdle() {
	h.t.Helper()
	wait.For(h.t, 30*time.Second, "every notification delivered", func() bool { return h.psp.Stats().PendingWebhooks == 0 })
}

// A refusal is an HTTP 200 with resultCode Refused: recorded once as
// declined with its reason, never asked again (not when the event comes
// again, not when its AUTHORISATION success=false is notified).
func TestServe_AdyenRefusalIsRecordedOnceAndNeverAskedAgain(t *testing.T) {
	h, env := adyenHarness(t, nil)
	h.pays(501, "stored_notEnoughBalance")
	s := h.serve(env)
	id, value := h.charge(501)
	h.waitCaughtUp()
	h.adyenIdle()

	a := h.attempt(id)
	p := h.psp.Payments()
	if len(p) != 1 || a.Status != "declined" || a.DeclineCode == nil || *a.DeclineCode != "not_enough_balance" || a.ProviderID == nil || *a.ProviderID != p[0].ID {
		t.Fatalf("attempt %+v, payments %+v: want declined not_enough_balance with Adyen's pspReference", a, p)
	}
	if got := h.outcomeTypes(id); strings.Join(got, ",") != "payment.declined.v1" {
		t.Errorf("outcome events %q, want one payment.declined.v1", got)
	}
	// The same event again is a duplicate: Adyen is not asked.
	h.publish(0, "501", value)
	h.waitCaughtUp()
	st := h.psp.Stats().Adyen
	if st.Requests != 1 || st.Refused != 1 {
		t.Errorf("adyen stats %+v: want one request, refused", st)
	}
	wait.For(t, 10*time.Second, "the notification counted", func() bool {
		return s.metric(t, `billing_webhooks_total{result="no_news"}`) >= 1
	})
	if got := s.metric(t, `billing_events_total{outcome="declined"}`); got != 1 {
		t.Errorf("declined counted %v times, want once", got)
	}
	if got := s.metric(t, `billing_payment_requests_total{result="declined"}`); got != 1 {
		t.Errorf("requests declined %v, want 1", got)
	}
	if got := s.metric(t, `billing_events_total{outcome="duplicate"}`); got != 1 {
		t.Errorf("duplicates %v, want 1", got)
	}
	if got := h.count(`SELECT count(*) FROM notified_payment WHERE provider = 'adyen' AND status = 'declined' AND idempotency_key = $1`, id.String()); got != 1 {
		t.Errorf("%d refusals kept from the notifications, want 1", got)
	}
}

// A Pending payment is in progress: not asked again, settled once by its
// AUTHORISATION notification; the same notification again, and forged
// ones beside it, change nothing; every final state is Adyen's, and
// billing reconcile, from the notifications kept, finds nothing amiss.
func TestServe_AdyenNotificationsSettleOnceAndForgeriesChangeNothing(t *testing.T) {
	h, env := adyenHarness(t, func(o *fakepsp.Options) {
		o.WebhookRepeatRate, o.WebhookForgeRate = 1, 1
		o.WebhookDelayMax = 200 * time.Millisecond
	})
	start := time.Now().UTC()
	methods := map[int64]string{601: "stored_pending", 602: "stored_pendingRefused", 603: "8415718415172200", 604: "stored_refused",
		605: "stored_received", 606: "stored_challengeShopper", 607: "stored_error"}
	for order, pm := range methods {
		h.pays(order, pm)
	}
	s := h.serve(env)
	ids := map[int64]uuid.UUID{}
	for order := range methods {
		ids[order], _ = h.charge(order)
	}
	h.waitCaughtUp()
	if a := h.attempt(ids[601]); a.Status != "in_progress" && a.Status != "succeeded" {
		t.Errorf("the Pending payment's attempt is %s, want in_progress until its notification", a.Status)
	}
	wait.For(t, 30*time.Second, "every attempt settled", func() bool {
		return h.count(`SELECT count(*) FROM charge WHERE status IN ('pending', 'in_progress')`) == 0
	})
	h.adyenIdle()

	want := map[int64]string{601: "succeeded", 602: "declined", 603: "succeeded", 604: "declined", 605: "succeeded", 606: "declined", 607: "declined"}
	byEvent := map[string]fakepsp.Payment{}
	for _, p := range h.psp.Payments() {
		byEvent[p.EventID] = p
	}
	for order, id := range ids {
		a, p := h.attempt(id), byEvent[id.String()]
		// A payment that waits for the shopper is answered without its
		// pspReference.
		ref := p.ID
		if order == 606 {
			ref = ""
		}
		if a.Status != want[order] || p.Status != a.Status || deref(a.ProviderID) != ref {
			t.Errorf("order %d (%s): attempt %+v, Adyen %+v: want %s, as Adyen", order, methods[order], a, p, want[order])
		}
		wantOutcome := "payment.succeeded.v1"
		if want[order] == "declined" {
			wantOutcome = "payment.declined.v1"
		}
		if got := h.outcomeTypes(id); strings.Join(got, ",") != wantOutcome {
			t.Errorf("order %d: outcome events %q, want one %s", order, got, wantOutcome)
		}
	}
	st := h.psp.Stats()
	if st.Adyen.Requests != int64(len(methods)) || st.OrdersChargedTwice != 0 {
		t.Errorf("adyen stats %+v: want one request per event, no order charged twice", st.Adyen)
	}
	wh := st.Adyen.Webhooks
	if wh.Repeated == 0 || wh.Forged == 0 || wh.ForgedAccepted != 0 || wh.Delivered != wh.Events {
		t.Errorf("webhook stats %+v: want every item delivered and repeated, forged ones, no batch of forgeries accepted", wh)
	}
	if got := s.metric(t, `billing_webhooks_total{result="refused"}`); got == 0 {
		t.Errorf("no forged item counted as refused")
	}
	if got := s.metric(t, `billing_webhooks_total{result="settled"}`); got != 3 {
		t.Errorf("%v outcomes settled by a notification, want 3 (the Pending and Received payments)", got)
	}

	out, err := reconcileRun(t, env, "--from", start.Add(-time.Minute).Format(time.RFC3339Nano), "--to", time.Now().Add(time.Minute).Format(time.RFC3339Nano))
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if !strings.Contains(out, "matched 3, declined or rejected (not expected at the provider) 4, missing at provider 0, missing in database 0, mismatched 0, pending 0") {
		t.Errorf("reconcile from the kept notifications:\n%s", out)
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// A batch whose second item cannot be committed is not acknowledged:
// Adyen sends it again, and its redelivery settles both items, once each.
func TestServe_AdyenBatchIsAcknowledgedOnlyOnceAllOfItIsCommitted(t *testing.T) {
	h, env := adyenHarness(t, func(o *fakepsp.Options) {
		// Both verdicts come together, well after both attempts are in
		// progress, and go in one batch.
		o.ProcessingDelay, o.WebhookBatchWait = 3*time.Second, time.Second
	})
	h.pays(701, "stored_pending")
	h.pays(702, "stored_pending")
	s := h.serve(env)
	first, _ := h.charge(701)
	second, _ := h.charge(702)
	h.waitCaughtUp()
	if h.attempt(first).Status != "in_progress" || h.attempt(second).Status != "in_progress" {
		t.Fatalf("attempts %+v, %+v: want both in progress", h.attempt(first), h.attempt(second))
	}
	// The item created second is second in the batch; its settle fails
	// until the test lets it.
	if p := h.psp.Payments(); len(p) != 2 || p[1].EventID != second.String() {
		first, second = second, first
	}
	for _, q := range []string{
		`CREATE TABLE fail_settle (event_id uuid PRIMARY KEY)`,
		`INSERT INTO fail_settle VALUES ('` + second.String() + `')`,
		`CREATE FUNCTION fail_settle() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
	IF NEW.status <> OLD.status AND EXISTS (SELECT 1 FROM fail_settle WHERE event_id = NEW.event_id) THEN
		RAISE EXCEPTION 'test: the settle of % fails', NEW.event_id;
	END IF;
	RETURN NEW;
END $$`,
		`CREATE TRIGGER fail_settle BEFORE UPDATE ON charge FOR EACH ROW EXECUTE FUNCTION fail_settle()`,
	} {
		if _, err := h.db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	wait.For(t, 20*time.Second, "the batch refused", func() bool { return h.psp.Stats().Adyen.Webhooks.Refused >= 2 })
	if h.attempt(second).Status != "in_progress" {
		t.Errorf("the failing item's attempt is %s", h.attempt(second).Status)
	}

	if _, err := h.db.Exec(`DELETE FROM fail_settle`); err != nil {
		t.Fatal(err)
	}
	h.adyenIdle()
	for _, id := range []uuid.UUID{first, second} {
		if a := h.attempt(id); a.Status != "succeeded" {
			t.Errorf("attempt %s %+v, want succeeded", id, a)
		}
		if got := h.outcomeTypes(id); strings.Join(got, ",") != "payment.succeeded.v1" {
			t.Errorf("outcome events of %s: %q, want one payment.succeeded.v1", id, got)
		}
	}
	wh := h.psp.Stats().Adyen.Webhooks
	if wh.Batches != 1 || wh.LargestBatch != 2 || wh.Delivered != 2 || wh.Refused < 2 {
		t.Errorf("webhook stats %+v: want one batch of both items, refused, then accepted", wh)
	}
	if got := s.metric(t, `billing_webhooks_total{result="failed"}`); got < 2 {
		t.Errorf("failed notifications %v, want the refused batch's", got)
	}
	if got := s.metric(t, `billing_events_total{outcome="charged"}`); got != 2 {
		t.Errorf("charged counted %v, want 2", got)
	}
}
