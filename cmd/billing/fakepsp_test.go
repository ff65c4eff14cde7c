//go:build dev

package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v85/webhook"

	"example.com/billing/internal/dev/fakepsp"
)

var pspURLLine = regexp.MustCompile(`fakepsp listening on (http://127\.0\.0\.1:\d+)`)

// postIntent creates a Stripe PaymentIntent paid by pm and returns the
// status, 0 when the connection failed.
func postIntent(t *testing.T, base, pm, key string) int {
	t.Helper()
	form := url.Values{"amount": {"1999"}, "currency": {"eur"}, "customer": {"cus_7"}, "payment_method": {pm},
		"confirm": {"true"}, "off_session": {"true"}, "metadata[event_id]": {key}, "metadata[order_id]": {"1"}}
	req, err := http.NewRequest(http.MethodPost, base+"/v1/payment_intents", strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// postAdyenPayment makes an Adyen payment with stored payment method pm,
// under the Checkout API's versioned root, and returns the status and the
// resultCode, 0 when the connection failed.
func postAdyenPayment(t *testing.T, base, apiKey, pm, key string) (int, string) {
	t.Helper()
	body := `{"merchantAccount":"BillingECOM","amount":{"value":1999,"currency":"EUR"},"reference":"` + key + `","merchantOrderReference":"1",` +
		`"shopperReference":"shopper-7","paymentMethod":{"type":"scheme","storedPaymentMethodId":"` + pm + `"},` +
		`"shopperInteraction":"ContAuth","recurringProcessingModel":"UnscheduledCardOnFile"}`
	req, err := http.NewRequest(http.MethodPost, base+"/v71/payments", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-API-Key", apiKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	var a struct {
		ResultCode string `json:"resultCode"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&a)
	return resp.StatusCode, a.ResultCode
}

func pspStats(t *testing.T, base string) fakepsp.Stats {
	t.Helper()
	code, body := get(strings.TrimPrefix(base, "http://"), "/_stats")
	if code != http.StatusOK {
		t.Fatalf("GET /_stats: %d %s", code, body)
	}
	var st fakepsp.Stats
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func TestFakepsp_ServesWithTheFaultsOfItsFlags(t *testing.T) {
	tests := []struct {
		name  string
		flags []string
		env   map[string]string
		check func(t *testing.T, base string)
	}{
		{"DeclineEveryAnswers402", []string{"--decline-every", "7"}, nil, func(t *testing.T, base string) {
			if got := postCharge(t, base, "", 14, "k-14"); got != http.StatusPaymentRequired {
				t.Errorf("order 14 with --decline-every 7: %d, want 402", got)
			}
			if got := postCharge(t, base, "", 15, "k-15"); got != http.StatusOK {
				t.Errorf("order 15 with --decline-every 7: %d, want 200", got)
			}
		}},
		{"FailRate1Answers503", []string{"--fail-rate", "1"}, nil, func(t *testing.T, base string) {
			if got := postCharge(t, base, "", 1, "k-1"); got != http.StatusServiceUnavailable {
				t.Errorf("--fail-rate 1: %d, want 503", got)
			}
			if st := pspStats(t, base); st.InjectedFailures != 1 || st.ChargesCreated != 0 {
				t.Errorf("stats %+v: want one injected failure, no charge", st)
			}
		}},
		{"LatencyDelaysTheAnswer", []string{"--latency", "150ms"}, nil, func(t *testing.T, base string) {
			start := time.Now()
			if got := postCharge(t, base, "", 1, "k-1"); got != http.StatusOK {
				t.Errorf("status %d, want 200", got)
			}
			if took := time.Since(start); took < 150*time.Millisecond {
				t.Errorf("answered in %s with --latency 150ms", took)
			}
		}},
		{"ResetRate1ChargesAndDropsTheAnswer", []string{"--reset-rate", "1", "--seed", "3"}, nil, func(t *testing.T, base string) {
			// Go's transport may resend the request on a reset reused
			// connection and get the stored answer replayed; either way the
			// provider charged once and reset the first answer.
			postCharge(t, base, "", 1, "k-1")
			if st := pspStats(t, base); st.Resets != 1 || st.ChargesCreated != 1 {
				t.Errorf("stats %+v: want one charge whose answer was reset", st)
			}
		}},
		{"APIKeyFromTheEnvironment", nil, map[string]string{"PAYMENT_API_KEY": "sk_test_env"}, func(t *testing.T, base string) {
			if got := postCharge(t, base, "", 1, "k-1"); got != http.StatusUnauthorized {
				t.Errorf("without the key: %d, want 401", got)
			}
			if got := postCharge(t, base, "sk_test_env", 1, "k-1"); got != http.StatusOK {
				t.Errorf("with the key: %d, want 200", got)
			}
		}},
		{"ProcessingEveryAnswers202", []string{"--processing-every", "2", "--processing-delay", "10ms"}, nil, func(t *testing.T, base string) {
			if got := postCharge(t, base, "", 4, "k-4"); got != http.StatusAccepted {
				t.Errorf("order 4 with --processing-every 2: %d, want 202", got)
			}
			if got := postCharge(t, base, "", 5, "k-5"); got != http.StatusOK {
				t.Errorf("order 5 with --processing-every 2: %d, want 200", got)
			}
		}},
		{"StripeProfile", []string{"--profile", "stripe"}, nil, func(t *testing.T, base string) {
			if got := postIntent(t, base, "pm_card_visa", "k-1"); got != http.StatusOK {
				t.Errorf("pm_card_visa: %d, want 200", got)
			}
			if got := postIntent(t, base, "pm_card_chargeDeclined", "k-2"); got != http.StatusPaymentRequired {
				t.Errorf("pm_card_chargeDeclined: %d, want 402", got)
			}
			if got := postCharge(t, base, "", 1, "k-3"); got != http.StatusNotFound {
				t.Errorf("POST /v1/charges in the stripe profile: %d, want 404", got)
			}
			if st := pspStats(t, base); st.Stripe.Succeeded != 1 || st.Stripe.Declined != 1 {
				t.Errorf("stripe stats %+v: want one succeeded, one declined", st.Stripe)
			}
		}},
		{"AdyenProfile", []string{"--profile", "adyen"}, map[string]string{"PAYMENT_API_KEY": "AQE_env", "ADYEN_MERCHANT_ACCOUNT": "BillingECOM"}, func(t *testing.T, base string) {
			if got, rc := postAdyenPayment(t, base, "AQE_env", "8415718415172200", "k-1"); got != http.StatusOK || rc != "Authorised" {
				t.Errorf("a stored card: %d %s, want 200 Authorised", got, rc)
			}
			if got, rc := postAdyenPayment(t, base, "AQE_env", "stored_refused", "k-2"); got != http.StatusOK || rc != "Refused" {
				t.Errorf("stored_refused: %d %s, want 200 Refused", got, rc)
			}
			if got, _ := postAdyenPayment(t, base, "wrong", "8415718415172200", "k-3"); got != http.StatusUnauthorized {
				t.Errorf("another X-API-Key: %d, want 401", got)
			}
			if got := postIntent(t, base, "pm_card_visa", "k-4"); got != http.StatusNotFound {
				t.Errorf("POST /v1/payment_intents in the adyen profile: %d, want 404", got)
			}
			if st := pspStats(t, base); st.Adyen.Authorised != 1 || st.Adyen.Refused != 1 || st.Adyen.Unauthorized != 1 {
				t.Errorf("adyen stats %+v: want one authorised, one refused, one unauthorized", st.Adyen)
			}
		}},
		{"Stored500Rate1", []string{"--profile", "stripe", "--stored-500-rate", "1"}, nil, func(t *testing.T, base string) {
			if got := postIntent(t, base, "pm_card_visa", "k-1"); got != http.StatusInternalServerError {
				t.Errorf("--stored-500-rate 1: %d, want 500", got)
			}
			if st := pspStats(t, base); st.Stripe.Stored500s != 1 || st.Stripe.Succeeded != 1 {
				t.Errorf("stripe stats %+v: want a stored 500 whose PaymentIntent succeeded", st.Stripe)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := startCommand(t, tt.env, append([]string{"fakepsp", "--addr", "127.0.0.1:0"}, tt.flags...)...)
			base := c.waitOutput(t, pspURLLine, 10*time.Second)
			tt.check(t, base)
			if err := c.stop(t); err != nil {
				t.Fatalf("fakepsp exited with %v", err)
			}
			if code, _ := get(strings.TrimPrefix(base, "http://"), "/healthz"); code != 0 {
				t.Errorf("fakepsp still answers (%d) after it stopped", code)
			}
		})
	}
}

func TestFakepsp_RejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--fail-rate", "2"},
		{"--reset-rate", "-0.5"},
		{"--latency", "-1s"},
		{"--decline-every", "-3"},
		{"--api-key", "sk"},        // never a flag: it would show in ps
		{"--webhook-secret", "wh"}, // likewise
		{"--addr", "not an address"},
		{"positional"},
		{"--profile", "paypal"},
		{"--webhook-batch-wait", "-1s"},
		{"--processing-every", "-1"},
		{"--stored-500-rate", "2"},
		{"--webhook-forge-rate", "-1"},
		{"--webhook-delay-min", "2s", "--webhook-delay-max", "1s"},
		{"--search-lag", "-1s"},
		{"--webhook-url", "ftp://127.0.0.1:1/hooks"},
		{"--webhook-url", "http://127.0.0.1:1/hooks"}, // no PAYMENT_WEBHOOK_SECRET to sign with
	} {
		err := run(t.Context(), append([]string{"billing", "fakepsp"}, args...), nil, nil, &syncBuffer{}, &syncBuffer{})
		if err == nil {
			t.Errorf("fakepsp %v succeeded", args)
		}
	}
	// Adyen's HMAC keys are hex; the error does not show the secret.
	var out syncBuffer
	err := run(t.Context(), []string{"billing", "fakepsp", "--addr", "127.0.0.1:0", "--profile", "adyen"},
		map[string]string{"PAYMENT_WEBHOOK_SECRET": "whsec_s3cret"}, nil, &out, &out)
	if err == nil || strings.Contains(err.Error(), "whsec_s3cret") || !strings.Contains(err.Error(), "PAYMENT_WEBHOOK_SECRET") {
		t.Errorf("--profile adyen with a secret that is not hex: %v", err)
	}
	var help syncBuffer
	if err := run(t.Context(), []string{"billing", "fakepsp", "-h"}, nil, nil, &help, &help); err != nil {
		t.Fatalf("fakepsp -h: %v", err)
	}
	for _, want := range []string{"PAYMENT_API_KEY", "PAYMENT_WEBHOOK_SECRET", "-latency", "-fail-rate", "-reset-rate", "-decline-every", "-seed", "-addr",
		"-profile", "-processing-every", "-processing-delay", "-idempotency-ttl", "-stripe-version", "-stored-500-rate",
		"-stored-500-drop-rate", "-search-lag", "-webhook-url", "-webhook-delay-min", "-webhook-delay-max", "-webhook-retry-max",
		"-webhook-repeat-rate", "-webhook-forge-rate", "-webhook-stale-rate", "-webhook-drop-rate", "-pending-drop-rate", "-webhook-batch-wait", "ADYEN_MERCHANT_ACCOUNT"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("help lacks %q", want)
		}
	}
}

// With --webhook-url, verdicts are posted there signed with the secret
// from the environment, and the command stops sending when it stops.
func TestFakepsp_SendsSignedWebhooks(t *testing.T) {
	const secret = "whsec_cmd_test"
	type notice struct{ body, signature string }
	got := make(chan notice, 10)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- notice{string(body), r.Header.Get("Stripe-Signature")}
	}))
	defer receiver.Close()

	c := startCommand(t, map[string]string{"PAYMENT_WEBHOOK_SECRET": secret},
		"fakepsp", "--addr", "127.0.0.1:0", "--profile", "stripe", "--webhook-url", receiver.URL)
	base := c.waitOutput(t, pspURLLine, 10*time.Second)
	if got := postIntent(t, base, "pm_card_visa", "k-1"); got != http.StatusOK {
		t.Fatalf("pm_card_visa: %d, want 200", got)
	}
	select {
	case n := <-got:
		ev, err := webhook.ConstructEvent([]byte(n.body), n.signature, secret)
		if err != nil || ev.Type != "payment_intent.succeeded" {
			t.Errorf("event %s (%v): want a payment_intent.succeeded that verifies", ev.Type, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no webhook within 10s")
	}
	if err := c.stop(t); err != nil {
		t.Fatalf("fakepsp exited with %v", err)
	}
}
