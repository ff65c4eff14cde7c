package payment_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/trace"

	"example.com/billing/internal/metrics"
	"example.com/billing/internal/payment"
	"example.com/billing/internal/payment/contract"
)

const (
	apiKey    = "sk_live_S3cretKey42"
	eventID   = "01907a4e-8d2c-7b3a-9f1e-2c4d6e8fa0b1"
	wantBody  = `{"orderId":123,"customerId":45,"amount":1999,"currency":"EUR"}`
	chargeOK  = `{"id":"ch_1","status":"succeeded"}`
	offerSize = 64 << 20 // what the oversize server offers to send
)

var charge = payment.Request{IdempotencyKey: eventID, OrderID: 123, CustomerID: 45, Amount: 1999, Currency: "EUR"}

// config is a client's configuration: the contract's address and key, and
// the client's limits.
type config struct {
	BaseURL, APIKey string
	payment.Config
}

// newClient returns a client of the contract for cfg with metrics in a
// registry of its own.
func newClient(t *testing.T, cfg config) (*payment.Client, *metrics.Metrics) {
	t.Helper()
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	m := metrics.New(prometheus.NewRegistry())
	c := payment.New(contract.New(cfg.BaseURL, cfg.APIKey), cfg.Config, m)
	t.Cleanup(c.Close)
	return c, m
}

// answer returns a handler that answers every request with status, headers
// and body.
func answer(status int, body string, headers ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		for i := 0; i+1 < len(headers); i += 2 {
			w.Header().Set(headers[i], headers[i+1])
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
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

type seen struct {
	method, path, contentType, idempotencyKey string
	authorization                             []string
	body                                      string
}

func TestCharge_Request(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		basePath string // appended to the server's URL
		apiKey   string
		wantPath string
	}{
		{"OK_WithAPIKey", "", apiKey, "/v1/charges"},
		{"OK_WithoutAPIKey", "", "", "/v1/charges"},
		{"OK_TrailingSlash", "/", apiKey, "/v1/charges"},
		{"OK_PathPrefix", "/psp", apiKey, "/psp/v1/charges"},
		{"OK_PathPrefixTrailingSlash", "/api/psp/", "", "/api/psp/v1/charges"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := make(chan seen, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				got <- seen{r.Method, r.URL.Path, r.Header.Get("Content-Type"), r.Header.Get("Idempotency-Key"), r.Header.Values("Authorization"), string(body)}
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, chargeOK)
			}))
			t.Cleanup(srv.Close)
			c, _ := newClient(t, config{BaseURL: srv.URL + tt.basePath, APIKey: tt.apiKey, Config: payment.Config{MaxConcurrency: 4}})

			out, err := c.Charge(context.Background(), charge)
			if err != nil {
				t.Fatalf("Charge: %v", err)
			}
			if out.Ref != "ch_1" || out.Kind != payment.Succeeded {
				t.Errorf("outcome = %+v, want ch_1 succeeded", out)
			}
			r := <-got
			if r.method != http.MethodPost {
				t.Errorf("method = %s, want POST", r.method)
			}
			if r.path != tt.wantPath {
				t.Errorf("path = %q, want %q", r.path, tt.wantPath)
			}
			if r.contentType != "application/json" {
				t.Errorf("Content-Type = %q, want application/json", r.contentType)
			}
			if r.idempotencyKey != eventID {
				t.Errorf("Idempotency-Key = %q, want %q", r.idempotencyKey, eventID)
			}
			if r.body != wantBody {
				t.Errorf("body = %s, want %s", r.body, wantBody)
			}
			switch {
			case tt.apiKey == "" && len(r.authorization) != 0:
				t.Errorf("Authorization = %q, want none without an API key", r.authorization)
			case tt.apiKey != "" && (len(r.authorization) != 1 || r.authorization[0] != "Bearer "+tt.apiKey):
				t.Errorf("Authorization = %q, want [Bearer %s]", r.authorization, tt.apiKey)
			}
		})
	}
}

// outcome is how a caller must treat Charge's answer.
type outcome int

const (
	charged outcome = iota
	declined
	rejected
	inProgress
	transient
)

func (o outcome) String() string {
	return [...]string{"charged", "declined", "rejected", "in progress", "transient"}[o]
}

