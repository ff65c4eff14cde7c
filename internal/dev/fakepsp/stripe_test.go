package fakepsp_test

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v85"
	"github.com/stripe/stripe-go/v85/webhook"

	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/testenv/wait"
)

// startStripe serves a fake provider speaking Stripe until the test ends.
func startStripe(t *testing.T, opts fakepsp.Options) (*fakepsp.Server, *httptest.Server) {
	t.Helper()
	opts.Profile = fakepsp.ProfileStripe
	return start(t, opts)
}

// intentForm is the form billing sends to charge order with payment
// method pm.
func intentForm(order int64, pm string) url.Values {
	return url.Values{
		"amount":             {"1999"},
		"currency":           {"eur"},
		"customer":           {"cus_45"},
		"payment_method":     {pm},
		"confirm":            {"true"},
		"off_session":        {"true"},
		"metadata[event_id]": {fmt.Sprint("evt-", order)},
		"metadata[order_id]": {fmt.Sprint(order)},
	}
}

// postIntent posts body, form-encoded, to POST /v1/payment_intents under
// key (none when empty), with extra headers as name, value pairs.
func postIntent(t *testing.T, ts *httptest.Server, key, body string, header ...string) reply {
	t.Helper()
	r, err := do(ts.Client(), newIntentRequest(t, ts.URL, key, body, header...))
	if err != nil {
		t.Fatalf("POST /v1/payment_intents: %v", err)
	}
	return r
}

func newIntentRequest(t *testing.T, base, key, body string, header ...string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/v1/payment_intents", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return req
}

// stripeErr decodes Stripe's error answer.
func stripeErr(t *testing.T, r reply) stripe.Error {
	t.Helper()
	return decode[struct {
		Error stripe.Error `json:"error"`
	}](t, r.body).Error
}

func wantStripeError(t *testing.T, r reply, status int, errType stripe.ErrorType, code stripe.ErrorCode) stripe.Error {
	t.Helper()
	wantStatus(t, r, status)
	e := stripeErr(t, r)
	if e.Type != errType || e.Code != code || e.Msg == "" {
		t.Errorf("error = type %q code %q message %q, want type %q code %q and a message", e.Type, e.Code, e.Msg, errType, code)
	}
	return e
}

// events decodes the Stripe events a receiver got, verified with
// stripe-go as billing verifies them; it fails the test on one that does
// not verify.
func events(t *testing.T, rc *receiver) []stripe.Event {
	t.Helper()
	var out []stripe.Event
	for _, n := range rc.notices() {
		ev, err := webhook.ConstructEvent(n.body, n.header.Get("Stripe-Signature"), webhookSecret)
		if err != nil {
			t.Fatalf("event %s does not verify: %v", n.body, err)
		}
		out = append(out, ev)
	}
	return out
}

func eventIntent(t *testing.T, ev stripe.Event) stripe.PaymentIntent {
	t.Helper()
	return decode[stripe.PaymentIntent](t, ev.Data.Raw)
}

func retrieve(t *testing.T, ts *httptest.Server, id string) stripe.PaymentIntent {
	t.Helper()
	r := call(t, ts, http.MethodGet, "/v1/payment_intents/"+id, "")
	wantStatus(t, r, http.StatusOK)
	return decode[stripe.PaymentIntent](t, r.body)
}

