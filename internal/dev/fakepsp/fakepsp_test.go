package fakepsp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/testenv/wait"
)

const validBody = `{"orderId":123,"customerId":45,"amount":1999,"currency":"EUR"}`

// reply is a complete HTTP response.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// start serves a fake provider with opts until the test ends, then closes
// the HTTP server and the provider's goroutines, in that order.
func start(t *testing.T, opts fakepsp.Options) (*fakepsp.Server, *httptest.Server) {
	t.Helper()
	psp := fakepsp.New(opts)
	t.Cleanup(func() { _ = psp.Close() })
	ts := httptest.NewServer(psp)
	t.Cleanup(ts.Close)
	return psp, ts
}

func chargeBody(orderID, customerID, amount int64, currency string) string {
	return fmt.Sprintf(`{"orderId":%d,"customerId":%d,"amount":%d,"currency":%q}`,
		orderID, customerID, amount, currency)
}

// newChargeRequest builds a POST /v1/charges; an empty key sends no
// Idempotency-Key header.
func newChargeRequest(ctx context.Context, baseURL, key, body string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/v1/charges", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return req, nil
}

// do sends req and reads the whole response. It does not use t, so it can
// run on other goroutines.
func do(client *http.Client, req *http.Request) (reply, error) {
	resp, err := client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: body}, nil
}

// charge posts body under key to ts, with extra headers given as name,
// value pairs.
func charge(t *testing.T, ts *httptest.Server, key, body string, header ...string) reply {
	t.Helper()
	req, err := newChargeRequest(t.Context(), ts.URL, key, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	r, err := do(ts.Client(), req)
	if err != nil {
		t.Fatalf("POST /v1/charges: %v", err)
	}
	return r
}

// call sends a request to a route other than POST /v1/charges.
func call(t *testing.T, ts *httptest.Server, method, path, body string) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, ts.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	r, err := do(ts.Client(), req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

func wantStatus(t *testing.T, r reply, status int) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status = %d, want %d; body %s", r.status, status, r.body)
	}
}

// wantStats compares the counters; PeakPerSecond depends on timing and is
// compared only when want sets it.
func wantStats(t *testing.T, psp *fakepsp.Server, want fakepsp.Stats) {
	t.Helper()
	got := psp.Stats()
	if want.PeakPerSecond == 0 {
		got.PeakPerSecond = 0
	}
	if got != want {
		t.Errorf("stats:\n got  %+v\n want %+v", got, want)
	}
}

func decode[T any](t *testing.T, data []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("decoding %s: %v", data, err)
	}
	return v
}

type errorBody struct {
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func wantErrorType(t *testing.T, r reply, errType string) {
	t.Helper()
	if got := decode[errorBody](t, r.body).Error; got.Type != errType || got.Message == "" {
		t.Errorf("error = %+v, want type %q and a message", got, errType)
	}
}

var chargeID = regexp.MustCompile(`^ch_[0-9a-f]{24}$`)

func TestFirstRequestCreatesCharge(t *testing.T) {
	t.Parallel()
	psp, ts := start(t, fakepsp.Options{})
	before := time.Now()

	r := charge(t, ts, "key-1", validBody)

	wantStatus(t, r, http.StatusOK)
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}
	if h := r.header.Get("Idempotent-Replayed"); h != "" {
		t.Errorf("Idempotent-Replayed = %q on the first answer", h)
	}
	got := decode[struct {
		ID         string `json:"id"`
		Status     string `json:"status"`
		OrderID    int64  `json:"orderId"`
		CustomerID int64  `json:"customerId"`
		Amount     int64  `json:"amount"`
		Currency   string `json:"currency"`
		Created    string `json:"created"`
	}](t, r.body)
	if !chargeID.MatchString(got.ID) {
		t.Errorf("id = %q, want ch_ and 24 hex characters", got.ID)
	}
	if got.Status != "succeeded" || got.OrderID != 123 || got.CustomerID != 45 || got.Amount != 1999 || got.Currency != "EUR" {
		t.Errorf("answer = %+v", got)
	}
	created, err := time.Parse(time.RFC3339Nano, got.Created)
	if err != nil {
		t.Fatalf("created: %v", err)
	}

	want := []fakepsp.Charge{{
		ID:             got.ID,
		IdempotencyKey: "key-1",
		OrderID:        123,
		CustomerID:     45,
		Amount:         1999,
		Currency:       "EUR",
		Status:         "succeeded",
		Created:        created,
	}}
	charges := psp.Charges()
	if !slices.Equal(charges, want) {
		t.Errorf("charges = %+v, want %+v", charges, want)
	}
	if created.Before(before.Add(-time.Second)) || created.After(time.Now().Add(time.Second)) {
		t.Errorf("created = %v, not around now", created)
	}
	wantStats(t, psp, fakepsp.Stats{Requests: 1, DistinctKeys: 1, ChargesCreated: 1})
}