// classify checks that Charge's answer is exactly one of the documented
// kinds.
func classify(t *testing.T, out payment.Outcome, err error) outcome {
	t.Helper()
	var te *payment.TransientError
	kinds := map[outcome]bool{
		charged:    err == nil && out.Kind == payment.Succeeded,
		declined:   err == nil && out.Kind == payment.Declined,
		rejected:   err == nil && out.Kind == payment.Rejected,
		inProgress: err == nil && out.Kind == payment.InProgress,
		transient:  errors.As(err, &te) && out == (payment.Outcome{}),
	}
	var got []outcome
	for o, yes := range kinds {
		if yes {
			got = append(got, o)
		}
	}
	if len(got) != 1 {
		t.Fatalf("error %v (%T) matches %v, want exactly one kind", err, err, got)
	}
	return got[0]
}

func TestCharge_Classification(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		status     int
		body       string
		headers    []string
		want       outcome
		result     string // billing_payment_requests_total label
		retryAfter time.Duration
	}{
		{"OK_200Charged", 200, chargeOK, nil, charged, "charged", 0},
		{"OK_201Charged", 201, chargeOK, nil, charged, "charged", 0},
		{"OK_201ChargedExtraFields", 201, `{"id":"ch_1","status":"succeeded","amount":1999,"livemode":false}`, nil, charged, "charged", 0},
		{"ErrTransient_200NotJSON", 200, `<html>gateway</html>`, nil, transient, "bad_response", 0},
		{"ErrTransient_200EmptyBody", 200, ``, nil, transient, "bad_response", 0},
		{"ErrTransient_200TruncatedJSON", 200, `{"id":"ch_1","stat`, nil, transient, "bad_response", 0},
		{"ErrTransient_200NoID", 200, `{"status":"succeeded"}`, nil, transient, "bad_response", 0},
		{"ErrTransient_200NotSucceeded", 200, `{"id":"ch_1","status":"pending"}`, nil, transient, "bad_response", 0},
		{"ErrTransient_201Failed", 201, `{"id":"ch_1","status":"failed"}`, nil, transient, "bad_response", 0},
		{"ErrTransient_202Succeeded", 202, chargeOK, nil, transient, "bad_response", 0},
		{"OK_202Processing", 202, `{"id":"ch_1","status":"processing"}`, nil, inProgress, "in_progress", 0},
		{"OK_200Processing", 200, `{"id":"ch_1","status":"processing"}`, nil, inProgress, "in_progress", 0},
		{"ErrTransient_202ProcessingNoID", 202, `{"status":"processing"}`, nil, transient, "bad_response", 0},
		{"ErrTransient_204NoContent", 204, ``, nil, transient, "client_error", 0},
		{"ErrTransient_302WithoutLocation", 302, ``, nil, transient, "client_error", 0},
		{"ErrTransient_418Teapot", 418, `short and stout`, nil, transient, "client_error", 0},
		{"ErrDeclined_402", 402, `{"error":{"code":"card_declined"}}`, nil, declined, "declined", 0},
		{"ErrRejected_422KeyReused", 422, `{"error":"idempotency key reused with a different body"}`, nil, rejected, "rejected", 0},
		{"ErrRejected_400Malformed", 400, `{"error":"bad currency"}`, nil, rejected, "rejected", 0},
		{"ErrTransient_409InProgress", 409, `{"error":"in progress"}`, nil, transient, "conflict", 0},
		{"ErrTransient_429RetryAfter", 429, ``, []string{"Retry-After", "7"}, transient, "rate_limited", 7 * time.Second},
		{"ErrTransient_429NoRetryAfter", 429, ``, nil, transient, "rate_limited", 0},
		{"ErrTransient_429RetryAfterDate", 429, ``, []string{"Retry-After", "Wed, 21 Oct 2015 07:28:00 GMT"}, transient, "rate_limited", 0},
		{"ErrTransient_500", 500, `oops`, nil, transient, "server_error", 0},
		{"ErrTransient_502", 502, `bad gateway`, nil, transient, "server_error", 0},
		{"ErrTransient_503RetryAfter", 503, ``, []string{"Retry-After", "3"}, transient, "server_error", 3 * time.Second},
		{"ErrTransient_504", 504, ``, nil, transient, "server_error", 0},
		{"ErrTransient_401", 401, `{"error":"invalid api key"}`, nil, transient, "unauthorized", 0},
		{"ErrTransient_403", 403, ``, nil, transient, "unauthorized", 0},
		{"ErrTransient_404", 404, `not found`, nil, transient, "client_error", 0},
		{"ErrTransient_405", 405, ``, nil, transient, "client_error", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(answer(tt.status, tt.body, tt.headers...))
			t.Cleanup(srv.Close)
			c, m := newClient(t, config{BaseURL: srv.URL, APIKey: apiKey, Config: payment.Config{MaxConcurrency: 4}})

			out, err := c.Charge(context.Background(), charge)
			if got := classify(t, out, err); got != tt.want {
				t.Fatalf("status %d: got %v (%+v, err %v), want %v", tt.status, got, out, err, tt.want)
			}
			checkCounted(t, m, tt.result)
			switch tt.want {
			case charged, inProgress:
				if out.Ref != "ch_1" {
					t.Errorf("outcome = %+v, want the provider's id ch_1", out)
				}
				return
			case declined, rejected:
				if strings.Contains(out.Detail, apiKey) {
					t.Errorf("detail reveals the API key: %q", out.Detail)
				}
				return
			}
			if strings.Contains(err.Error(), apiKey) {
				t.Errorf("error reveals the API key: %q", err)
			}
			var te *payment.TransientError
			if errors.As(err, &te) {
				if te.Result != tt.result {
					t.Errorf("TransientError.Result = %q, want %q", te.Result, tt.result)
				}
				if te.RetryAfter() != tt.retryAfter {
					t.Errorf("TransientError.RetryAfter() = %v, want %v", te.RetryAfter(), tt.retryAfter)
				}
			}
		})
	}
}