// The payment method chooses the outcome: the answer, the PaymentIntent's
// status then and later, and the events sent.
func TestStripe_OutcomeByPaymentMethod(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pm          string
		status      int
		created     stripe.PaymentIntentStatus // in the answer
		final       stripe.PaymentIntentStatus // once decided
		code        stripe.ErrorCode
		declineCode stripe.DeclineCode
		events      []stripe.EventType
		wantStats   fakepsp.StripeStats
	}{
		{pm: "pm_card_visa", status: 200, created: "succeeded", final: "succeeded",
			events: []stripe.EventType{"payment_intent.succeeded"}, wantStats: fakepsp.StripeStats{Succeeded: 1}},
		{pm: "pm_card_mastercard", status: 200, created: "succeeded", final: "succeeded",
			events: []stripe.EventType{"payment_intent.succeeded"}, wantStats: fakepsp.StripeStats{Succeeded: 1}},
		{pm: "pm_card_chargeDeclined", status: 402, created: "requires_payment_method", final: "requires_payment_method",
			code: "card_declined", declineCode: "generic_decline",
			events: []stripe.EventType{"payment_intent.payment_failed"}, wantStats: fakepsp.StripeStats{Declined: 1}},
		{pm: "pm_card_chargeDeclinedInsufficientFunds", status: 402, created: "requires_payment_method", final: "requires_payment_method",
			code: "card_declined", declineCode: "insufficient_funds",
			events: []stripe.EventType{"payment_intent.payment_failed"}, wantStats: fakepsp.StripeStats{Declined: 1}},
		{pm: "pm_card_authenticationRequired", status: 402, created: "requires_payment_method", final: "requires_payment_method",
			code: "authentication_required", declineCode: "authentication_required",
			events: []stripe.EventType{"payment_intent.payment_failed"}, wantStats: fakepsp.StripeStats{Declined: 1}},
		{pm: "pm_fakeDebit_success", status: 200, created: "processing", final: "succeeded",
			events:    []stripe.EventType{"payment_intent.processing", "payment_intent.succeeded"},
			wantStats: fakepsp.StripeStats{Processing: 1, ProcessingSucceeded: 1}},
		{pm: "pm_fakeDebit_failure", status: 200, created: "processing", final: "requires_payment_method",
			code:      "insufficient_funds",
			events:    []stripe.EventType{"payment_intent.processing", "payment_intent.payment_failed"},
			wantStats: fakepsp.StripeStats{Processing: 1, ProcessingFailed: 1}},
		{pm: "pm_fakeDebit_neverSettles", status: 200, created: "processing", final: "processing",
			events: []stripe.EventType{"payment_intent.processing"}, wantStats: fakepsp.StripeStats{Processing: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.pm, func(t *testing.T) {
			t.Parallel()
			rc := newReceiver(t, nil)
			psp, ts := startStripe(t, fakepsp.Options{ProcessingDelay: 100 * time.Millisecond,
				WebhookURL: rc.URL, WebhookSecret: webhookSecret})
			r := postIntent(t, ts, "evt-7", intentForm(7, tt.pm).Encode())
			wantStatus(t, r, tt.status)

			var pi stripe.PaymentIntent
			if tt.status == http.StatusOK {
				pi = decode[stripe.PaymentIntent](t, r.body)
			} else {
				e := wantStripeError(t, r, tt.status, "card_error", tt.code)
				if e.DeclineCode != tt.declineCode || e.PaymentIntent == nil || e.ChargeID == "" || e.DocURL == "" {
					t.Fatalf("decline = %+v, want decline_code %q, the PaymentIntent, the charge and a doc_url", e, tt.declineCode)
				}
				pi = *e.PaymentIntent
			}
			if !strings.HasPrefix(pi.ID, "pi_") || pi.Object != "payment_intent" || pi.Status != tt.created ||
				pi.Amount != 1999 || pi.Currency != "eur" || pi.Customer.ID != "cus_45" || pi.PaymentMethod.ID != tt.pm ||
				pi.Metadata["event_id"] != "evt-7" || pi.Metadata["order_id"] != "7" || pi.Livemode || pi.LatestCharge == nil {
				t.Errorf("PaymentIntent in the answer = %+v", pi)
			}
			var received int64
			if tt.created == "succeeded" {
				received = 1999
			}
			if pi.AmountReceived != received {
				t.Errorf("amount_received = %d, want %d", pi.AmountReceived, received)
			}

			wait.For(t, 10*time.Second, "the events", func() bool { return len(rc.notices()) == len(tt.events) })
			waitIdle(t, psp)
			var types []stripe.EventType
			for _, ev := range events(t, rc) {
				types = append(types, ev.Type)
				if got := eventIntent(t, ev); got.ID != pi.ID || ev.Object != "event" || !strings.HasPrefix(ev.ID, "evt_") ||
					ev.APIVersion != stripe.APIVersion {
					t.Errorf("event %s %s: PaymentIntent %s, api_version %s", ev.ID, ev.Type, got.ID, ev.APIVersion)
				}
			}
			slices.Sort(types)
			slices.Sort(tt.events)
			if !slices.Equal(types, tt.events) {
				t.Errorf("events %v, want %v", types, tt.events)
			}

			final := retrieve(t, ts, pi.ID)
			if final.Status != tt.final {
				t.Errorf("status after the verdict = %s, want %s", final.Status, tt.final)
			}
			if tt.final == "requires_payment_method" && (final.LastPaymentError == nil || final.LastPaymentError.Code != tt.code ||
				final.LastPaymentError.DeclineCode != tt.declineCode || final.LastPaymentError.PaymentIntent != nil ||
				final.LastPaymentError.Type != "card_error" || final.LastPaymentError.ChargeID != final.LatestCharge.ID) {
				t.Errorf("last_payment_error = %+v, want a card_error with code %s, decline_code %q and the charge, without a PaymentIntent",
					final.LastPaymentError, tt.code, tt.declineCode)
			}
			payments := psp.Payments()
			status := map[stripe.PaymentIntentStatus]string{"succeeded": "succeeded", "processing": "processing", "requires_payment_method": "declined"}[tt.final]
			if len(payments) != 1 || payments[0].Status != status || payments[0].ProviderStatus != string(tt.final) ||
				payments[0].EventID != "evt-7" || payments[0].OrderID != 7 || payments[0].IdempotencyKey != "evt-7" ||
				payments[0].Answer != tt.status || payments[0].ID != pi.ID {
				t.Errorf("payments = %+v", payments)
			}

			got := psp.Stats().Stripe
			n := int64(len(tt.events))
			tt.wantStats.Requests = 1
			tt.wantStats.Lookups = fakepsp.StripeLookups{Retrieve: 1}
			tt.wantStats.Webhooks = fakepsp.WebhookStats{Events: n, Sent: n, Delivered: n}
			if got != tt.wantStats {
				t.Errorf("stripe stats:\n got  %+v\n want %+v", got, tt.wantStats)
			}
		})
	}
}

