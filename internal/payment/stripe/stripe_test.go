package stripe_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"example.com/billing/internal/metrics"
	"example.com/billing/internal/payment"
	"example.com/billing/internal/payment/stripe"
)

const (
	apiKey  = "sk_test_S3cretKey42"
	eventID = "01907a4e-8d2c-7b3a-9f1e-2c4d6e8fa0b1"
)

var charge = payment.Request{
	IdempotencyKey: eventID, OrderID: 123, CustomerID: 45, Amount: 1999, Currency: "EUR",
	CustomerRef: "cus_123", PaymentMethodRef: "pm_123",
}

// newClient returns a client of Stripe's API at base, with metrics in a
// registry of its own.
func newClient(t *testing.T, base string) (*payment.Client, *metrics.Metrics) {
	t.Helper()
	return newClientKey(t, base, apiKey)
}

// newClientKey is newClient with another key.
func newClientKey(t *testing.T, base, key string) (*payment.Client, *metrics.Metrics) {
	t.Helper()
	m := metrics.New(prometheus.NewRegistry())
	c := payment.New(stripe.New(base, key), payment.Config{Timeout: 5 * time.Second}, m)
	t.Cleanup(c.Close)
	return c, m
}

// answer returns a server that answers every request with status, headers
// and body.
func answer(t *testing.T, status int, body string, headers ...string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		for i := 0; i+1 < len(headers); i += 2 {
			w.Header().Set(headers[i], headers[i+1])
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestCharge_SendsTheSameFormEveryTry(t *testing.T) {
	type sent struct {
		method, path string
		header       http.Header
		body         string
	}
	var (
		mu  sync.Mutex
		got []sent
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, sent{r.Method, r.URL.Path, r.Header.Clone(), string(b)})
		mu.Unlock()
		_, _ = io.WriteString(w, `{"id":"pi_1","object":"payment_intent","status":"succeeded"}`)
	}))
	t.Cleanup(srv.Close)
	// A base with a trailing slash, as an operator may write it.
	c, _ := newClient(t, srv.URL+"/")
	for range 2 {
		if _, err := c.Charge(context.Background(), charge); err != nil {
			t.Fatal(err)
		}
	}

	const wantBody = "amount=1999&confirm=true&currency=eur&customer=cus_123" +
		"&metadata%5Bcustomer_id%5D=45&metadata%5Bevent_id%5D=" + eventID + "&metadata%5Border_id%5D=123" +
		"&off_session=true&payment_method=pm_123"
	if len(got) != 2 {
		t.Fatalf("%d requests, want 2", len(got))
	}
	for i, s := range got {
		if s.method != http.MethodPost || s.path != "/v1/payment_intents" {
			t.Errorf("try %d: %s %s, want POST /v1/payment_intents", i, s.method, s.path)
		}
		if s.body != wantBody {
			t.Errorf("try %d: body\n%s\nwant\n%s", i, s.body, wantBody)
		}
		for name, want := range map[string]string{
			"Authorization":   "Bearer " + apiKey,
			"Stripe-Version":  stripe.APIVersion,
			"Idempotency-Key": eventID,
			"Content-Type":    "application/x-www-form-urlencoded",
		} {
			if v := s.header.Get(name); v != want {
				t.Errorf("try %d: %s = %q, want %q", i, name, v, want)
			}
		}
	}
}

// piAnswer is a PaymentIntent as Stripe answers a charge with it.
func piAnswer(status, extra string) string {
	return `{"id":"pi_1","object":"payment_intent","amount":1999,"currency":"eur","status":"` + status + `"` + extra + `}`
}