func TestCharge_Unreachable(t *testing.T) {
	t.Parallel()

	t.Run("ErrTransient_Timeout", func(t *testing.T) {
		t.Parallel()
		release := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select { // never answer
			case <-r.Context().Done():
			case <-release:
			}
		}))
		t.Cleanup(srv.Close)
		t.Cleanup(func() { close(release) }) // runs before srv.Close
		c, m := newClient(t, config{BaseURL: srv.URL, Config: payment.Config{Timeout: 100 * time.Millisecond, MaxConcurrency: 4}})

		// The caller's own deadline is far away: the client's timeout must
		// end the call.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		started := time.Now()
		_, err := c.Charge(ctx, charge)
		if elapsed := time.Since(started); elapsed > 30*time.Second {
			t.Errorf("Charge took %v with a 100ms timeout", elapsed)
		}
		var te *payment.TransientError
		if !errors.As(err, &te) {
			t.Fatalf("err = %v (%T), want *payment.TransientError", err, err)
		}
		if te.Result != "timeout" {
			t.Errorf("Result = %q, want timeout (err %v)", te.Result, err)
		}
		checkCounted(t, m, "timeout")
	})

	t.Run("ErrTransient_ConnectionRefused", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(answer(201, chargeOK))
		base := srv.URL
		srv.Close() // nothing listens on base any more
		c, m := newClient(t, config{BaseURL: base, APIKey: apiKey, Config: payment.Config{MaxConcurrency: 4}})

		_, err := c.Charge(context.Background(), charge)
		var te *payment.TransientError
		if !errors.As(err, &te) {
			t.Fatalf("err = %v (%T), want *payment.TransientError", err, err)
		}
		if te.Result != "connection_error" {
			t.Errorf("Result = %q, want connection_error (err %v)", te.Result, err)
		}
		if strings.Contains(err.Error(), apiKey) {
			t.Errorf("error reveals the API key: %q", err)
		}
		checkCounted(t, m, "connection_error")
	})

	t.Run("ErrTransient_CallerCanceled", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(answer(201, chargeOK))
		t.Cleanup(srv.Close)
		c, _ := newClient(t, config{BaseURL: srv.URL, Config: payment.Config{MaxConcurrency: 4}})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()

		out, err := c.Charge(ctx, charge)
		if got := classify(t, out, err); got != transient {
			t.Errorf("canceled call: got %v (err %v), want transient", got, err)
		}
	})
}

