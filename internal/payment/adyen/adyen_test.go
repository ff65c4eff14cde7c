package adyen_test

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
	"example.com/billing/internal/payment/adyen"
)

const (
	apiKey   = "AQEyhmfxS3cretKey42"
	merchant = "BillingECOM"
	eventID  = "01907a4e-8d2c-7b3a-9f1e-2c4d6e8fa0b1"
	window   = 744 * time.Hour
)

var charge = payment.Request{
	IdempotencyKey: eventID, OrderID: 123, CustomerID: 45, Amount: 1999, Currency: "EUR",
	CustomerRef: "shopper-45", PaymentMethodRef: "8415718415172200",
}

// wantBody is billing's request for charge, byte for byte.
const wantBody = `{"merchantAccount":"BillingECOM","amount":{"value":1999,"currency":"EUR"},` +
	`"reference":"` + eventID + `","merchantOrderReference":"123","shopperReference":"shopper-45",` +
	`"paymentMethod":{"type":"scheme","storedPaymentMethodId":"8415718415172200"},` +
	`"shopperInteraction":"ContAuth","recurringProcessingModel":"UnscheduledCardOnFile"}`

// newClient returns a client of the Checkout API at base, with metrics in
// a registry of its own.
func newClient(t *testing.T, base string) (*payment.Client, *metrics.Metrics) {
	t.Helper()
	m := metrics.New(prometheus.NewRegistry())
	c := payment.New(adyen.New(base, apiKey, merchant, window), payment.Config{Wallet: "adyen", Timeout: 5 * time.Second}, m)
	t.Cleanup(c.Close)
	return c, m
}

// sent is a request as the server got it.
type sent struct {
	method, path string
	header       http.Header
	body         string
}

// recorder is a Checkout API that answers every request with status,
// headers and body, and records what it got.
type recorder struct {
	srv *httptest.Server

	mu  sync.Mutex
	got []sent
}

func newRecorder(t *testing.T, status int, body string, headers ...string) *recorder {
	t.Helper()
	rec := &recorder{}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rec.mu.Lock()
		rec.got = append(rec.got, sent{r.Method, r.URL.Path, r.Header.Clone(), string(b)})
		rec.mu.Unlock()
		for i := 0; i+1 < len(headers); i += 2 {
			w.Header().Set(headers[i], headers[i+1])
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(rec.srv.Close)
	return rec
}

func (rec *recorder) requests() []sent {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]sent(nil), rec.got...)
}

// checkSent asserts that every request is billing's charge, the same
// bytes under the same headers.
func checkSent(t *testing.T, got []sent, want int) {
	t.Helper()
	if len(got) != want {
		t.Fatalf("%d requests, want %d", len(got), want)
	}
	for i, s := range got {
		if s.method != http.MethodPost || s.path != "/v71/payments" {
			t.Errorf("try %d: %s %s, want POST /v71/payments", i, s.method, s.path)
		}
		if s.body != wantBody {
			t.Errorf("try %d: body\n%s\nwant\n%s", i, s.body, wantBody)
		}
		for name, v := range map[string]string{
			"X-API-Key":       apiKey,
			"Idempotency-Key": eventID,
			"Content-Type":    "application/json",
		} {
			if got := s.header.Get(name); got != v {
				t.Errorf("try %d: %s = %q, want %q", i, name, got, v)
			}
		}
		if s.header.Get("Authorization") != "" {
			t.Errorf("try %d: an Authorization header; Adyen takes the key as X-API-Key", i)
		}
	}
}

func TestCharge_SendsTheSameRequestEveryTry(t *testing.T) {
	rec := newRecorder(t, 200, `{"pspReference":"PSP0000000000001","resultCode":"Authorised","merchantReference":"`+eventID+`"}`)
	// The API root with its version and a trailing slash, as an operator
	// may write it.
	c, _ := newClient(t, rec.srv.URL+"/v71/")
	for range 2 {
		out, err := c.Charge(context.Background(), charge)
		if err != nil || out.Kind != payment.Succeeded || out.Ref != "PSP0000000000001" {
			t.Fatalf("Charge = %+v, %v; want succeeded PSP0000000000001", out, err)
		}
	}
	checkSent(t, rec.requests(), 2)
}