func TestReplay(t *testing.T) {
	t.Parallel()
	psp, ts := start(t, fakepsp.Options{})
	first := charge(t, ts, "key-1", validBody)
	wantStatus(t, first, http.StatusOK)

	// The same fields in another order and layout are the same request.
	for _, body := range []string{
		validBody,
		"{\n  \"currency\": \"EUR\", \"amount\": 1999,\n  \"customerId\": 45, \"orderId\": 123\n}",
	} {
		r := charge(t, ts, "key-1", body)
		wantStatus(t, r, http.StatusOK)
		if !bytes.Equal(r.body, first.body) {
			t.Errorf("replayed body:\n %s\nwant\n %s", r.body, first.body)
		}
		if h := r.header.Get("Idempotent-Replayed"); h != "true" {
			t.Errorf("Idempotent-Replayed = %q, want true", h)
		}
	}
	if n := len(psp.Charges()); n != 1 {
		t.Errorf("%d charges, want 1", n)
	}
	wantStats(t, psp, fakepsp.Stats{Requests: 3, DistinctKeys: 1, ChargesCreated: 1, Replays: 2})
}

func TestKeyReusedWithDifferentBody(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		body string
	}{
		{"orderId", chargeBody(124, 45, 1999, "EUR")},
		{"customerId", chargeBody(123, 46, 1999, "EUR")},
		{"amount", chargeBody(123, 45, 2000, "EUR")},
		{"currency", chargeBody(123, 45, 1999, "USD")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			psp, ts := start(t, fakepsp.Options{})
			first := charge(t, ts, "key-1", validBody)
			wantStatus(t, first, http.StatusOK)

			r := charge(t, ts, "key-1", tt.body)
			wantStatus(t, r, http.StatusUnprocessableEntity)
			wantErrorType(t, r, "idempotency_error")

			// The key still belongs to the original request.
			again := charge(t, ts, "key-1", validBody)
			wantStatus(t, again, http.StatusOK)
			if !bytes.Equal(again.body, first.body) {
				t.Errorf("replay after 422 = %s, want %s", again.body, first.body)
			}
			if n := len(psp.Charges()); n != 1 {
				t.Errorf("%d charges, want 1", n)
			}
			wantStats(t, psp, fakepsp.Stats{Requests: 3, DistinctKeys: 1, ChargesCreated: 1, Replays: 1, Mismatches: 1})
		})
	}
}

