package fakepsp_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"testing"
	"time"

	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/testenv/wait"
)

// lookupKey is the contract's GET /v1/charges?idempotency_key=key.
func lookupKey(t *testing.T, ts *httptest.Server, key string) []fakepsp.Charge {
	t.Helper()
	r := call(t, ts, http.MethodGet, "/v1/charges?"+url.Values{"idempotency_key": {key}}.Encode(), "")
	wantStatus(t, r, http.StatusOK)
	if !bytes.HasPrefix(r.body, []byte(`{"data":[`)) {
		t.Errorf("lookup answered %s, want a data list", r.body)
	}
	return decode[struct {
		Data []fakepsp.Charge `json:"data"`
	}](t, r.body).Data
}

// waitIdle waits until the provider has no delivery pending.
func waitIdle(t *testing.T, psp *fakepsp.Server) {
	t.Helper()
	wait.For(t, 10*time.Second, "every webhook delivered", func() bool { return psp.Stats().PendingWebhooks == 0 })
}

// A processing payment is answered 202 (replayed under its key), decided
// after ProcessingDelay (declined when DeclineEvery divides the order),
// told by a webhook signed with the secret, and found by its key meanwhile
// and after.
func TestProcessing_DecidedLaterAndNotified(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		order       int64
		status      string
		declineCode string
		wantStats   fakepsp.ContractStats
	}{
		{"Succeeded", 3, "succeeded", "", fakepsp.ContractStats{Processing: 1, ProcessingSucceeded: 1}},
		{"Declined", 6, "declined", "generic_decline", fakepsp.ContractStats{Processing: 1, ProcessingDeclined: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rc := newReceiver(t, nil)
			psp, ts := start(t, fakepsp.Options{ProcessingEvery: 3, DeclineEvery: 2, ProcessingDelay: 300 * time.Millisecond,
				WebhookURL: rc.URL, WebhookSecret: webhookSecret})
			body := chargeBody(tt.order, 45, 1999, "EUR")

			first := charge(t, ts, "key-1", body)
			wantStatus(t, first, http.StatusAccepted)
			answer := decode[fakepsp.Charge](t, first.body)
			if !chargeID.MatchString(answer.ID) || answer.Status != "processing" {
				t.Fatalf("202 answer = %s, want an id and status processing", first.body)
			}
			if got := lookupKey(t, ts, "key-1"); len(got) != 1 || got[0].Status != "processing" || got[0].ID != answer.ID {
				t.Errorf("lookup while processing = %+v", got)
			}
			again := charge(t, ts, "key-1", body)
			wantStatus(t, again, http.StatusAccepted)
			if !bytes.Equal(again.body, first.body) || again.header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("repeat while processing = %s (replayed %q), want the 202 replayed", again.body, again.header.Get("Idempotent-Replayed"))
			}

			wait.For(t, 10*time.Second, "the verdict's webhook", func() bool { return len(rc.notices()) == 1 })
			got := rc.notices()[0]
			want := fmt.Sprintf(`{"id":%q,"idempotencyKey":"key-1","status":%q}`, answer.ID, tt.status)
			if tt.declineCode != "" {
				want = fmt.Sprintf(`{"id":%q,"idempotencyKey":"key-1","status":%q,"declineCode":%q}`, answer.ID, tt.status, tt.declineCode)
			}
			if string(got.body) != want {
				t.Errorf("webhook body = %s, want %s", got.body, want)
			}
			if !verifyContract(got, time.Minute, webhookSecret) {
				t.Errorf("webhook signature %q does not verify", got.header.Get("Signature"))
			}
			if verifyContract(got, time.Minute, "another secret") {
				t.Error("webhook signature verifies with another secret")
			}
			if ct := got.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("webhook Content-Type = %q", ct)
			}

			decided := lookupKey(t, ts, "key-1")
			if len(decided) != 1 || decided[0].Status != tt.status || decided[0].DeclineCode != tt.declineCode ||
				decided[0].OrderID != tt.order || decided[0].Amount != 1999 || decided[0].IdempotencyKey != "key-1" {
				t.Errorf("lookup after the verdict = %+v", decided)
			}
			// The key's stored answer stays the 202.
			if r := charge(t, ts, "key-1", body); r.status != http.StatusAccepted || !bytes.Equal(r.body, first.body) {
				t.Errorf("repeat after the verdict = %d %s, want the 202 replayed", r.status, r.body)
			}
			charges := psp.Charges()
			if tt.status == "succeeded" && (len(charges) != 1 || charges[0].ID != answer.ID || charges[0].Status != "succeeded") {
				t.Errorf("charges = %+v, want the succeeded payment", charges)
			}
			if tt.status == "declined" && len(charges) != 0 {
				t.Errorf("charges = %+v, want none", charges)
			}
			payments := psp.Payments()
			if len(payments) != 1 || payments[0].Status != tt.status || payments[0].Answer != http.StatusAccepted ||
				payments[0].EventID != "key-1" || payments[0].Decided.IsZero() || payments[0].Profile != "contract" {
				t.Errorf("payments = %+v", payments)
			}

			waitIdle(t, psp)
			tt.wantStats.Lookups = 2
			tt.wantStats.Webhooks = fakepsp.WebhookStats{Events: 1, Sent: 1, Delivered: 1}
			wantStats(t, psp, fakepsp.Stats{Requests: 3, DistinctKeys: 1, Replays: 2, Contract: tt.wantStats})
		})
	}
}