// Requests Stripe refuses before executing them are answered 400 or 404
// and store nothing: the key is still free afterwards.
func TestStripe_RefusedBeforeExecution(t *testing.T) {
	t.Parallel()
	valid := intentForm(7, "pm_card_visa")
	with := func(name, value string) string {
		f := url.Values{}
		for k, v := range valid {
			f[k] = slices.Clone(v)
		}
		if value == "" {
			f.Del(name)
		} else {
			f.Set(name, value)
		}
		return f.Encode()
	}
	tests := []struct {
		name   string
		key    string
		body   string
		header []string
		status int
		code   stripe.ErrorCode
		param  string
	}{
		{name: "JSONBody", body: `{"amount":1999,"currency":"eur"}`, header: []string{"Content-Type", "application/json"}, status: 400},
		{name: "NoContentType", body: valid.Encode(), header: []string{"Content-Type", ""}, status: 400},
		{name: "AmountMissing", body: with("amount", ""), status: 400, code: "parameter_missing", param: "amount"},
		{name: "CurrencyMissing", body: with("currency", ""), status: 400, code: "parameter_missing", param: "currency"},
		{name: "CustomerMissing", body: with("customer", ""), status: 400, code: "parameter_missing", param: "customer"},
		{name: "PaymentMethodMissing", body: with("payment_method", ""), status: 400, code: "parameter_missing", param: "payment_method"},
		{name: "OffSessionMissing", body: with("off_session", ""), status: 400, code: "parameter_missing", param: "off_session"},
		{name: "NotConfirmed", body: with("confirm", "false"), status: 400, param: "confirm"},
		{name: "UnknownParameter", body: with("capture_method", "manual"), status: 400, code: "parameter_unknown", param: "capture_method"},
		{name: "AmountInMajorUnits", body: with("amount", "19.99"), status: 400, code: "parameter_invalid_integer", param: "amount"},
		{name: "AmountTooSmall", body: with("amount", "49"), status: 400, code: "amount_too_small", param: "amount"},
		{name: "AmountTooLarge", body: with("amount", "100000000"), status: 400, code: "amount_too_large", param: "amount"},
		{name: "CurrencyUpperCase", body: with("currency", "EUR"), status: 400, param: "currency"},
		{name: "MetadataKeyTooLong", body: with("metadata["+strings.Repeat("k", 41)+"]", "v"), status: 400},
		{name: "MetadataNotClosed", body: with("metadata[event_id", "v"), status: 400, code: "parameter_unknown"},
		{name: "GivenTwice", body: valid.Encode() + "&amount=1999", status: 400, param: "amount"},
		{name: "KeyTooLong", key: strings.Repeat("k", 256), body: valid.Encode(), status: 400},
		{name: "CustomerMissingAtStripe", body: with("customer", "cus_missing_1"), status: 404, code: "resource_missing", param: "customer"},
		{name: "CustomerNotAnID", body: with("customer", "45"), status: 404, code: "resource_missing", param: "customer"},
		{name: "PaymentMethodMissingAtStripe", body: with("payment_method", "pm_missing_card"), status: 404, code: "resource_missing", param: "payment_method"},
		{name: "PaymentMethodNotAnID", body: with("payment_method", "card_visa"), status: 404, code: "resource_missing", param: "payment_method"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rc := newReceiver(t, nil)
			psp, ts := startStripe(t, fakepsp.Options{WebhookURL: rc.URL, WebhookSecret: webhookSecret})
			key := cmp.Or(tt.key, "k")
			r := postIntent(t, ts, key, tt.body, tt.header...)
			e := wantStripeError(t, r, tt.status, "invalid_request_error", tt.code)
			if tt.param != "" && e.Param != tt.param {
				t.Errorf("param = %q, want %q", e.Param, tt.param)
			}
			want := fakepsp.StripeStats{Requests: 1, BadRequests: 1}
			if tt.status == http.StatusNotFound {
				want = fakepsp.StripeStats{Requests: 1, NotFound: 1}
			}
			if got := psp.Stats().Stripe; got != want {
				t.Errorf("stripe stats = %+v, want %+v", got, want)
			}
			if n := len(psp.Payments()); n != 0 {
				t.Errorf("%d payments after a refused request, want 0", n)
			}

			// Nothing was stored: the key is still free.
			again := postIntent(t, ts, "k", valid.Encode())
			wantStatus(t, again, http.StatusOK)
			if again.header.Get("Idempotent-Replayed") != "" {
				t.Error("the valid request after a refused one was a replay")
			}
			waitIdle(t, psp)
			if n := len(rc.notices()); n != 1 {
				t.Errorf("%d events, want 1 (for the valid request only)", n)
			}
		})
	}
}

// noEndpoint is what the webhook counters say of n events generated while
// no endpoint is configured.
func noEndpoint(n int64) fakepsp.WebhookStats {
	return fakepsp.WebhookStats{Events: n, NoEndpoint: n}
}

// The same key with the same parameters, in any order, replays the stored
// answer byte for byte, 200 or 402, with Idempotent-Replayed and the
// original request's id; no second PaymentIntent is created.
func TestStripe_IdempotentReplay(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		pm     string
		status int
	}{{"pm_card_visa", 200}, {"pm_card_chargeDeclined", 402}} {
		t.Run(tt.pm, func(t *testing.T) {
			t.Parallel()
			psp, ts := startStripe(t, fakepsp.Options{})
			form := intentForm(7, tt.pm)
			first := postIntent(t, ts, "evt-7", form.Encode())
			wantStatus(t, first, tt.status)
			if first.header.Get("Idempotent-Replayed") != "" || !strings.HasPrefix(first.header.Get("Request-Id"), "req_") {
				t.Errorf("first answer headers %v", first.header)
			}
			// The same parameters, in another order.
			reordered := "off_session=true&confirm=true&" + strings.ReplaceAll(form.Encode(), "&confirm=true", "")
			reordered = strings.ReplaceAll(reordered, "&off_session=true", "")
			for _, body := range []string{form.Encode(), reordered} {
				r := postIntent(t, ts, "evt-7", body)
				wantStatus(t, r, tt.status)
				if !bytes.Equal(r.body, first.body) {
					t.Errorf("replay:\n %s\nwant\n %s", r.body, first.body)
				}
				if r.header.Get("Idempotent-Replayed") != "true" || r.header.Get("Original-Request") != first.header.Get("Request-Id") ||
					r.header.Get("Request-Id") == first.header.Get("Request-Id") {
					t.Errorf("replay headers %v; first Request-Id %s", r.header, first.header.Get("Request-Id"))
				}
			}
			if n := len(psp.Payments()); n != 1 {
				t.Errorf("%d PaymentIntents, want 1", n)
			}
			if got := psp.Stats().Stripe.Replays; got != 2 {
				t.Errorf("%d replays counted, want 2", got)
			}
		})
	}
}

// The same key with other parameters is an idempotency_error, and the key
// still replays its first answer.
func TestStripe_IdempotencyError(t *testing.T) {
	t.Parallel()
	for _, change := range []struct{ name, value string }{
		{"amount", "2000"}, {"currency", "usd"}, {"customer", "cus_46"}, {"payment_method", "pm_card_mastercard"},
		{"metadata[order_id]", "8"}, {"metadata[extra]", "x"},
	} {
		t.Run(change.name, func(t *testing.T) {
			t.Parallel()
			psp, ts := startStripe(t, fakepsp.Options{})
			form := intentForm(7, "pm_card_visa")
			first := postIntent(t, ts, "evt-7", form.Encode())
			wantStatus(t, first, http.StatusOK)
			form.Set(change.name, change.value)
			r := postIntent(t, ts, "evt-7", form.Encode())
			wantStripeError(t, r, http.StatusBadRequest, "idempotency_error", "")
			if !strings.Contains(stripeErr(t, r).Msg, "evt-7") {
				t.Errorf("message %q does not name the key", stripeErr(t, r).Msg)
			}
			again := postIntent(t, ts, "evt-7", intentForm(7, "pm_card_visa").Encode())
			if !bytes.Equal(again.body, first.body) {
				t.Errorf("replay after the idempotency_error = %s, want %s", again.body, first.body)
			}
			want := fakepsp.StripeStats{Requests: 3, Succeeded: 1, IdempotencyErrors: 1, Replays: 1, Webhooks: noEndpoint(1)}
			if got := psp.Stats().Stripe; got != want {
				t.Errorf("stripe stats = %+v, want %+v", got, want)
			}
		})
	}
}

