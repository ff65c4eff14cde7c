package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/dlq"
	"example.com/billing/internal/testenv/dbtest"
	"example.com/billing/internal/testenv/kafkatest"
	"example.com/billing/internal/testenv/wait"
)

// importMethods runs `billing payment-methods import` with csv on stdin.
func importMethods(t *testing.T, dsn, csv string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	env := map[string]string{"DATABASE_URL": dsn, "PAYMENT_PROVIDER": "stripe"}
	if err := run(context.Background(), []string{"billing", "payment-methods", "import", "--reason", "a test imports cards"}, env, strings.NewReader(csv), &stdout, &stderr); err != nil {
		t.Fatalf("payment-methods import: %v\n%s", err, stderr.String())
	}
}

// serve on Stripe, end to end: the customers' cards imported by the
// command, charges through Stripe's API, a bank debit settled by its
// signed webhook (repeated, with forged and stale copies the listener
// refuses), a card declined, and a customer without a card parked
// no-payment-method, then charged once the card is imported and the
// dead-letter message replayed. Every event's outcome is published once
// per fact.
func TestServe_StripeEndToEnd(t *testing.T) {
	h := newHarness(t, 2)
	webhookAddr := freeAddr(t)
	psp := fakepsp.New(fakepsp.Options{Profile: fakepsp.ProfileStripe, Seed: 3, ProcessingDelay: 200 * time.Millisecond,
		SearchLag: time.Nanosecond, WebhookURL: "http://" + webhookAddr + "/webhooks/stripe", WebhookSecret: "whsec_new",
		WebhookRepeatRate: 1, WebhookForgeRate: 1, WebhookStaleRate: 1, WebhookRetryMax: 200 * time.Millisecond})
	srv := httptest.NewServer(psp)
	t.Cleanup(func() { srv.Close(); _ = psp.Close() })
	importMethods(t, h.dsn, "customer_id,customer_ref,payment_method_ref\r\n1001,cus_1,pm_card_visa\r\n1002,cus_2,pm_fakeDebit_success\r\n1003,cus_3,pm_card_chargeDeclined\r\n")
	// The secret Stripe signs with is the second one billing lists: the
	// endpoint's secret is being rolled.
	env := h.environ("PAYMENT_PROVIDER", "stripe", "PAYMENT_BASE_URL", srv.URL, "PAYMENT_API_KEY", "sk_test_e2e",
		"PAYMENT_WEBHOOK_SECRET", "whsec_old,whsec_new", "WEBHOOK_ADDR", webhookAddr, "PAYMENT_RESOLVE_AFTER", "1s")
	s := h.serve(env)

	var ids [5]string
	for o := int64(1); o <= 4; o++ {
		ev, value := event(t, o, 1999, "EUR")
		ids[o] = ev.ID.String()
		h.publish(int32(o%2), strconv.FormatInt(o, 10), value)
	}
	h.waitCaughtUp()
	wait.For(t, 30*time.Second, "every attempt settled and every webhook delivered", func() bool {
		return h.count(`SELECT count(*) FROM charge WHERE status IN ('pending', 'in_progress')`) == 0 && psp.Stats().PendingWebhooks == 0
	})
	want := map[int64]string{1: "succeeded", 2: "succeeded", 3: "declined", 4: "rejected"}
	for o, status := range want {
		if got := h.count(`SELECT count(*) FROM charge WHERE order_id = $1 AND status = $2`, o, status); got != 1 {
			t.Errorf("order %d: no %s attempt", o, status)
		}
	}
	if got := h.count(`SELECT count(*) FROM charge WHERE order_id = 2 AND deferred AND provider_charge_id LIKE 'pi_%'`); got != 1 {
		t.Errorf("the bank debit was not settled after its message, with the PaymentIntent's id")
	}
	parked := kafkatest.ReadAll(t, h.client, h.broker.DLQTopic)
	if len(parked) != 1 || !strings.HasPrefix(dlq.Header(parked[0].Headers, "x-dlq-reason"), "no-payment-method: customer 1004") {
		t.Fatalf("dead-letter topic %d messages; want order 4's, parked no-payment-method", len(parked))
	}

	st := psp.Stats().Stripe
	if st.Webhooks.ForgedAccepted != 0 || st.Webhooks.StaleAccepted != 0 || st.Webhooks.Forged == 0 || st.Webhooks.Stale == 0 {
		t.Errorf("webhooks %+v: every forged and stale copy must be refused", st.Webhooks)
	}
	if refused := s.metric(t, `billing_webhooks_total{result="refused"}`); refused != float64(st.Webhooks.Forged+st.Webhooks.Stale) {
		t.Errorf("billing refused %v notifications, the provider sent %d forged and %d stale", refused, st.Webhooks.Forged, st.Webhooks.Stale)
	}
	// Every notification Stripe saw acknowledged was counted once: as the
	// news that settled an attempt, or as no news (known already, repeated).
	taken := s.metric(t, `billing_webhooks_total{result="settled"}`) + s.metric(t, `billing_webhooks_total{result="no_news"}`)
	if taken != float64(st.Webhooks.Delivered+st.Webhooks.Repeated) {
		t.Errorf("billing took %v notifications, the provider saw %d delivered and %d repeated", taken, st.Webhooks.Delivered, st.Webhooks.Repeated)
	}
	if st.Requests != 3 {
		t.Errorf("Stripe saw %d charge requests, want 3 (none for the customer without a card)", st.Requests)
	}

	// The operator imports the missing card and replays the parked event.
	importMethods(t, h.dsn, "customer_id,customer_ref,payment_method_ref\n1004,cus_4,pm_card_visa\n")
	dlqReplay(t, env, "--code", "no-payment-method")
	wait.For(t, 30*time.Second, "order 4 charged after the replay", func() bool {
		return h.count(`SELECT count(*) FROM charge WHERE order_id = 4 AND status = 'succeeded'`) == 1
	})
	wait.For(t, 30*time.Second, "outcome events published", func() bool { return h.published() >= 5 })
	types := map[string][]string{}
	for _, m := range kafkatest.ReadAll(t, h.client, h.broker.OutcomeTopic) {
		var o struct{ EventType, CausationID, Reason string }
		if err := json.Unmarshal(m.Value, &o); err != nil {
			t.Fatal(err)
		}
		types[o.CausationID] = append(types[o.CausationID], o.EventType+" "+o.Reason)
	}
	wantTypes := map[string]string{
		ids[1]: "payment.succeeded.v1 ",
		ids[2]: "payment.succeeded.v1 ",
		ids[3]: "payment.declined.v1 ",
		ids[4]: "payment.failed.v1 no-payment-method,payment.succeeded.v1 ",
	}
	for id, want := range wantTypes {
		if got := strings.Join(types[id], ","); got != want {
			t.Errorf("outcome events of %s: %q, want %q", id, got, want)
		}
	}
	if psp.Stats().OrdersChargedTwice != 0 {
		t.Error("an order was charged twice at the provider")
	}
}

// One bad row aborts the whole import, naming its line, and writes nothing.
func TestPaymentMethodsImport_OneBadRowWritesNothing(t *testing.T) {
	db, dsn := dbtest.New(t)
	var stdout, stderr bytes.Buffer
	csv := "customer_id,customer_ref,payment_method_ref\n1,cus_1,pm_1\n2,cus_2,\"pm\t2\"\n"
	err := run(context.Background(), []string{"billing", "payment-methods", "import", "--reason", "a test imports cards"},
		map[string]string{"DATABASE_URL": dsn, "PAYMENT_PROVIDER": "stripe"}, strings.NewReader(csv), &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Fatalf("err = %v, want one naming line 3", err)
	}
	var n int
	if err := db.Get(&n, `SELECT count(*) FROM payment_method`); err != nil || n != 0 {
		t.Errorf("%d rows written (%v), want none", n, err)
	}
	err = run(context.Background(), []string{"billing", "payment-methods", "import", "--reason", "a test imports cards"},
		map[string]string{"DATABASE_URL": dsn}, strings.NewReader(csv), &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "PAYMENT_PROVIDER") {
		t.Errorf("import under the contract provider: %v, want an error naming PAYMENT_PROVIDER", err)
	}
}