// The lookup by key tells each outcome as it stands, and nothing for a key
// the provider does not know.
func TestLookupByIdempotencyKey(t *testing.T) {
	t.Parallel()
	psp, ts := start(t, fakepsp.Options{DeclineEvery: 2, FailOrders: []int64{5}})
	wantStatus(t, charge(t, ts, "charged", chargeBody(1, 45, 1999, "EUR")), http.StatusOK)
	wantStatus(t, charge(t, ts, "declined", chargeBody(2, 46, 500, "JPY")), http.StatusPaymentRequired)
	wantStatus(t, charge(t, ts, "failed", chargeBody(5, 47, 100, "EUR")), http.StatusServiceUnavailable)

	tests := []struct {
		key  string
		want []fakepsp.Charge
	}{
		{"charged", []fakepsp.Charge{{IdempotencyKey: "charged", OrderID: 1, CustomerID: 45, Amount: 1999, Currency: "EUR", Status: "succeeded"}}},
		{"declined", []fakepsp.Charge{{IdempotencyKey: "declined", OrderID: 2, CustomerID: 46, Amount: 500, Currency: "JPY", Status: "declined", DeclineCode: "generic_decline"}}},
		{"failed", nil},  // a 503 stores nothing
		{"unknown", nil}, // never used
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			got := lookupKey(t, ts, tt.key)
			for i := range got {
				if !chargeID.MatchString(got[i].ID) || got[i].Created.IsZero() {
					t.Errorf("payment %+v lacks an id or a creation time", got[i])
				}
				got[i].ID, got[i].Created = "", time.Time{}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("lookup %q = %+v, want %+v", tt.key, got, tt.want)
			}
		})
	}
	for _, query := range []string{"idempotency_key=", "idempotency_key=a&idempotency_key=b", "idempotency_key=a&created_gte=2025-01-01T00:00:00Z"} {
		r := call(t, ts, http.MethodGet, "/v1/charges?"+query, "")
		wantStatus(t, r, http.StatusBadRequest)
		wantErrorType(t, r, "invalid_request_error")
	}
	if got := psp.Stats().Contract.Lookups; got != 7 {
		t.Errorf("%d lookups counted, want 7", got)
	}
}