// Requests under a key in flight get 409 idempotency_key_in_use, which
// Stripe says to retry.
func TestStripe_KeyInUse(t *testing.T) {
	t.Parallel()
	psp, ts := startStripe(t, fakepsp.Options{Latency: time.Second})
	const n = 8
	body := intentForm(7, "pm_card_visa").Encode()
	startLine := make(chan struct{})
	replies := make(chan reply, n)
	var wg sync.WaitGroup
	for range n {
		req := newIntentRequest(t, ts.URL, "evt-7", body)
		wg.Go(func() {
			<-startLine
			r, err := do(ts.Client(), req)
			if err != nil {
				t.Error(err)
				return
			}
			replies <- r
		})
	}
	close(startLine)
	wg.Wait()
	close(replies)
	ok := 0
	for r := range replies {
		if r.status == http.StatusOK {
			ok++
			continue
		}
		wantStripeError(t, r, http.StatusConflict, "invalid_request_error", "idempotency_key_in_use")
		if r.header.Get("Stripe-Should-Retry") != "true" {
			t.Errorf("409 with Stripe-Should-Retry %q, want true", r.header.Get("Stripe-Should-Retry"))
		}
	}
	want := fakepsp.StripeStats{Requests: n, Succeeded: 1, Conflicts: n - 1, Webhooks: noEndpoint(1)}
	if got := psp.Stats().Stripe; ok != 1 || got != want {
		t.Errorf("%d answered 200; stripe stats %+v, want 1 and %+v", ok, got, want)
	}
}

// A stored 500 is replayed under its key, while the PaymentIntent was
// created with its payment method's outcome: lookups find it, and its
// events are sent unless Stored500DropRate drops them.
func TestStripe_Stored500(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		pm       string
		dropRate float64
		final    stripe.PaymentIntentStatus
		events   int64
	}{
		{"Succeeded", "pm_card_visa", 0, "succeeded", 1},
		{"SucceededEventDropped", "pm_card_visa", 1, "succeeded", 0},
		{"Declined", "pm_card_chargeDeclined", 0, "requires_payment_method", 1},
		{"Processing", "pm_fakeDebit_success", 0, "succeeded", 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rc := newReceiver(t, nil)
			psp, ts := startStripe(t, fakepsp.Options{Stored500Rate: 1, Stored500DropRate: tt.dropRate, SearchLag: time.Nanosecond,
				WebhookURL: rc.URL, WebhookSecret: webhookSecret})
			body := intentForm(7, tt.pm).Encode()
			first := postIntent(t, ts, "evt-7", body)
			wantStripeError(t, first, http.StatusInternalServerError, "api_error", "")
			if first.header.Get("Stripe-Should-Retry") != "false" {
				t.Errorf("stored 500 with Stripe-Should-Retry %q, want false", first.header.Get("Stripe-Should-Retry"))
			}
			// The answer is stored: a retry gets it again, whatever the
			// options now.
			psp.SetOptions(fakepsp.Options{Profile: fakepsp.ProfileStripe, SearchLag: time.Nanosecond, WebhookURL: rc.URL, WebhookSecret: webhookSecret})
			again := postIntent(t, ts, "evt-7", body)
			if again.status != http.StatusInternalServerError || !bytes.Equal(again.body, first.body) ||
				again.header.Get("Idempotent-Replayed") != "true" || again.header.Get("Stripe-Should-Retry") != "false" {
				t.Errorf("retry = %d %s %v, want the stored 500 replayed", again.status, again.body, again.header)
			}

			found := decode[stripe.PaymentIntentSearchResult](t, call(t, ts, http.MethodGet,
				"/v1/payment_intents/search?"+url.Values{"query": {"metadata['event_id']:'evt-7'"}}.Encode(), "").body)
			if len(found.Data) != 1 {
				t.Fatalf("search found %d PaymentIntents, want 1", len(found.Data))
			}
			if tt.events == 2 {
				wait.For(t, 10*time.Second, "the verdict", func() bool { return psp.Stats().Stripe.ProcessingSucceeded == 1 })
			}
			waitIdle(t, psp)
			if pi := retrieve(t, ts, found.Data[0].ID); pi.Status != tt.final {
				t.Errorf("status %s, want %s", pi.Status, tt.final)
			}
			if got := int64(len(events(t, rc))); got != tt.events {
				t.Errorf("%d events, want %d", got, tt.events)
			}
			st := psp.Stats().Stripe
			if st.Stored500s != 1 || st.Replays != 1 || st.Webhooks.Dropped != int64(tt.dropRate) {
				t.Errorf("stripe stats = %+v, want a stored 500 replayed once and %v events dropped", st, tt.dropRate)
			}
			if p := psp.Payments(); len(p) != 1 || p[0].Answer != http.StatusInternalServerError {
				t.Errorf("payments = %+v, want one answered 500", p)
			}
		})
	}
}