func TestConcurrentRequestsWithSameKey(t *testing.T) {
	t.Parallel()
	// Latency keeps the first request in flight while the others arrive.
	// It only has to exceed the time the others take to reach the server.
	psp, ts := start(t, fakepsp.Options{Latency: time.Second})
	const n = 8

	startLine := make(chan struct{})
	replies := make(chan reply, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			req, err := newChargeRequest(t.Context(), ts.URL, "key-1", validBody)
			if err != nil {
				t.Error(err)
				return
			}
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

	var ok []reply
	conflicts := 0
	for r := range replies {
		switch r.status {
		case http.StatusOK:
			ok = append(ok, r)
		case http.StatusConflict:
			conflicts++
			wantErrorType(t, r, "idempotency_error")
		default:
			t.Errorf("unexpected answer %d %s", r.status, r.body)
		}
	}
	if len(ok) != 1 || conflicts != n-1 {
		t.Fatalf("%d answered 200 and %d 409, want 1 and %d", len(ok), conflicts, n-1)
	}
	charges := psp.Charges()
	if len(charges) != 1 {
		t.Fatalf("%d charges, want 1", len(charges))
	}
	wantStats(t, psp, fakepsp.Stats{Requests: n, DistinctKeys: 1, ChargesCreated: 1, Conflicts: n - 1})

	// Once settled, the key replays the one charge.
	psp.SetOptions(fakepsp.Options{})
	r := charge(t, ts, "key-1", validBody)
	wantStatus(t, r, http.StatusOK)
	if !bytes.Equal(r.body, ok[0].body) {
		t.Errorf("replay = %s, want %s", r.body, ok[0].body)
	}
}

func TestAbandonedRequestStillCharges(t *testing.T) {
	t.Parallel()
	psp, ts := start(t, fakepsp.Options{Latency: time.Second})

	// The client gives up while the provider is still processing, as a
	// billing service with a short timeout would.
	ctx, cancel := context.WithCancel(t.Context())
	req, err := newChargeRequest(ctx, ts.URL, "key-1", validBody)
	if err != nil {
		t.Fatal(err)
	}
	abandoned := make(chan error, 1)
	go func() {
		_, err := do(ts.Client(), req)
		abandoned <- err
	}()
	wait.For(t, 10*time.Second, "the provider to receive the request", func() bool { return psp.Stats().Requests == 1 })
	cancel()
	if err := <-abandoned; !errors.Is(err, context.Canceled) {
		t.Fatalf("abandoned request: err = %v, want context.Canceled", err)
	}

	// New requests are answered at once, but the abandoned one keeps its
	// latency and its key in flight.
	psp.SetOptions(fakepsp.Options{})
	wantStatus(t, charge(t, ts, "key-1", validBody), http.StatusConflict)

	var r reply
	wait.For(t, 10*time.Second, "the abandoned request to finish", func() bool {
		r = charge(t, ts, "key-1", validBody)
		return r.status != http.StatusConflict
	})
	wantStatus(t, r, http.StatusOK)
	if r.header.Get("Idempotent-Replayed") != "true" {
		t.Error("retry after the abandoned request was not a replay")
	}
	charges := psp.Charges()
	if len(charges) != 1 || decode[fakepsp.Charge](t, r.body).ID != charges[0].ID {
		t.Errorf("charges = %+v, answer %s", charges, r.body)
	}
	// How many retries met the key in flight depends on timing; every
	// request besides the abandoned one and the replay was one of them.
	conflicts := psp.Stats().Conflicts
	wantStats(t, psp, fakepsp.Stats{Requests: conflicts + 2, DistinctKeys: 1, ChargesCreated: 1, Replays: 1, Conflicts: conflicts})
}

func TestInjectedFailure(t *testing.T) {
	t.Parallel()
	psp, ts := start(t, fakepsp.Options{FailRate: 1})

	r := charge(t, ts, "key-1", validBody)
	wantStatus(t, r, http.StatusServiceUnavailable)
	wantErrorType(t, r, "api_error")
	if n := len(psp.Charges()); n != 0 {
		t.Fatalf("%d charges after an injected failure, want 0", n)
	}
	wantStats(t, psp, fakepsp.Stats{Requests: 1, InjectedFailures: 1})

	psp.SetOptions(fakepsp.Options{})
	wantStatus(t, charge(t, ts, "key-1", validBody), http.StatusOK)
	wantStatus(t, charge(t, ts, "key-1", validBody), http.StatusOK)
	if n := len(psp.Charges()); n != 1 {
		t.Errorf("%d charges, want 1", n)
	}
	wantStats(t, psp, fakepsp.Stats{Requests: 3, DistinctKeys: 1, ChargesCreated: 1, Replays: 1, InjectedFailures: 1})
}

func TestFailOrders_FailsOnlyTheListedOrdersWhileListed(t *testing.T) {
	t.Parallel()
	psp, ts := start(t, fakepsp.Options{})
	wantStatus(t, call(t, ts, http.MethodPut, "/_faults", `{"failOrders":[7]}`), http.StatusOK)

	r := charge(t, ts, "key-7", chargeBody(7, 1, 100, "EUR"))
	wantStatus(t, r, http.StatusServiceUnavailable)
	wantErrorType(t, r, "api_error")
	wantStatus(t, charge(t, ts, "key-8", chargeBody(8, 1, 100, "EUR")), http.StatusOK)
	wantStats(t, psp, fakepsp.Stats{Requests: 2, DistinctKeys: 1, ChargesCreated: 1, InjectedFailures: 1})

	wantStatus(t, call(t, ts, http.MethodPut, "/_faults", `{}`), http.StatusOK)
	wantStatus(t, charge(t, ts, "key-7", chargeBody(7, 1, 100, "EUR")), http.StatusOK)
	if n := len(psp.Charges()); n != 2 {
		t.Errorf("%d charges, want 2", n)
	}
}

func TestResetAfterCharging(t *testing.T) {
	t.Parallel()
	psp, ts := start(t, fakepsp.Options{ResetRate: 1})

	// A fresh connection per request: on a reused one, net/http silently
	// retries a failed request that carries an Idempotency-Key, and the
	// retry would replay the charge instead of showing the reset.
	transport := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(transport.CloseIdleConnections)
	req, err := newChargeRequest(t.Context(), ts.URL, "key-1", validBody)
	if err != nil {
		t.Fatal(err)
	}
	_, err = do(&http.Client{Transport: transport}, req)
	if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("err = %v, want a connection reset or EOF", err)
	}
	charges := psp.Charges()
	if len(charges) != 1 {
		t.Fatalf("%d charges after the reset, want 1", len(charges))
	}
	wantStats(t, psp, fakepsp.Stats{Requests: 1, DistinctKeys: 1, ChargesCreated: 1, Resets: 1})

	// Replays are always answered, whatever ResetRate.
	r := charge(t, ts, "key-1", validBody)
	wantStatus(t, r, http.StatusOK)
	if r.header.Get("Idempotent-Replayed") != "true" {
		t.Error("retry was not a replay")
	}
	if id := decode[fakepsp.Charge](t, r.body).ID; id != charges[0].ID {
		t.Errorf("replayed id = %q, want %q", id, charges[0].ID)
	}
	wantStats(t, psp, fakepsp.Stats{Requests: 2, DistinctKeys: 1, ChargesCreated: 1, Replays: 1, Resets: 1})
}