// A key older than IdempotencyTTL is forgotten: the lookup no longer finds
// it, and the same request under it is new (and charges again).
func TestIdempotencyTTL_ForgetsKeys(t *testing.T) {
	t.Parallel()
	const ttl = 200 * time.Millisecond
	psp, ts := start(t, fakepsp.Options{IdempotencyTTL: ttl})
	first := charge(t, ts, "key-1", validBody)
	wantStatus(t, first, http.StatusOK)
	if r := charge(t, ts, "key-1", validBody); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("a repeat within the TTL was not replayed")
	}
	time.Sleep(ttl + 50*time.Millisecond)

	if got := lookupKey(t, ts, "key-1"); len(got) != 0 {
		t.Errorf("lookup of an expired key = %+v, want none", got)
	}
	again := charge(t, ts, "key-1", validBody)
	wantStatus(t, again, http.StatusOK)
	if again.header.Get("Idempotent-Replayed") != "" || bytes.Equal(again.body, first.body) {
		t.Errorf("request after the TTL = %s (replayed %q), want a new charge", again.body, again.header.Get("Idempotent-Replayed"))
	}
	wantStats(t, psp, fakepsp.Stats{Requests: 3, DistinctKeys: 2, ChargesCreated: 2, Replays: 1, OrdersChargedTwice: 1,
		Contract: fakepsp.ContractStats{KeysExpired: 1, Lookups: 1}})
}

// Without ProcessingEvery nothing is processing, whatever the other
// options: the contract's answers are what they always were.
func TestProcessing_OffByDefault(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	psp, ts := start(t, fakepsp.Options{DeclineEvery: 2, WebhookURL: rc.URL, WebhookSecret: webhookSecret, ProcessingDelay: time.Millisecond})
	wantStatus(t, charge(t, ts, "a", chargeBody(1, 45, 1999, "EUR")), http.StatusOK)
	wantStatus(t, charge(t, ts, "b", chargeBody(2, 45, 1999, "EUR")), http.StatusPaymentRequired)
	time.Sleep(50 * time.Millisecond)
	if n := len(rc.notices()); n != 0 {
		t.Errorf("%d webhooks for immediate outcomes, want none", n)
	}
	wantStats(t, psp, fakepsp.Stats{Requests: 2, DistinctKeys: 2, ChargesCreated: 1, Declines: 1})
}

// A processing answer may be lost like a charge's (ResetRate); the key
// then replays the 202 and the verdict comes all the same.
func TestProcessing_AnswerLost(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	psp, ts := start(t, fakepsp.Options{ProcessingEvery: 1, ResetRate: 1, WebhookURL: rc.URL, WebhookSecret: webhookSecret})
	transport := &http.Transport{DisableKeepAlives: true} // see TestResetAfterCharging
	t.Cleanup(transport.CloseIdleConnections)
	req, err := newChargeRequest(t.Context(), ts.URL, "key-1", validBody)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := do(&http.Client{Transport: transport}, req); err == nil {
		t.Fatal("the processing answer was not lost")
	}
	psp.SetOptions(fakepsp.Options{WebhookURL: rc.URL, WebhookSecret: webhookSecret})
	wantStatus(t, charge(t, ts, "key-1", validBody), http.StatusAccepted)
	wait.For(t, 10*time.Second, "the verdict", func() bool { return psp.Stats().Contract.ProcessingSucceeded == 1 })
	waitIdle(t, psp)
	if got := lookupKey(t, ts, "key-1"); len(got) != 1 || got[0].Status != "succeeded" {
		t.Errorf("lookup = %+v, want succeeded", got)
	}
	if p := psp.Payments(); len(p) != 1 || !p[0].AnswerLost {
		t.Errorf("payments = %+v, want one whose answer was lost", p)
	}
	wantStats(t, psp, fakepsp.Stats{Requests: 2, DistinctKeys: 1, Replays: 1, Resets: 1, Contract: fakepsp.ContractStats{
		Processing: 1, ProcessingSucceeded: 1, Lookups: 1, Webhooks: fakepsp.WebhookStats{Events: 1, Sent: 1, Delivered: 1}}})
}