// Faults before the idempotency layer (provider down, injected failures,
// the rate limit) and the API key and version checks store nothing.
func TestStripe_RefusedBeforeIdempotency(t *testing.T) {
	t.Parallel()
	const apiKey = "sk_test_123"
	tests := []struct {
		name        string
		opts        fakepsp.Options
		down        bool
		header      []string
		requests    int // sent before the one checked
		status      int
		errType     stripe.ErrorType
		code        stripe.ErrorCode
		shouldRetry string
		count       func(fakepsp.StripeStats) int64
	}{
		{name: "Down", down: true, status: 503, errType: "api_error", shouldRetry: "true",
			count: func(s fakepsp.StripeStats) int64 { return s.DownRejections }},
		{name: "FailRate", opts: fakepsp.Options{FailRate: 1}, status: 503, errType: "api_error", shouldRetry: "true",
			count: func(s fakepsp.StripeStats) int64 { return s.InjectedFailures }},
		{name: "FailOrders", opts: fakepsp.Options{FailOrders: []int64{7}}, status: 503, errType: "api_error", shouldRetry: "true",
			count: func(s fakepsp.StripeStats) int64 { return s.InjectedFailures }},
		{name: "RateLimit", opts: fakepsp.Options{RateLimit: 2}, requests: 2, status: 429, errType: "invalid_request_error",
			code: "rate_limit", shouldRetry: "true", count: func(s fakepsp.StripeStats) int64 { return s.RateLimited }},
		{name: "NoAPIKey", opts: fakepsp.Options{APIKey: apiKey}, status: 401, errType: "invalid_request_error",
			count: func(s fakepsp.StripeStats) int64 { return s.Unauthorized }},
		{name: "WrongAPIKey", opts: fakepsp.Options{APIKey: apiKey}, header: []string{"Authorization", "Bearer sk_test_999"},
			status: 401, errType: "invalid_request_error", count: func(s fakepsp.StripeStats) int64 { return s.Unauthorized }},
		{name: "NoVersion", opts: fakepsp.Options{StripeVersion: "2025-08-27.basil"}, status: 400, errType: "invalid_request_error",
			count: func(s fakepsp.StripeStats) int64 { return s.BadRequests }},
		{name: "OtherVersion", opts: fakepsp.Options{StripeVersion: "2025-08-27.basil"}, header: []string{"Stripe-Version", "2024-06-20"},
			status: 400, errType: "invalid_request_error", count: func(s fakepsp.StripeStats) int64 { return s.BadRequests }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			psp, ts := startStripe(t, tt.opts)
			psp.SetDown(tt.down)
			for i := range tt.requests {
				wantStatus(t, postIntent(t, ts, fmt.Sprint("other-", i), intentForm(int64(100+i), "pm_card_visa").Encode(), tt.header...), 200)
			}
			r := postIntent(t, ts, "evt-7", intentForm(7, "pm_card_visa").Encode(), tt.header...)
			wantStripeError(t, r, tt.status, tt.errType, tt.code)
			if got := r.header.Get("Stripe-Should-Retry"); got != tt.shouldRetry {
				t.Errorf("Stripe-Should-Retry = %q, want %q", got, tt.shouldRetry)
			}
			if got := r.header.Get("Retry-After"); got != "" {
				t.Errorf("Retry-After = %q; Stripe sends none", got)
			}
			if got := tt.count(psp.Stats().Stripe); got != 1 {
				t.Errorf("counted %d, want 1", got)
			}

			// Nothing was stored: with the fault gone, the key is new.
			psp.SetDown(false)
			psp.SetOptions(fakepsp.Options{Profile: fakepsp.ProfileStripe})
			again := postIntent(t, ts, "evt-7", intentForm(7, "pm_card_visa").Encode())
			wantStatus(t, again, http.StatusOK)
			if again.header.Get("Idempotent-Replayed") != "" {
				t.Error("the request after the fault was a replay")
			}
		})
	}
}

// The API key and the pinned version let requests through; the answer
// tells the version.
func TestStripe_APIKeyAndVersion(t *testing.T) {
	t.Parallel()
	const version = "2025-08-27.basil"
	_, ts := startStripe(t, fakepsp.Options{APIKey: "sk_test_123", StripeVersion: version})
	auth := []string{"Authorization", "Bearer sk_test_123", "Stripe-Version", version}
	r := postIntent(t, ts, "evt-7", intentForm(7, "pm_card_visa").Encode(), auth...)
	wantStatus(t, r, http.StatusOK)
	if got := r.header.Get("Stripe-Version"); got != version {
		t.Errorf("Stripe-Version = %q, want %q", got, version)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, ts.URL+"/v1/payment_intents", nil)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := do(ts.Client(), req); err != nil || r.status != http.StatusUnauthorized {
		t.Errorf("a list without the key: %d, %v; want 401", r.status, err)
	}
	req.Header.Set("Authorization", "Bearer sk_test_123")
	req.Header.Set("Stripe-Version", version)
	if r, err := do(ts.Client(), req); err != nil || r.status != http.StatusOK {
		t.Errorf("a list with the key: %d, %v; want 200", r.status, err)
	}
}

// ResetRate creates the PaymentIntent and loses the answer; the key then
// replays it.
func TestStripe_AnswerLost(t *testing.T) {
	t.Parallel()
	psp, ts := startStripe(t, fakepsp.Options{ResetRate: 1})
	transport := &http.Transport{DisableKeepAlives: true} // see TestResetAfterCharging
	t.Cleanup(transport.CloseIdleConnections)
	body := intentForm(7, "pm_card_visa").Encode()
	_, err := do(&http.Client{Transport: transport}, newIntentRequest(t, ts.URL, "evt-7", body))
	if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("err = %v, want a connection reset or EOF", err)
	}
	r := postIntent(t, ts, "evt-7", body)
	wantStatus(t, r, http.StatusOK)
	if r.header.Get("Idempotent-Replayed") != "true" {
		t.Error("the retry was not a replay")
	}
	if p := psp.Payments(); len(p) != 1 || !p[0].AnswerLost || p[0].Status != "succeeded" {
		t.Errorf("payments = %+v", p)
	}
	want := fakepsp.StripeStats{Requests: 2, Succeeded: 1, Resets: 1, Replays: 1, Webhooks: noEndpoint(1)}
	if got := psp.Stats().Stripe; got != want {
		t.Errorf("stripe stats = %+v, want %+v", got, want)
	}
}