// answer is a /payments answer with resultCode and extra fields.
func answer(resultCode, extra string) string {
	return `{"pspReference":"PSP0000000000001","resultCode":"` + resultCode + `","merchantReference":"` + eventID + `"` + extra + `}`
}

const (
	notEnoughBalance = `,"refusalReason":"Not enough balance","refusalReasonCode":"12"`
	acquirerError    = `,"refusalReason":"Acquirer Error","refusalReasonCode":"4"`
	inFlight         = `{"status":422,"errorCode":"704","message":"request already processed or in progress","errorType":"validation"}`
	invalidCard      = `{"status":422,"errorCode":"101","message":"Invalid card number","errorType":"validation","pspReference":"PSP0000000000009"}`
	unknownToken     = `{"type":"https://docs.adyen.com/errors/validation","title":"The request is missing required fields or contains invalid data.","status":422,"detail":"PaymentDetail not found","errorCode":"803"}`
	unparsable       = `{"status":400,"errorCode":"000","message":"Unable to parse message.","errorType":"validation"}`
	unauthorized     = `{"status":401,"errorCode":"000","message":"HTTP Status Response - Unauthorized","errorType":"security"}`
	forbidden        = `{"status":403,"errorCode":"010","message":"Not allowed","errorType":"security"}`
	rateLimited      = `{"status":429,"errorCode":"000","message":"Too many requests","errorType":"internal"}`
	internal         = `{"status":500,"errorCode":"000","message":"Internal error","errorType":"internal"}`
	storeDown        = `{"status":503,"errorCode":"703","message":"Idempotency store unavailable","errorType":"internal"}`
)