const (
	insufficientFunds = `,"last_payment_error":{"type":"card_error","code":"card_declined","decline_code":"insufficient_funds","message":"Your card has insufficient funds."}`
	cardError402      = `{"error":{"type":"card_error","code":"card_declined","decline_code":"insufficient_funds","message":"Your card has insufficient funds.","payment_intent":{"id":"pi_9","object":"payment_intent","status":"requires_payment_method"}}}`
	authRequired402   = `{"error":{"type":"card_error","code":"authentication_required","message":"This payment requires authentication.","payment_intent":{"id":"pi_8","status":"requires_payment_method"}}}`
	idempotencyError  = `{"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters they were first used with."}}`
	amountTooSmall    = `{"error":{"type":"invalid_request_error","code":"amount_too_small","param":"amount","message":"Amount must be at least 0.50 eur"}}`
	noSuchCustomer    = `{"error":{"type":"invalid_request_error","code":"resource_missing","param":"customer","message":"No such customer: 'cus_123'"}}`
	unrecognizedURL   = `{"error":{"type":"invalid_request_error","message":"Unrecognized request URL (POST: /v1/v1/payment_intents)."}}`
	keyInUse          = `{"error":{"type":"invalid_request_error","code":"idempotency_key_in_use","message":"There is currently another in-progress request using this Idempotent Key."}}`
	rateLimit         = `{"error":{"type":"invalid_request_error","code":"rate_limit","message":"Too many requests hit the API too quickly."}}`
	apiError500       = `{"error":{"type":"api_error","message":"Something went wrong on Stripe's end.","payment_intent":{"id":"pi_7","status":"requires_payment_method"}}}`
)