// A key older than IdempotencyTTL is pruned: the same request creates a
// second PaymentIntent, and the order counts as charged twice.
func TestStripe_KeyExpires(t *testing.T) {
	t.Parallel()
	const ttl = 200 * time.Millisecond
	psp, ts := startStripe(t, fakepsp.Options{IdempotencyTTL: ttl})
	body := intentForm(7, "pm_card_visa").Encode()
	first := postIntent(t, ts, "evt-7", body)
	wantStatus(t, first, http.StatusOK)
	time.Sleep(ttl + 50*time.Millisecond)
	again := postIntent(t, ts, "evt-7", body)
	wantStatus(t, again, http.StatusOK)
	if again.header.Get("Idempotent-Replayed") != "" || bytes.Equal(again.body, first.body) {
		t.Error("the request after the TTL was a replay")
	}
	st := psp.Stats()
	if st.OrdersChargedTwice != 1 || st.Stripe.KeysExpired != 1 || st.Stripe.Succeeded != 2 {
		t.Errorf("stats = %+v, want order 7 charged twice after an expired key", st)
	}
}

// createIntents creates one PaymentIntent per customer given, orders 1, 2,
// ..., and returns their ids, oldest first.
func createIntents(t *testing.T, ts *httptest.Server, customers ...string) []string {
	t.Helper()
	var ids []string
	for i, c := range customers {
		form := intentForm(int64(i+1), "pm_card_visa")
		form.Set("customer", c)
		form.Set("metadata[batch]", "b")
		r := postIntent(t, ts, fmt.Sprint("evt-", i+1), form.Encode())
		wantStatus(t, r, http.StatusOK)
		ids = append(ids, decode[stripe.PaymentIntent](t, r.body).ID)
	}
	return ids
}

func listIDs(t *testing.T, ts *httptest.Server, query string) ([]string, bool) {
	t.Helper()
	r := call(t, ts, http.MethodGet, "/v1/payment_intents?"+query, "")
	wantStatus(t, r, http.StatusOK)
	list := decode[stripe.PaymentIntentList](t, r.body)
	if !bytes.Contains(r.body, []byte(`"object":"list"`)) || list.URL != "/v1/payment_intents" {
		t.Errorf("list = %s, want Stripe's list object", r.body)
	}
	var ids []string
	for _, pi := range list.Data {
		ids = append(ids, pi.ID)
	}
	return ids, list.HasMore
}

// The list is newest first, filtered by customer and creation time (unix
// seconds), and paginated with limit and starting_after.
func TestStripe_List(t *testing.T) {
	t.Parallel()
	psp, ts := startStripe(t, fakepsp.Options{})
	ids := createIntents(t, ts, "cus_a", "cus_b", "cus_a", "cus_b", "cus_a")
	newest := slices.Clone(ids)
	slices.Reverse(newest)
	now := time.Now().Unix()

	tests := []struct {
		name    string
		query   url.Values
		want    []string
		hasMore bool
	}{
		{"All", nil, newest, false},
		{"FirstPage", url.Values{"limit": {"2"}}, newest[:2], true},
		{"SecondPage", url.Values{"limit": {"2"}, "starting_after": {newest[1]}}, newest[2:4], true},
		{"LastPage", url.Values{"limit": {"2"}, "starting_after": {newest[3]}}, newest[4:], false},
		{"Customer", url.Values{"customer": {"cus_b"}}, []string{ids[3], ids[1]}, false},
		{"CustomerPage", url.Values{"customer": {"cus_a"}, "limit": {"1"}, "starting_after": {ids[4]}}, []string{ids[2]}, true},
		{"CreatedWindow", url.Values{"created[gte]": {fmt.Sprint(now - 60)}, "created[lt]": {fmt.Sprint(now + 60)}}, newest, false},
		{"CreatedAfter", url.Values{"created[gt]": {fmt.Sprint(now + 1)}}, nil, false},
		{"CreatedBefore", url.Values{"created[lte]": {fmt.Sprint(now - 60)}}, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, hasMore := listIDs(t, ts, tt.query.Encode())
			if !slices.Equal(got, tt.want) || hasMore != tt.hasMore {
				t.Errorf("list = %v (has_more %v), want %v (has_more %v)", got, hasMore, tt.want, tt.hasMore)
			}
		})
	}
	for _, query := range []string{"limit=0", "limit=101", "limit=x", "created[gte]=2025-01-01T00:00:00Z",
		"created_gte=1", "ending_before=" + ids[0], "customer=a&customer=b"} {
		r := call(t, ts, http.MethodGet, "/v1/payment_intents?"+query, "")
		wantStripeError(t, r, http.StatusBadRequest, "invalid_request_error", stripeErr(t, r).Code)
	}
	r := call(t, ts, http.MethodGet, "/v1/payment_intents?starting_after=pi_unknown", "")
	wantStripeError(t, r, http.StatusNotFound, "invalid_request_error", "resource_missing")

	lookups := psp.Stats().Stripe.Lookups
	if want := (fakepsp.StripeLookups{List: int64(len(tests)) + 8, Rejected: 8}); lookups != want {
		t.Errorf("lookups = %+v, want %+v", lookups, want)
	}
}

// Retrieve finds a PaymentIntent by id, or answers 404 resource_missing.
func TestStripe_Retrieve(t *testing.T) {
	t.Parallel()
	psp, ts := startStripe(t, fakepsp.Options{})
	ids := createIntents(t, ts, "cus_a")
	pi := retrieve(t, ts, ids[0])
	if pi.ID != ids[0] || pi.Status != "succeeded" || pi.AmountReceived != 1999 || pi.Customer.ID != "cus_a" {
		t.Errorf("retrieved %+v", pi)
	}
	r := call(t, ts, http.MethodGet, "/v1/payment_intents/pi_unknown", "")
	wantStripeError(t, r, http.StatusNotFound, "invalid_request_error", "resource_missing")
	r = call(t, ts, http.MethodGet, "/v1/payment_intents/"+ids[0]+"?expand[]=latest_charge", "")
	wantStripeError(t, r, http.StatusBadRequest, "invalid_request_error", "parameter_unknown")
	if got, want := psp.Stats().Stripe.Lookups, (fakepsp.StripeLookups{Retrieve: 3, NotFound: 1, Rejected: 1}); got != want {
		t.Errorf("lookups = %+v, want %+v", got, want)
	}
}