// TestCharge_OversizeAnswer: a provider (or a proxy in front of it) that
// sends an endless answer must not make billing read it all.
func TestCharge_OversizeAnswer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		status int
		want   outcome
	}{
		{"ErrTransient_200Endless", 200, transient},
		{"ErrTransient_500Endless", 500, transient},
		{"ErrDeclined_402Endless", 402, declined},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			written := make(chan int, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tt.status)
				chunk := bytes.Repeat([]byte(`{"id":"ch_1",`), 4096)
				n := 0
				for n < offerSize {
					k, err := w.Write(chunk)
					n += k
					if err != nil {
						break
					}
				}
				written <- n
			}))
			t.Cleanup(srv.Close)
			c, _ := newClient(t, config{BaseURL: srv.URL, Config: payment.Config{MaxConcurrency: 4}})

			out, err := c.Charge(context.Background(), charge)
			if got := classify(t, out, err); got != tt.want {
				t.Fatalf("got %v (%+v, err %v), want %v", got, out, err, tt.want)
			}
			text := out.Detail
			if err != nil {
				text = err.Error()
			}
			if len(text) > 1024 {
				t.Errorf("error text is %d bytes long; it goes into logs and DLQ headers", len(text))
			}
			n := <-written
			t.Logf("server wrote %d bytes", n)
			if n >= offerSize {
				t.Errorf("the client accepted the whole %d-byte answer; it must stop reading early", n)
			}
		})
	}
}

// TestCharge_KeepAlive: sequential charges reuse one connection, whatever
// the answers, instead of a TCP (and in production TLS) handshake each.
func TestCharge_KeepAlive(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		maxConns int
	}{
		{"OK_MaxConcurrency4", 4},
		{"OK_MaxConcurrency1", 1},
		{"OK_MaxConcurrencyUnset", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			answers := []struct {
				status int
				body   string
			}{{201, chargeOK}, {200, chargeOK}, {402, `{"error":"declined"}`}, {422, `{"error":"reused"}`}, {409, ``}, {500, `oops`}, {200, `not json`}}
			var calls, conns atomic.Int64
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				a := answers[int(calls.Add(1)-1)%len(answers)]
				answer(a.status, a.body)(w, r)
			}))
			srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
				if s == http.StateNew {
					conns.Add(1)
				}
			}
			srv.Start()
			t.Cleanup(srv.Close)
			c, m := newClient(t, config{BaseURL: srv.URL, Config: payment.Config{MaxConcurrency: tt.maxConns}})

			for range 50 {
				_, _ = c.Charge(context.Background(), charge)
			}
			if n := calls.Load(); n != 50 {
				t.Fatalf("server saw %d requests, want 50", n)
			}
			if n := conns.Load(); n != 1 {
				t.Errorf("50 sequential charges opened %d connections, want 1", n)
			}
			// The answer cycle above, by result label.
			want := map[string]float64{"charged": 15, "declined": 7, "rejected": 7, "conflict": 7, "server_error": 7, "bad_response": 7}
			if n := testutil.CollectAndCount(m.PaymentRequests); n != len(want) {
				t.Errorf("billing_payment_requests_total has %d series, want %d", n, len(want))
			}
			var counted float64
			for result, n := range want {
				got := testutil.ToFloat64(m.PaymentRequests.WithLabelValues(result))
				if got != n {
					t.Errorf("billing_payment_requests_total{result=%q} = %v, want %v", result, got, n)
				}
				counted += got
			}
			if counted != 50 {
				t.Errorf("billing_payment_requests_total sums to %v, want 50", counted)
			}
		})
	}
}