func TestDecline(t *testing.T) {
	t.Parallel()
	psp, ts := start(t, fakepsp.Options{DeclineEvery: 10})

	first := charge(t, ts, "key-20", chargeBody(20, 45, 1999, "EUR"))
	wantStatus(t, first, http.StatusPaymentRequired)
	wantErrorType(t, first, "card_declined")

	again := charge(t, ts, "key-20", chargeBody(20, 45, 1999, "EUR"))
	wantStatus(t, again, http.StatusPaymentRequired)
	if !bytes.Equal(again.body, first.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry = %s (replayed %q), want replay of %s",
			again.body, again.header.Get("Idempotent-Replayed"), first.body)
	}
	if n := len(psp.Charges()); n != 0 {
		t.Fatalf("%d charges after a decline, want 0", n)
	}

	wantStatus(t, charge(t, ts, "key-21", chargeBody(21, 45, 1999, "EUR")), http.StatusOK)
	if c := psp.Charges(); len(c) != 1 || c[0].OrderID != 21 {
		t.Errorf("charges = %+v, want only order 21", c)
	}
	wantStats(t, psp, fakepsp.Stats{Requests: 3, DistinctKeys: 2, ChargesCreated: 1, Declines: 1, Replays: 1})
}

func TestDeclineIsNeverReset(t *testing.T) {
	t.Parallel()
	psp, ts := start(t, fakepsp.Options{DeclineEvery: 1, ResetRate: 1})
	wantStatus(t, charge(t, ts, "key-1", validBody), http.StatusPaymentRequired)
	wantStats(t, psp, fakepsp.Stats{Requests: 1, DistinctKeys: 1, Declines: 1})
}

func TestDown(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		setDown func(t *testing.T, psp *fakepsp.Server, ts *httptest.Server, down bool)
	}{
		{
			name: "SetDown",
			setDown: func(_ *testing.T, psp *fakepsp.Server, _ *httptest.Server, down bool) {
				psp.SetDown(down)
			},
		},
		{
			name: "POST /_down and /_up",
			setDown: func(t *testing.T, _ *fakepsp.Server, ts *httptest.Server, down bool) {
				path := "/_up"
				if down {
					path = "/_down"
				}
				wantStatus(t, call(t, ts, http.MethodPost, path, ""), http.StatusOK)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			psp, ts := start(t, fakepsp.Options{})
			wantStatus(t, charge(t, ts, "settled", validBody), http.StatusOK)

			otherOrder := chargeBody(124, 45, 1999, "EUR")
			tt.setDown(t, psp, ts, true)
			for _, req := range []struct{ key, body string }{{"settled", validBody}, {"new", otherOrder}} {
				r := charge(t, ts, req.key, req.body)
				wantStatus(t, r, http.StatusServiceUnavailable)
				wantErrorType(t, r, "api_error")
			}
			// Even malformed requests are refused before anything else.
			wantStatus(t, charge(t, ts, "", "{"), http.StatusServiceUnavailable)
			wantStats(t, psp, fakepsp.Stats{Requests: 4, DistinctKeys: 1, ChargesCreated: 1, DownRejections: 3})

			tt.setDown(t, psp, ts, false)
			wantStatus(t, charge(t, ts, "new", otherOrder), http.StatusOK)
			if n := len(psp.Charges()); n != 2 {
				t.Errorf("%d charges, want 2", n)
			}
			wantStats(t, psp, fakepsp.Stats{Requests: 5, DistinctKeys: 2, ChargesCreated: 2, DownRejections: 3})
		})
	}
}