// Every row of classify's table.
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
		{name: "Authorised", status: 200, body: answer("Authorised", ""),
			want: payment.Outcome{Kind: payment.Succeeded, Ref: "PSP0000000000001"}},
		{name: "Refused", status: 200, body: answer("Refused", notEnoughBalance),
			want:   payment.Outcome{Kind: payment.Declined, Ref: "PSP0000000000001", Code: "not_enough_balance"},
			detail: "resultCode Refused (12 Not enough balance), pspReference PSP0000000000001"},
		{name: "RefusedWithoutReason", status: 200, body: answer("Refused", ""),
			want: payment.Outcome{Kind: payment.Declined, Ref: "PSP0000000000001", Code: "refused"}},
		{name: "RefusedFraud", status: 200, body: answer("Refused", `,"refusalReason":"FRAUD-CANCELLED","refusalReasonCode":"22"`),
			want: payment.Outcome{Kind: payment.Declined, Ref: "PSP0000000000001", Code: "fraud-cancelled"}},
		{name: "Cancelled", status: 200, body: answer("Cancelled", ""),
			want: payment.Outcome{Kind: payment.Declined, Ref: "PSP0000000000001", Code: "cancelled"}},
		{name: "Error", status: 200, body: answer("Error", acquirerError),
			want: payment.Outcome{Kind: payment.Declined, Ref: "PSP0000000000001", Code: "acquirer_error"}, detail: "Acquirer Error"},
		{name: "Pending", status: 200, body: answer("Pending", ""),
			want: payment.Outcome{Kind: payment.InProgress, Ref: "PSP0000000000001"}},
		{name: "Received", status: 200, body: answer("Received", ""),
			want: payment.Outcome{Kind: payment.InProgress, Ref: "PSP0000000000001"}},
		{name: "RedirectShopper", status: 200, body: answer("RedirectShopper", `,"action":{"type":"redirect","url":"https://example.com/3ds"}`),
			want:   payment.Outcome{Kind: payment.Declined, Ref: "PSP0000000000001", Code: "authentication_required"},
			detail: "the shopper would have to act"},
		{name: "RedirectShopperWithoutPspReference", status: 200, body: `{"resultCode":"RedirectShopper","action":{"type":"redirect"}}`,
			want: payment.Outcome{Kind: payment.Declined, Code: "authentication_required"}},
		{name: "IdentifyShopper", status: 200, body: answer("IdentifyShopper", ""),
			want: payment.Outcome{Kind: payment.Declined, Ref: "PSP0000000000001", Code: "authentication_required"}},
		{name: "ChallengeShopper", status: 200, body: answer("ChallengeShopper", ""),
			want: payment.Outcome{Kind: payment.Declined, Ref: "PSP0000000000001", Code: "authentication_required"}},
		{name: "PresentToShopper", status: 200, body: answer("PresentToShopper", ""),
			want: payment.Outcome{Kind: payment.Declined, Ref: "PSP0000000000001", Code: "shopper_action_required"}},
		{name: "PartiallyAuthorised", status: 200, body: answer("PartiallyAuthorised", ""),
			want: payment.Outcome{Kind: payment.InProgress, Ref: "PSP0000000000001"}, detail: "PartiallyAuthorised"},
		{name: "UnreadableSuccess", status: 200, body: `<html>ok</html>`, transient: "bad_response"},
		{name: "NoResultCode", status: 200, body: `{"pspReference":"PSP0000000000001"}`, transient: "bad_response"},
		{name: "NoPspReference", status: 200, body: `{"resultCode":"Authorised"}`, transient: "bad_response"},

		{name: "InFlight422", status: 422, body: inFlight, headers: []string{"transient-error", "true"}, transient: "conflict", detail: "704"},
		{name: "InFlight409", status: 409, body: strings.Replace(inFlight, "422", "409", 1), transient: "conflict"},
		{name: "InFlightWithoutTheHeader", status: 422, body: inFlight, transient: "conflict"},
		{name: "Validation", status: 422, body: invalidCard,
			want: payment.Outcome{Kind: payment.Rejected, Ref: "PSP0000000000009", Code: "101"}, detail: "422 validation 101: Invalid card number"},
		{name: "ValidationRFC7807", status: 422, body: unknownToken,
			want: payment.Outcome{Kind: payment.Rejected, Code: "803"}, detail: "PaymentDetail not found"},
		{name: "Unparsable", status: 400, body: unparsable,
			want: payment.Outcome{Kind: payment.Rejected, Code: "000"}},
		{name: "ValidationSaysTransient", status: 422, body: invalidCard, headers: []string{"Transient-Error", "true"}, transient: "client_error"},
		{name: "KeyMasked", status: 422, body: `{"status":422,"errorCode":"000","message":"key ` + apiKey + ` refused","errorType":"validation"}`,
			want: payment.Outcome{Kind: payment.Rejected, Code: "000"}, detail: "xxxxx"},
		{name: "UnprocessableFromAProxy", status: 422, body: `<html>422</html>`, transient: "client_error"},
		{name: "BadRequestFromAProxy", status: 400, body: `<html>400 Bad Request</html>`, transient: "client_error"},
		{name: "WrongBaseURL", status: 404, body: `{"status":404,"errorCode":"000","message":"Not found"}`, transient: "client_error"},
		{name: "Redirect", status: 302, headers: []string{"Location", "https://example.com/"}, transient: "client_error"},
		{name: "Conflict", status: 409, body: `{"status":409,"errorCode":"000","message":"conflict"}`, transient: "conflict"},
		{name: "RateLimited", status: 429, body: rateLimited, transient: "rate_limited"},
		{name: "RateLimitedRetryAfter", status: 429, body: rateLimited, headers: []string{"Retry-After", "3"}, transient: "rate_limited", after: 3 * time.Second},
		{name: "Unauthorized", status: 401, body: unauthorized, transient: "unauthorized", detail: "PAYMENT_API_KEY"},
		{name: "Forbidden", status: 403, body: forbidden, transient: "forbidden", detail: "ADYEN_MERCHANT_ACCOUNT"},
		{name: "InternalError", status: 500, body: internal, transient: "server_error"},
		{name: "IdempotencyStoreDown", status: 503, body: storeDown, transient: "server_error", detail: "703"},
		{name: "BadGatewayFromAProxy", status: 502, body: `<html>502</html>`, transient: "server_error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := newRecorder(t, tt.status, tt.body, tt.headers...)
			c, m := newClient(t, rec.srv.URL+"/v71")
			got, err := c.Charge(context.Background(), charge)

			if tt.transient != "" {
				var te *payment.TransientError
				if !errors.As(err, &te) {
					t.Fatalf("Charge = %+v, %v; want a transient %s", got, err, tt.transient)
				}
				if te.Result != tt.transient || te.RetryAfter() != tt.after {
					t.Errorf("transient %q after %s, want %q after %s (%v)", te.Result, te.RetryAfter(), tt.transient, tt.after, err)
				}
				if !strings.Contains(err.Error(), tt.detail) || strings.Contains(err.Error(), apiKey) {
					t.Errorf("error %q: want it to say %q and not the key", err, tt.detail)
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
			result := tt.want.Kind.String()
			if tt.want.Kind == payment.Succeeded {
				result = "charged"
			}
			checkCounted(t, m, result)
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

// Resolve is the same request again under the same key, within the key's
// validity: Adyen answers with the stored first answer. Past it, nothing is
// sent: the same request could be a new payment. Nor for an attempt whose
// first answer (Pending) billing recorded: Adyen would replay it.
func TestResolve(t *testing.T) {
	tests := []struct {
		name     string
		age      time.Duration // of the attempt
		ref      string        // the pspReference billing recorded, "" when no answer was
		status   int
		body     string
		want     payment.Kind
		wantSent int
		wantErr  bool
	}{
		{name: "PendingRecordedIsNotAskedAgain", age: time.Hour, ref: "PSP0000000000001", status: 200, body: answer("Authorised", ""), want: payment.InProgress},
		{name: "WithinTheWindowAuthorised", age: time.Hour, status: 200, body: answer("Authorised", ""), want: payment.Succeeded, wantSent: 1},
		{name: "WithinTheWindowRefused", age: 30 * 24 * time.Hour, status: 200, body: answer("Refused", notEnoughBalance), want: payment.Declined, wantSent: 1},
		{name: "WithinTheWindowStillPending", age: time.Hour, status: 200, body: answer("Pending", ""), want: payment.InProgress, wantSent: 1},
		{name: "WithinTheWindowInFlight", age: time.Minute, status: 422, body: inFlight, wantSent: 1, wantErr: true},
		{name: "PastTheWindow", age: window + time.Minute, status: 200, body: answer("Authorised", ""), want: payment.Unknown},
		{name: "NoRecordedTime", status: 200, body: answer("Authorised", ""), want: payment.Unknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := newRecorder(t, tt.status, tt.body)
			c, m := newClient(t, rec.srv.URL+"/v71")
			l := payment.Lookup{Request: charge, Ref: tt.ref}
			if tt.age > 0 {
				l.Created = time.Now().Add(-tt.age)
			}
			got, err := c.Resolve(context.Background(), l)
			if (err != nil) != tt.wantErr || (err == nil && got.Kind != tt.want) {
				t.Fatalf("Resolve = %+v, %v; want %s (error %v)", got, err, tt.want, tt.wantErr)
			}
			checkSent(t, rec.requests(), tt.wantSent)
			if !tt.wantErr && tt.want == payment.Unknown && !strings.Contains(got.Detail, "idempotency window") {
				t.Errorf("Detail %q does not say why nothing was asked", got.Detail)
			}
			if testutil.CollectAndCount(m.PaymentRequests) != 0 {
				t.Errorf("a lookup counted as a charge request")
			}
		})
	}

	rec := newRecorder(t, 200, answer("Authorised", ""))
	c, _ := newClient(t, rec.srv.URL+"/v71")
	if out, err := c.Resolve(context.Background(), payment.Lookup{Created: time.Now()}); err == nil {
		t.Errorf("a lookup without an idempotency key: %+v", out)
	}
}

func TestCharges_NoListAPI(t *testing.T) {
	rec := newRecorder(t, 200, `{}`)
	c, _ := newClient(t, rec.srv.URL+"/v71")
	if _, err := c.Charges(context.Background(), time.Now().Add(-time.Hour), time.Now()); !errors.Is(err, adyen.ErrNoList) {
		t.Errorf("Charges: %v, want ErrNoList", err)
	}
	if n := len(rec.requests()); n != 0 {
		t.Errorf("%d requests to list payments, want none", n)
	}
}