// TestCharge_APIKeyNeverInErrors: error texts end up in logs and in the
// x-dlq-reason header of a Kafka topic, so the API key must not appear in
// them — even when the provider echoes the Authorization header back.
func TestCharge_APIKeyNeverInErrors(t *testing.T) {
	t.Parallel()
	for _, status := range []int{200, 202, 400, 401, 402, 403, 404, 409, 422, 429, 500, 503} {
		t.Run(fmt.Sprintf("OK_KeyMaskedIn%d", status), func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(status)
				_, _ = io.WriteString(w, `{"error":"invalid credentials: `+r.Header.Get("Authorization")+`", "key":"`+strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")+`"}`)
			}))
			t.Cleanup(srv.Close)
			c, _ := newClient(t, config{BaseURL: srv.URL, APIKey: apiKey, Config: payment.Config{MaxConcurrency: 4}})

			out, err := c.Charge(context.Background(), charge)
			text := out.Detail
			if err != nil {
				text = err.Error()
			}
			if text == "" {
				t.Fatalf("status %d: no error and no detail (%+v)", status, out)
			}
			if strings.Contains(text, apiKey) {
				t.Errorf("status %d: error reveals the API key: %q", status, text)
			}
		})
	}
}

// With tracing off the request still carries the caller's trace context, so
// that the provider's logs join the producer's trace.
func TestCharge_CarriesTheCallersTraceparent(t *testing.T) {
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Header.Get("traceparent"))
		io.WriteString(w, chargeOK)
	}))
	defer srv.Close()
	c, _ := newClient(t, config{BaseURL: srv.URL, Config: payment.Config{Timeout: time.Second, MaxConcurrency: 1}})
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled, Remote: true,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	if _, err := c.Charge(ctx, payment.Request{IdempotencyKey: eventID, OrderID: 123, CustomerID: 45, Amount: 1999, Currency: "EUR"}); err != nil {
		t.Fatal(err)
	}
	want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
	if got.Load() != want {
		t.Errorf("traceparent = %q, want %q", got.Load(), want)
	}
}

// The connections' buffers are smaller than a request or an answer can be:
// a request with a long API key and an answer with kilobytes of headers
// and body still go through whole.
func TestCharge_RequestsAndAnswersLargerThanTheBuffers(t *testing.T) {
	t.Parallel()
	longKey := "sk_live_" + strings.Repeat("k", 3000)
	padding := `{"id":"ch_1","status":"succeeded","metadata":"` + strings.Repeat("m", 5000) + `"}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Header.Get("Authorization") != "Bearer "+longKey || string(body) != wantBody {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		for i := range 20 { // a provider's many headers: about 4 KB
			w.Header().Set(fmt.Sprintf("X-Provider-Header-%d", i), strings.Repeat("h", 200))
		}
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, padding)
	}))
	t.Cleanup(srv.Close)
	c, _ := newClient(t, config{BaseURL: srv.URL, APIKey: longKey, Config: payment.Config{MaxConcurrency: 2}})
	for range 3 { // and again on the kept-alive connection
		out, err := c.Charge(context.Background(), charge)
		if err != nil || out.Ref != "ch_1" {
			t.Fatalf("Charge = %+v, %v; want ch_1", out, err)
		}
	}
}

// A request waits for its turn (here the rate limit's next token, half a
// second away) and is then asked whether it is still wanted: the caller's
// partition may be another consumer's by then. Refused, it is not sent,
// and the error says so; wanted, it is.
func TestCharge_ReadyIsAskedAfterTheTurnBeforeSending(t *testing.T) {
	t.Parallel()
	var got atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		answer(201, chargeOK)(w, r)
	}))
	t.Cleanup(srv.Close)
	c, m := newClient(t, config{BaseURL: srv.URL, Config: payment.Config{MaxConcurrency: 4, MaxRPS: 2}})
	if _, err := c.Charge(context.Background(), charge); err != nil { // takes the burst's token
		t.Fatal(err)
	}

	lost := errors.New("the partition is another consumer's")
	var asked time.Duration
	refused := charge
	refused.IdempotencyKey = "0190b6a4-6f6f-7aaa-8bbb-000000000002"
	began := time.Now()
	refused.Ready = func() error { asked = time.Since(began); return lost }
	_, err := c.Charge(context.Background(), refused)
	if !errors.Is(err, payment.ErrNotSent) || !errors.Is(err, lost) {
		t.Fatalf("err = %v, want ErrNotSent and the caller's reason", err)
	}
	if asked < 200*time.Millisecond {
		t.Errorf("Ready was asked %s after the call, before its turn (the rate limit's next token)", asked)
	}
	if n := got.Load(); n != 1 {
		t.Errorf("the provider got %d requests, want 1: the refused one must not be sent", n)
	}
	if got := testutil.ToFloat64(m.PaymentRequests.WithLabelValues("charged")); got != 1 {
		t.Errorf("billing_payment_requests_total{result=charged} = %v, want 1", got)
	}

	wanted := charge
	wanted.IdempotencyKey = "0190b6a4-6f6f-7aaa-8bbb-000000000003"
	wanted.Ready = func() error { return nil }
	if _, err := c.Charge(context.Background(), wanted); err != nil {
		t.Fatal(err)
	}
	if n := got.Load(); n != 2 {
		t.Errorf("the provider got %d requests, want 2", n)
	}
}