func TestBadRequest(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		key  string
		body string
	}{
		{"missing Idempotency-Key", "", validBody},
		{"Idempotency-Key too long", strings.Repeat("k", 256), validBody},
		{"empty body", "k", ""},
		{"not JSON", "k", "orderId=123"},
		{"truncated JSON", "k", `{"orderId":123`},
		{"JSON array", "k", "[]"},
		{"JSON null", "k", "null"},
		{"data after the JSON value", "k", validBody + "{}"},
		{"unknown field", "k", `{"orderId":123,"customerId":45,"amount":1999,"currency":"EUR","capture":true}`},
		{"orderId missing", "k", `{"customerId":45,"amount":1999,"currency":"EUR"}`},
		{"orderId zero", "k", chargeBody(0, 45, 1999, "EUR")},
		{"orderId negative", "k", chargeBody(-1, 45, 1999, "EUR")},
		{"orderId fractional", "k", `{"orderId":1.5,"customerId":45,"amount":1999,"currency":"EUR"}`},
		{"orderId string", "k", `{"orderId":"123","customerId":45,"amount":1999,"currency":"EUR"}`},
		{"orderId overflows int64", "k", `{"orderId":9223372036854775808,"customerId":45,"amount":1999,"currency":"EUR"}`},
		{"customerId zero", "k", chargeBody(123, 0, 1999, "EUR")},
		{"customerId negative", "k", chargeBody(123, -45, 1999, "EUR")},
		{"amount zero", "k", chargeBody(123, 45, 0, "EUR")},
		{"amount negative", "k", chargeBody(123, 45, -1999, "EUR")},
		{"amount in major units", "k", `{"orderId":123,"customerId":45,"amount":19.99,"currency":"EUR"}`},
		{"currency missing", "k", `{"orderId":123,"customerId":45,"amount":1999}`},
		{"currency lower case", "k", chargeBody(123, 45, 1999, "eur")},
		{"currency too short", "k", chargeBody(123, 45, 1999, "EU")},
		{"currency too long", "k", chargeBody(123, 45, 1999, "EURO")},
		{"currency with digit", "k", chargeBody(123, 45, 1999, "E1R")},
		{"currency number", "k", `{"orderId":123,"customerId":45,"amount":1999,"currency":978}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			psp, ts := start(t, fakepsp.Options{})
			r := charge(t, ts, tt.key, tt.body)
			wantStatus(t, r, http.StatusBadRequest)
			wantErrorType(t, r, "invalid_request_error")
			wantStats(t, psp, fakepsp.Stats{Requests: 1, BadRequests: 1})

			// Nothing was stored: the key is still free.
			wantStatus(t, charge(t, ts, "k", validBody), http.StatusOK)
			wantStats(t, psp, fakepsp.Stats{Requests: 2, BadRequests: 1, DistinctKeys: 1, ChargesCreated: 1})
		})
	}
}

func TestAPIKey(t *testing.T) {
	t.Parallel()
	const apiKey = "sk_test_123"
	tests := []struct {
		name          string
		authorization string // "" sends no header
		want          int
	}{
		{"missing", "", http.StatusUnauthorized},
		{"wrong key", "Bearer sk_test_999", http.StatusUnauthorized},
		{"prefix of the key", "Bearer sk_test_12", http.StatusUnauthorized},
		{"key with suffix", "Bearer sk_test_1234", http.StatusUnauthorized},
		{"empty token", "Bearer ", http.StatusUnauthorized},
		{"no scheme", apiKey, http.StatusUnauthorized},
		{"other scheme", "Basic " + apiKey, http.StatusUnauthorized},
		{"right key", "Bearer " + apiKey, http.StatusOK},
		{"scheme in lower case", "bearer " + apiKey, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			psp, ts := start(t, fakepsp.Options{APIKey: apiKey})
			var header []string
			if tt.authorization != "" {
				header = []string{"Authorization", tt.authorization}
			}
			r := charge(t, ts, "key-1", validBody, header...)
			wantStatus(t, r, tt.want)
			if tt.want == http.StatusOK {
				wantStats(t, psp, fakepsp.Stats{Requests: 1, DistinctKeys: 1, ChargesCreated: 1})
				return
			}
			wantErrorType(t, r, "authentication_error")
			wantStats(t, psp, fakepsp.Stats{Requests: 1, Unauthorized: 1})

			// Nothing was stored: the key is still free.
			wantStatus(t, charge(t, ts, "key-1", validBody, "Authorization", "Bearer "+apiKey), http.StatusOK)
			wantStats(t, psp, fakepsp.Stats{Requests: 2, Unauthorized: 1, DistinctKeys: 1, ChargesCreated: 1})
		})
	}
}

func TestOrdersChargedTwice(t *testing.T) {
	t.Parallel()
	psp, ts := start(t, fakepsp.Options{})
	// A billing service that lost track of an order and charged it under
	// new keys; the provider accepts it and counts it.
	for _, key := range []string{"a", "b", "c"} {
		wantStatus(t, charge(t, ts, key, chargeBody(7, 45, 1999, "EUR")), http.StatusOK)
	}
	wantStatus(t, charge(t, ts, "a", chargeBody(7, 45, 1999, "EUR")), http.StatusOK) // replay
	wantStatus(t, charge(t, ts, "d", chargeBody(8, 45, 1999, "EUR")), http.StatusOK)

	ids := map[string]bool{}
	for _, c := range psp.Charges() {
		ids[c.ID] = true
	}
	if len(ids) != 4 {
		t.Errorf("%d distinct charge ids, want 4", len(ids))
	}
	wantStats(t, psp, fakepsp.Stats{Requests: 5, DistinctKeys: 4, ChargesCreated: 4, Replays: 1, OrdersChargedTwice: 1})
}

func TestListCharges(t *testing.T) {
	t.Parallel()
	psp, ts := start(t, fakepsp.Options{})
	for i := range int64(4) {
		wantStatus(t, charge(t, ts, fmt.Sprint("key-", i), chargeBody(100+i, 45, 1999, "EUR")), http.StatusOK)
	}
	all := psp.Charges()
	first, last := all[0].Created, all[len(all)-1].Created

	// within is the expected filter, for windows whose bounds fall between
	// charges created at the same instant on a coarse clock.
	within := func(from, to time.Time) []fakepsp.Charge {
		var out []fakepsp.Charge
		for _, c := range all {
			if !c.Created.Before(from) && c.Created.Before(to) {
				out = append(out, c)
			}
		}
		return out
	}
	ts3339 := func(t time.Time) string { return t.Format(time.RFC3339Nano) }

	tests := []struct {
		name  string
		query url.Values
		want  []fakepsp.Charge
	}{
		{"all", nil, all},
		{"from the first", url.Values{"created_gte": {ts3339(first)}}, all},
		{"after the last", url.Values{"created_gte": {ts3339(last.Add(time.Nanosecond))}}, nil},
		{"before the first", url.Values{"created_lt": {ts3339(first)}}, nil},
		{"up to the last", url.Values{"created_lt": {ts3339(last.Add(time.Nanosecond))}}, all},
		{
			"middle",
			url.Values{"created_gte": {ts3339(all[1].Created)}, "created_lt": {ts3339(all[3].Created)}},
			within(all[1].Created, all[3].Created),
		},
		{
			"other time zone",
			url.Values{"created_gte": {first.In(time.FixedZone("X", -5*3600)).Format(time.RFC3339Nano)}},
			all,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := call(t, ts, http.MethodGet, "/v1/charges?"+tt.query.Encode(), "")
			wantStatus(t, r, http.StatusOK)
			if !bytes.HasPrefix(r.body, []byte(`{"data":[`)) {
				t.Errorf("body = %s, want a data list", r.body)
			}
			got := decode[struct {
				Data []fakepsp.Charge `json:"data"`
			}](t, r.body).Data
			if !slices.EqualFunc(got, tt.want, sameCharge) {
				t.Errorf("charges:\n got  %+v\n want %+v", got, tt.want)
			}
		})
	}

	for _, query := range []string{"created_gte=yesterday", "created_lt=2025-13-01T00:00:00Z"} {
		r := call(t, ts, http.MethodGet, "/v1/charges?"+query, "")
		wantStatus(t, r, http.StatusBadRequest)
		wantErrorType(t, r, "invalid_request_error")
	}
}

func sameCharge(a, b fakepsp.Charge) bool {
	created := a.Created.Equal(b.Created)
	a.Created, b.Created = time.Time{}, time.Time{}
	return created && a == b
}

func TestFaults(t *testing.T) {
	t.Parallel()
	const apiKey = "sk_test_123"
	psp, ts := start(t, fakepsp.Options{APIKey: apiKey, DeclineEvery: 5, Seed: 9})
	auth := []string{"Authorization", "Bearer " + apiKey}

	getFaults := func(t *testing.T) fakepsp.Options {
		t.Helper()
		r := call(t, ts, http.MethodGet, "/_faults", "")
		wantStatus(t, r, http.StatusOK)
		if bytes.Contains(r.body, []byte("apiKey")) || bytes.Contains(r.body, []byte(apiKey)) {
			t.Errorf("GET /_faults reveals the API key: %s", r.body)
		}
		return decode[fakepsp.Options](t, r.body)
	}
	if got, want := getFaults(t), (fakepsp.Options{DeclineEvery: 5, Seed: 9}); !reflect.DeepEqual(got, want) {
		t.Errorf("faults = %+v, want %+v", got, want)
	}

	// PUT replaces the faults (DeclineEvery goes) but keeps the unseen key.
	r := call(t, ts, http.MethodPut, "/_faults", `{"failRate":1,"latency":1000000}`)
	wantStatus(t, r, http.StatusOK)
	want := fakepsp.Options{FailRate: 1, Latency: time.Millisecond}
	if got := decode[fakepsp.Options](t, r.body); !reflect.DeepEqual(got, want) {
		t.Errorf("PUT answered %+v, want %+v", got, want)
	}
	if got := getFaults(t); !reflect.DeepEqual(got, want) {
		t.Errorf("faults = %+v, want %+v", got, want)
	}
	wantStatus(t, charge(t, ts, "key-1", validBody), http.StatusUnauthorized)
	wantStatus(t, charge(t, ts, "key-1", validBody, auth...), http.StatusServiceUnavailable)

	for _, body := range []string{
		`{"failRate":1.5}`,
		`{"failRate":-0.1}`,
		`{"resetRate":2}`,
		`{"latency":-1}`,
		`{"declineEvery":-1}`,
		`{"latency":"1s"}`,
		`{"failrate":0.5,"bogus":1}`,
		`{"failRate":`,
	} {
		r := call(t, ts, http.MethodPut, "/_faults", body)
		wantStatus(t, r, http.StatusBadRequest)
		wantErrorType(t, r, "invalid_request_error")
	}
	if got := getFaults(t); !reflect.DeepEqual(got, want) {
		t.Errorf("faults after rejected PUTs = %+v, want %+v", got, want)
	}

	// An explicit empty key turns authentication off.
	wantStatus(t, call(t, ts, http.MethodPut, "/_faults", `{"apiKey":""}`), http.StatusOK)
	wantStatus(t, charge(t, ts, "key-1", validBody), http.StatusOK)
	// And a key sent in the body is required from then on.
	wantStatus(t, call(t, ts, http.MethodPut, "/_faults", `{"apiKey":"sk_new"}`), http.StatusOK)
	wantStatus(t, charge(t, ts, "key-2", validBody, auth...), http.StatusUnauthorized)
	wantStatus(t, charge(t, ts, "key-2", validBody, "Authorization", "Bearer sk_new"), http.StatusOK)

	wantStats(t, psp, fakepsp.Stats{
		Requests: 5, DistinctKeys: 2, ChargesCreated: 2,
		Unauthorized: 2, InjectedFailures: 1, OrdersChargedTwice: 1,
	})
}

func TestSeedReplaysFaults(t *testing.T) {
	t.Parallel()
	opts := fakepsp.Options{FailRate: 0.5, ResetRate: 0.5, Seed: 42}
	transport := &http.Transport{DisableKeepAlives: true} // see TestResetAfterCharging
	t.Cleanup(transport.CloseIdleConnections)
	client := &http.Client{Transport: transport}

	// outcomes sends distinct keys one at a time and records what happened.
	outcomes := func(t *testing.T, ts *httptest.Server, run string) []int {
		t.Helper()
		var out []int
		for i := range 64 {
			req, err := newChargeRequest(t.Context(), ts.URL, fmt.Sprint(run, i), chargeBody(int64(i+1), 45, 1999, "EUR"))
			if err != nil {
				t.Fatal(err)
			}
			r, err := do(client, req)
			if err != nil {
				out = append(out, 0) // reset
				continue
			}
			out = append(out, r.status)
		}
		return out
	}

	psp1, ts1 := start(t, opts)
	_, ts2 := start(t, opts)
	first := outcomes(t, ts1, "a")
	if second := outcomes(t, ts2, "a"); !slices.Equal(first, second) {
		t.Errorf("same seed, different faults:\n %v\n %v", first, second)
	}
	for _, status := range []int{0, http.StatusOK, http.StatusServiceUnavailable} {
		if !slices.Contains(first, status) {
			t.Errorf("outcome %d never happened in %v", status, first)
		}
	}

	// SetOptions restarts the sequence.
	psp1.SetOptions(opts)
	if again := outcomes(t, ts1, "b"); !slices.Equal(first, again) {
		t.Errorf("faults after SetOptions with the same seed:\n %v\n %v", again, first)
	}
}

func TestAdminRoutes(t *testing.T) {
	t.Parallel()
	psp, ts := start(t, fakepsp.Options{})
	wantStatus(t, charge(t, ts, "key-1", validBody), http.StatusOK)
	wantStatus(t, charge(t, ts, "key-1", validBody), http.StatusOK)

	r := call(t, ts, http.MethodGet, "/_stats", "")
	wantStatus(t, r, http.StatusOK)
	if got, want := decode[fakepsp.Stats](t, r.body), psp.Stats(); got != want {
		t.Errorf("GET /_stats = %+v, want %+v", got, want)
	}

	wantStatus(t, call(t, ts, http.MethodGet, "/healthz", ""), http.StatusOK)
	psp.SetDown(true)
	wantStatus(t, call(t, ts, http.MethodGet, "/healthz", ""), http.StatusOK)
	wantStatus(t, call(t, ts, http.MethodGet, "/v1/charges", ""), http.StatusOK)

	wantStatus(t, call(t, ts, http.MethodDelete, "/v1/charges", ""), http.StatusMethodNotAllowed)
	wantStatus(t, call(t, ts, http.MethodGet, "/_down", ""), http.StatusMethodNotAllowed)
	wantStatus(t, call(t, ts, http.MethodGet, "/v1/refunds", ""), http.StatusNotFound)
}

// RateLimit answers 429 with Retry-After: 1 beyond its number of requests
// a second, stores nothing for them, and PeakPerSecond tells the most that
// arrived within any second.
func TestRateLimit(t *testing.T) {
	psp := fakepsp.New(fakepsp.Options{RateLimit: 3})
	srv := httptest.NewServer(psp)
	t.Cleanup(srv.Close)
	var limited int
	for i := range 5 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges",
			strings.NewReader(fmt.Sprintf(`{"orderId":%d,"customerId":2,"amount":100,"currency":"EUR"}`, i+1)))
		req.Header.Set("Idempotency-Key", fmt.Sprintf("key-%d", i))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			limited++
			if resp.Header.Get("Retry-After") != "1" {
				t.Errorf("429 without Retry-After: 1")
			}
		}
	}
	if limited != 2 {
		t.Errorf("%d of 5 requests within a second limited, want 2", limited)
	}
	wantStats(t, psp, fakepsp.Stats{Requests: 5, DistinctKeys: 3, ChargesCreated: 3, RateLimited: 2, PeakPerSecond: 5})
}

// clientFrom returns an HTTP client whose connections leave from the local
// address ip: Linux routes all of 127.0.0.0/8 to the loopback device, so
// each address is a client of its own.
func clientFrom(ip string) *http.Client {
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext}}
}

// Requests are counted per client address, whatever their answer, with the
// arrival of the last one, in Clients and in GET /_stats: the chaos suite
// tells from them which replica still charges.
func TestClients_CountsRequestsPerClientAddress(t *testing.T) {
	t.Parallel()
	psp, ts := start(t, fakepsp.Options{})
	send := func(ip, key, body string) int {
		t.Helper()
		req, err := newChargeRequest(t.Context(), ts.URL, key, body)
		if err != nil {
			t.Fatal(err)
		}
		r, err := do(clientFrom(ip), req)
		if err != nil {
			t.Fatalf("POST /v1/charges from %s: %v", ip, err)
		}
		return r.status
	}
	before := time.Now()
	send("127.0.0.1", "key-1", validBody)
	send("127.0.0.1", "key-1", validBody) // a replay counts too
	psp.SetDown(true)
	if got := send("127.0.0.2", "key-2", validBody); got != http.StatusServiceUnavailable {
		t.Fatalf("status while down = %d, want 503", got)
	}
	psp.SetDown(false)
	after := time.Now()

	clients := psp.Clients()
	if len(clients) != 2 || clients["127.0.0.1"].Requests != 2 || clients["127.0.0.2"].Requests != 1 {
		t.Fatalf("clients = %+v, want 2 requests from 127.0.0.1 and 1 from 127.0.0.2", clients)
	}
	for ip, c := range clients {
		if c.Last.Before(before) || c.Last.After(after) {
			t.Errorf("%s: last request at %s, want within [%s, %s]", ip, c.Last, before, after)
		}
	}
	if !clients["127.0.0.1"].Last.Before(clients["127.0.0.2"].Last) {
		t.Errorf("last request of 127.0.0.1 (%s) is not before the one of 127.0.0.2 (%s)", clients["127.0.0.1"].Last, clients["127.0.0.2"].Last)
	}

	r := call(t, ts, http.MethodGet, "/_stats", "")
	wantStatus(t, r, http.StatusOK)
	got := decode[struct {
		fakepsp.Stats
		Clients map[string]fakepsp.ClientStats `json:"clients"`
	}](t, r.body)
	if got.Stats != psp.Stats() {
		t.Errorf("GET /_stats counters = %+v, want %+v", got.Stats, psp.Stats())
	}
	if len(got.Clients) != 2 || got.Clients["127.0.0.2"].Requests != 1 || !got.Clients["127.0.0.2"].Last.Equal(clients["127.0.0.2"].Last) {
		t.Errorf("GET /_stats clients = %+v, want %+v", got.Clients, clients)
	}
}