func search(t *testing.T, ts *httptest.Server, query url.Values) stripe.PaymentIntentSearchResult {
	t.Helper()
	r := call(t, ts, http.MethodGet, "/v1/payment_intents/search?"+query.Encode(), "")
	wantStatus(t, r, http.StatusOK)
	if !bytes.Contains(r.body, []byte(`"object":"search_result"`)) || !bytes.Contains(r.body, []byte(`"next_page":`)) {
		t.Errorf("search answered %s, want Stripe's search_result", r.body)
	}
	return decode[stripe.PaymentIntentSearchResult](t, r.body)
}

// Search finds PaymentIntents by metadata only SearchLag after their
// creation, newest first, a page at a time.
func TestStripe_Search(t *testing.T) {
	t.Parallel()
	const lag = 300 * time.Millisecond
	psp, ts := startStripe(t, fakepsp.Options{SearchLag: lag})
	ids := createIntents(t, ts, "cus_a", "cus_a", "cus_b")
	byEvent := url.Values{"query": {"metadata['event_id']:'evt-2'"}}
	if got := search(t, ts, byEvent); len(got.Data) != 0 || got.HasMore {
		t.Errorf("search right after the creation found %d, want none yet", len(got.Data))
	}
	wait.For(t, 10*time.Second, "the search index", func() bool { return len(search(t, ts, byEvent).Data) == 1 })
	if got := search(t, ts, byEvent).Data[0].ID; got != ids[1] {
		t.Errorf("found %s, want %s", got, ids[1])
	}

	for _, query := range []string{`metadata["event_id"]:"evt-3"`, `metadata['event_id']:'evt-3' AND metadata['order_id']:'3'`} {
		if got := search(t, ts, url.Values{"query": {query}}); len(got.Data) != 1 || got.Data[0].ID != ids[2] {
			t.Errorf("%s found %+v, want %s", query, got.Data, ids[2])
		}
	}
	if got := search(t, ts, url.Values{"query": {"metadata['event_id']:'evt-3' AND metadata['order_id']:'4'"}}); len(got.Data) != 0 {
		t.Errorf("clauses that no PaymentIntent matches found %d", len(got.Data))
	}

	batch := url.Values{"query": {"metadata['batch']:'b'"}, "limit": {"2"}}
	first := search(t, ts, batch)
	if len(first.Data) != 2 || first.Data[0].ID != ids[2] || first.Data[1].ID != ids[1] || !first.HasMore || first.NextPage == nil {
		t.Fatalf("first page = %+v, want the two newest and a next page", first)
	}
	batch.Set("page", *first.NextPage)
	second := search(t, ts, batch)
	if len(second.Data) != 1 || second.Data[0].ID != ids[0] || second.HasMore || second.NextPage != nil {
		t.Errorf("second page = %+v, want the oldest and no next page", second)
	}

	for _, query := range []string{"", "status:'succeeded'", "metadata['event_id']:evt-1", "metadata['event_id']:'evt-1", "metadata[event_id]:'evt-1'"} {
		r := call(t, ts, http.MethodGet, "/v1/payment_intents/search?"+url.Values{"query": {query}}.Encode(), "")
		wantStripeError(t, r, http.StatusBadRequest, "invalid_request_error", "")
	}
	r := call(t, ts, http.MethodGet, "/v1/payment_intents/search", "")
	wantStripeError(t, r, http.StatusBadRequest, "invalid_request_error", "parameter_missing")
	if got := psp.Stats().Stripe.Lookups; got.Search < 10 || got.Rejected != 6 {
		t.Errorf("lookups = %+v, want the searches counted and 6 rejected", got)
	}
}

// The routes of the profile not served answer 404, in the served
// profile's manner; the profile may change at run time, and /_payments
// lists what both created.
func TestProfiles_SwitchAndRoutes(t *testing.T) {
	t.Parallel()
	psp, ts := start(t, fakepsp.Options{})
	wantStatus(t, postIntent(t, ts, "evt-1", intentForm(1, "pm_card_visa").Encode()), http.StatusNotFound)
	wantStatus(t, call(t, ts, http.MethodGet, "/v1/payment_intents/pi_x", ""), http.StatusNotFound)
	wantStatus(t, charge(t, ts, "evt-2", chargeBody(2, 45, 1999, "EUR")), http.StatusOK)

	wantStatus(t, call(t, ts, http.MethodPut, "/_faults", `{"profile":"stripe"}`), http.StatusOK)
	r := charge(t, ts, "evt-3", chargeBody(3, 45, 1999, "EUR"))
	wantStripeError(t, r, http.StatusNotFound, "invalid_request_error", "")
	wantStatus(t, call(t, ts, http.MethodGet, "/v1/charges", ""), http.StatusNotFound)
	wantStatus(t, postIntent(t, ts, "evt-4", intentForm(4, "pm_card_chargeDeclined").Encode()), http.StatusPaymentRequired)
	wantStatus(t, call(t, ts, http.MethodPut, "/_faults", `{"profile":"paypal"}`), http.StatusBadRequest)

	r = call(t, ts, http.MethodGet, "/_payments", "")
	wantStatus(t, r, http.StatusOK)
	got := decode[struct {
		Data []fakepsp.Payment `json:"data"`
	}](t, r.body).Data
	if !slices.EqualFunc(got, psp.Payments(), func(a, b fakepsp.Payment) bool {
		return a.ID == b.ID && a.Created.Equal(b.Created) && a.Status == b.Status
	}) {
		t.Errorf("GET /_payments = %+v, want %+v", got, psp.Payments())
	}
	if len(got) != 2 || got[0].Profile != "contract" || got[0].EventID != "evt-2" || got[0].Customer != "45" || got[0].Status != "succeeded" ||
		got[1].Profile != "stripe" || got[1].EventID != "evt-4" || got[1].Status != "declined" || got[1].DeclineCode != "generic_decline" ||
		got[1].ProviderStatus != "requires_payment_method" || got[1].Customer != "cus_45" || got[1].Currency != "eur" {
		t.Errorf("payments = %+v", got)
	}
}