func TestCharge_Classification(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		body    string
		headers []string
		want    payment.Outcome // compared without Detail
		// transient, when set: the *TransientError's result label.
		transient string
		after     time.Duration
		detail    string // a part Detail (or the error) must hold
	}{
		{name: "Succeeded", status: 200, body: piAnswer("succeeded", ""),
			want: payment.Outcome{Kind: payment.Succeeded, Ref: "pi_1"}},
		{name: "SucceededReplayed", status: 200, body: piAnswer("succeeded", ""), headers: []string{"Idempotent-Replayed", "true"},
			want: payment.Outcome{Kind: payment.Succeeded, Ref: "pi_1", Replayed: true}},
		{name: "Processing", status: 200, body: piAnswer("processing", ""),
			want: payment.Outcome{Kind: payment.InProgress, Ref: "pi_1"}},
		{name: "RequiresPaymentMethodDeclined", status: 200, body: piAnswer("requires_payment_method", insufficientFunds),
			want: payment.Outcome{Kind: payment.Declined, Ref: "pi_1", Code: "insufficient_funds"}, detail: "insufficient funds"},
		{name: "RequiresPaymentMethodCodeOnly", status: 200,
			body: piAnswer("requires_payment_method", `,"last_payment_error":{"type":"card_error","code":"authentication_required"}`),
			want: payment.Outcome{Kind: payment.Declined, Ref: "pi_1", Code: "authentication_required"}},
		{name: "RequiresPaymentMethodUnconfirmed", status: 200, body: piAnswer("requires_payment_method", ""),
			want: payment.Outcome{Kind: payment.InProgress, Ref: "pi_1"}},
		{name: "RequiresAction", status: 200, body: piAnswer("requires_action", ""),
			want: payment.Outcome{Kind: payment.Declined, Ref: "pi_1", Code: "authentication_required"}},
		{name: "Canceled", status: 200, body: piAnswer("canceled", `,"cancellation_reason":"automatic"`),
			want: payment.Outcome{Kind: payment.Declined, Ref: "pi_1"}, detail: "canceled (automatic)"},
		{name: "CanceledAfterFailure", status: 200, body: piAnswer("canceled", insufficientFunds),
			want: payment.Outcome{Kind: payment.Declined, Ref: "pi_1", Code: "insufficient_funds"}},
		{name: "RequiresCapture", status: 200, body: piAnswer("requires_capture", ""),
			want: payment.Outcome{Kind: payment.InProgress, Ref: "pi_1"}, detail: "requires_capture"},
		{name: "RequiresConfirmation", status: 200, body: piAnswer("requires_confirmation", ""),
			want: payment.Outcome{Kind: payment.InProgress, Ref: "pi_1"}},
		{name: "StatusUnknownToBilling", status: 200, body: piAnswer("requires_reauthorization", ""),
			want: payment.Outcome{Kind: payment.InProgress, Ref: "pi_1"}},
		{name: "UnreadableSuccess", status: 200, body: `<html>ok</html>`, transient: "bad_response"},
		{name: "SuccessWithoutID", status: 200, body: `{"object":"payment_intent","status":"succeeded"}`, transient: "bad_response"},

		{name: "CardDeclined", status: 402, body: cardError402,
			want: payment.Outcome{Kind: payment.Declined, Ref: "pi_9", Code: "insufficient_funds"}, detail: "402 card_error/card_declined/insufficient_funds"},
		{name: "AuthenticationRequired", status: 402, body: authRequired402,
			want: payment.Outcome{Kind: payment.Declined, Ref: "pi_8", Code: "authentication_required"}},
		{name: "DeclineReplayed", status: 402, body: cardError402, headers: []string{"Idempotent-Replayed", "true"},
			want: payment.Outcome{Kind: payment.Declined, Ref: "pi_9", Code: "insufficient_funds", Replayed: true}},

		{name: "IdempotencyError400", status: 400, body: idempotencyError,
			want: payment.Outcome{Kind: payment.Rejected, Code: "idempotency_error"}, detail: "same parameters"},
		{name: "IdempotencyError409", status: 409, body: idempotencyError,
			want: payment.Outcome{Kind: payment.Rejected, Code: "idempotency_error"}},
		{name: "InvalidRequest", status: 400, body: amountTooSmall,
			want: payment.Outcome{Kind: payment.Rejected, Code: "amount_too_small"}, detail: "400 invalid_request_error/amount_too_small: Amount must be at least 0.50 eur"},
		{name: "InvalidRequestKeyMasked", status: 400,
			body: `{"error":{"type":"invalid_request_error","message":"Invalid API Key provided: ` + apiKey + `"}}`,
			want: payment.Outcome{Kind: payment.Rejected, Code: "invalid_request_error"}, detail: "xxxxx"},
		{name: "ResourceMissing", status: 404, body: noSuchCustomer,
			want: payment.Outcome{Kind: payment.Rejected, Code: "resource_missing"}, detail: "No such customer"},
		{name: "WrongBaseURL", status: 404, body: unrecognizedURL, transient: "client_error"},
		{name: "NotFoundFromAProxy", status: 404, body: `<html>404</html>`, transient: "client_error"},
		{name: "BadRequestFromAProxy", status: 400, body: `<html>400 Bad Request</html>`, transient: "client_error"},
		{name: "PaymentRequiredFromAProxy", status: 402, body: `payment required`, transient: "client_error"},
		{name: "Redirect", status: 302, body: ``, headers: []string{"Location", "https://example.com/"}, transient: "client_error"},

		{name: "KeyInUse", status: 409, body: keyInUse, transient: "conflict"},
		{name: "RateLimited", status: 429, body: rateLimit, transient: "rate_limited"},
		{name: "RateLimitedRetryAfter", status: 429, body: rateLimit, headers: []string{"Retry-After", "3"}, transient: "rate_limited", after: 3 * time.Second},
		{name: "Unauthorized", status: 401, body: `{"error":{"type":"invalid_request_error","message":"Invalid API Key provided: sk_test_****ey42"}}`,
			transient: "unauthorized", detail: "PAYMENT_API_KEY"},
		{name: "Forbidden", status: 403, body: `{"error":{"type":"invalid_request_error","message":"The provided key does not have the required permissions for this endpoint."}}`,
			transient: "forbidden", detail: "permission"},

		{name: "StoredServerError", status: 500, body: apiError500,
			want: payment.Outcome{Kind: payment.Indeterminate, Ref: "pi_7"}, detail: "500 api_error"},
		{name: "StoredServerErrorReplayed", status: 500, body: apiError500, headers: []string{"Idempotent-Replayed", "true"},
			want: payment.Outcome{Kind: payment.Indeterminate, Ref: "pi_7", Replayed: true}},
		{name: "ServerErrorFromAProxy", status: 500, body: `<html>500</html>`,
			want: payment.Outcome{Kind: payment.Indeterminate}},
		{name: "BadGateway", status: 502, body: `<html>502</html>`, transient: "server_error"},
		{name: "Unavailable", status: 503, body: `{"error":{"type":"api_error","message":"unavailable"}}`, transient: "server_error"},
		{name: "GatewayTimeout", status: 504, body: ``, transient: "server_error"},

		{name: "ShouldRetryTrueOnA500", status: 500, body: apiError500, headers: []string{"Stripe-Should-Retry", "true"}, transient: "server_error"},
		{name: "ShouldRetryTrueOnALockTimeout", status: 429, body: `{"error":{"type":"invalid_request_error","code":"lock_timeout"}}`,
			headers: []string{"Stripe-Should-Retry", "true"}, transient: "rate_limited"},
		{name: "ShouldRetryTrueOnA400", status: 400, body: amountTooSmall, headers: []string{"Stripe-Should-Retry", "true"}, transient: "client_error"},
		{name: "ShouldRetryFalseOnA503", status: 503, body: `{"error":{"type":"api_error","message":"stored"}}`,
			headers: []string{"Stripe-Should-Retry", "false"}, want: payment.Outcome{Kind: payment.Indeterminate}},
		{name: "ShouldRetryFalseOnA409", status: 409, body: keyInUse, headers: []string{"Stripe-Should-Retry", "false"}, transient: "conflict"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := answer(t, tt.status, tt.body, tt.headers...)
			c, m := newClient(t, srv.URL)
			got, err := c.Charge(context.Background(), charge)

			if tt.transient != "" {
				var te *payment.TransientError
				if !errors.As(err, &te) {
					t.Fatalf("Charge = %+v, %v; want a transient %s", got, err, tt.transient)
				}
				if te.Result != tt.transient || te.RetryAfter() != tt.after {
					t.Errorf("transient %q after %s, want %q after %s (%v)", te.Result, te.RetryAfter(), tt.transient, tt.after, err)
				}
				if !strings.Contains(err.Error(), tt.detail) {
					t.Errorf("error %q does not say %q", err, tt.detail)
				}
				if strings.Contains(err.Error(), apiKey) {
					t.Errorf("error %q shows the key", err)
				}
				checkCounted(t, m, tt.transient)
				return
			}
			if err != nil {
				t.Fatalf("Charge: %v, want %+v", err, tt.want)
			}
			detail := got.Detail
			got.Detail = ""
			if got != tt.want {
				t.Errorf("Charge = %+v, want %+v", got, tt.want)
			}
			if !strings.Contains(detail, tt.detail) || strings.Contains(detail, apiKey) || strings.ContainsAny(detail, "\n\r") {
				t.Errorf("Detail %q: want a single line that says %q and not the key", detail, tt.detail)
			}
		})
	}
}

// checkCounted asserts that billing_payment_requests_total holds exactly
// one request, under result.
func checkCounted(t *testing.T, m *metrics.Metrics, result string) {
	t.Helper()
	if n := testutil.CollectAndCount(m.PaymentRequests); n != 1 {
		t.Errorf("billing_payment_requests_total has %d series, want 1 (result %q)", n, result)
	}
	if got := testutil.ToFloat64(m.PaymentRequests.WithLabelValues(result)); got != 1 {
		t.Errorf("billing_payment_requests_total{result=%q} = %v, want 1", result, got)
	}
}

// checkLookup asserts that billing_payment_lookups_total holds exactly one
// lookup, under result.
func checkLookup(t *testing.T, m *metrics.Metrics, result string) {
	t.Helper()
	if n := testutil.CollectAndCount(m.PaymentLookups); n != 1 {
		t.Errorf("billing_payment_lookups_total has %d series, want 1 (result %q)", n, result)
	}
	if got := testutil.ToFloat64(m.PaymentLookups.WithLabelValues(result)); got != 1 {
		t.Errorf("billing_payment_lookups_total{result=%q} = %v, want 1", result, got)
	}
}