// OrdersChargedTwice counts Stripe's succeeded PaymentIntents by
// metadata[order_id], whatever their keys; a decline or a PaymentIntent
// without an order does not count.
func TestStripe_OrdersChargedTwice(t *testing.T) {
	t.Parallel()
	psp, ts := startStripe(t, fakepsp.Options{ProcessingDelay: time.Millisecond})
	for i, pm := range []string{"pm_card_visa", "pm_card_chargeDeclined", "pm_fakeDebit_success", "pm_card_visa"} {
		form := intentForm(7, pm)
		form.Set("metadata[event_id]", fmt.Sprint("evt-", i))
		postIntent(t, ts, fmt.Sprint("evt-", i), form.Encode())
	}
	noOrder := intentForm(8, "pm_card_visa")
	noOrder.Del("metadata[order_id]")
	postIntent(t, ts, "a", noOrder.Encode())
	postIntent(t, ts, "b", noOrder.Encode()+"&metadata[x]=1")
	wait.For(t, 10*time.Second, "the debit's verdict", func() bool { return psp.Stats().Stripe.ProcessingSucceeded == 1 })
	if got := psp.Stats().OrdersChargedTwice; got != 1 {
		t.Errorf("OrdersChargedTwice = %d, want 1 (order 7, three times)", got)
	}
}

// The stats JSON carries the per-profile counters and the API versions
// seen.
func TestStripe_StatsRoute(t *testing.T) {
	t.Parallel()
	psp, ts := startStripe(t, fakepsp.Options{})
	postIntent(t, ts, "evt-1", intentForm(1, "pm_card_visa").Encode(), "Stripe-Version", "2025-08-27.basil")
	postIntent(t, ts, "evt-2", intentForm(2, "pm_card_visa").Encode())
	r := call(t, ts, http.MethodGet, "/_stats", "")
	wantStatus(t, r, http.StatusOK)
	got := decode[struct {
		fakepsp.Stats
		StripeVersions map[string]int64 `json:"stripeVersions"`
	}](t, r.body)
	if got.Stats != psp.Stats() || got.Stripe.Succeeded != 2 {
		t.Errorf("GET /_stats = %+v, want %+v", got.Stats, psp.Stats())
	}
	if want := map[string]int64{"2025-08-27.basil": 1, "": 1}; !maps.Equal(got.StripeVersions, want) {
		t.Errorf("stripeVersions = %v, want %v", got.StripeVersions, want)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(r.body, &raw); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"contract", "stripe", "pendingWebhooks", "clients"} {
		if _, ok := raw[key]; !ok {
			t.Errorf("GET /_stats lacks %q: %s", key, r.body)
		}
	}
}

// The Stripe faults and the webhook faults are drawn from Seed: two
// servers with the same options answer the same sequence of requests the
// same way and drop the same events.
func TestStripe_SeedReplaysFaults(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	opts := fakepsp.Options{FailRate: 0.2, Stored500Rate: 0.3, WebhookDropRate: 0.5, Seed: 42,
		WebhookURL: rc.URL, WebhookSecret: webhookSecret}
	type outcome struct {
		status  int
		dropped int64
	}
	outcomes := func(t *testing.T) []outcome {
		t.Helper()
		psp, ts := startStripe(t, opts)
		var out []outcome
		for i := range 64 {
			r := postIntent(t, ts, fmt.Sprint("evt-", i), intentForm(int64(i+1), "pm_card_visa").Encode())
			out = append(out, outcome{r.status, psp.Stats().Stripe.Webhooks.Dropped})
		}
		return out
	}
	first, second := outcomes(t), outcomes(t)
	if !slices.Equal(first, second) {
		t.Errorf("same seed, different faults:\n %v\n %v", first, second)
	}
	statuses := map[int]bool{}
	for _, o := range first {
		statuses[o.status] = true
	}
	if !statuses[200] || !statuses[500] || !statuses[503] || first[len(first)-1].dropped == 0 {
		t.Errorf("outcomes %v: want 200s, stored 500s, 503s and dropped events", first)
	}
}

// Forged events fail stripe-go's verification (half of them claim a
// failure for a PaymentIntent that succeeded); stale ones fail it for
// their age only.
func TestStripe_ForgedAndStaleEvents(t *testing.T) {
	t.Parallel()
	const n = 20
	rc := newReceiver(t, nil)
	psp, ts := startStripe(t, fakepsp.Options{WebhookForgeRate: 1, WebhookStaleRate: 1, Seed: 3,
		WebhookURL: rc.URL, WebhookSecret: webhookSecret})
	for i := range n {
		wantStatus(t, postIntent(t, ts, fmt.Sprint("evt-", i), intentForm(int64(i+1), "pm_card_visa").Encode()), http.StatusOK)
	}
	waitIdle(t, psp)
	var genuine, stale, forged, flipped int
	for _, got := range rc.notices() {
		payload, header := got.body, got.header.Get("Stripe-Signature")
		_, err := webhook.ConstructEvent(payload, header, webhookSecret)
		switch {
		case err == nil:
			genuine++
		case errors.Is(err, webhook.ErrTooOld):
			if _, err := webhook.ConstructEventIgnoringTolerance(payload, header, webhookSecret); err != nil {
				t.Errorf("stale event does not verify without tolerance: %v", err)
			}
			stale++
		case errors.Is(err, webhook.ErrNoValidSignature):
			forged++
			var ev stripe.Event
			if err := json.Unmarshal(payload, &ev); err != nil {
				t.Fatalf("forged event %s: %v", payload, err)
			}
			if ev.Type == "payment_intent.payment_failed" {
				flipped++
			}
		default:
			t.Errorf("event fails to verify with %v", err)
		}
	}
	if genuine != n || stale != n || forged != n || flipped == 0 || flipped == n {
		t.Errorf("%d genuine, %d stale, %d forged (%d claiming a failure), want %d each and some failures", genuine, stale, forged, flipped, n)
	}
	want := fakepsp.WebhookStats{Events: n, Sent: n, Delivered: n, Forged: n, ForgedAccepted: n, Stale: n, StaleAccepted: n}
	if got := psp.Stats().Stripe.Webhooks; got != want {
		t.Errorf("webhook stats = %+v, want %+v", got, want)
	}
}
