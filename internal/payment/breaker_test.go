package payment_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"example.com/billing/internal/payment"
)

// A provider that is down gets a handful of requests from a process, not
// one per retry of every batch; once it is back, charges go through again.
func TestCharge_BreakerSparesAProviderThatIsDown(t *testing.T) {
	var down atomic.Bool
	var requests atomic.Int64
	down.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte(chargeOK))
	}))
	defer srv.Close()
	c, m := newClient(t, config{BaseURL: srv.URL, Config: payment.Config{MaxConcurrency: 4}})
	req := payment.Request{IdempotencyKey: eventID, OrderID: 123, CustomerID: 45, Amount: 1999, Currency: "EUR"}

	for range 100 {
		_, err := c.Charge(context.Background(), req)
		var te *payment.TransientError
		if !errors.As(err, &te) {
			t.Fatalf("a charge to a provider that is down = %v, want a transient error", err)
		}
	}
	if got := requests.Load(); got > 6 {
		t.Errorf("100 charges sent %d requests to a provider that is down, want the breaker to stop at 5 (+1 probe)", got)
	}
	if got := testutil.ToFloat64(m.PaymentRequests.WithLabelValues("circuit_open")); got < 90 {
		t.Errorf("circuit_open results = %v, want the rest of the 100", got)
	}

	down.Store(false)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := c.Charge(context.Background(), req)
		if err == nil {
			break
		}
		if !errors.Is(err, payment.ErrCircuitOpen) {
			t.Fatalf("charge after recovery = %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the breaker never let a probe through after the provider came back")
		}
		time.Sleep(20 * time.Millisecond)
	}
	before := requests.Load()
	for range 10 {
		if _, err := c.Charge(context.Background(), req); err != nil {
			t.Fatalf("closed breaker: %v", err)
		}
	}
	if requests.Load()-before != 10 {
		t.Errorf("after recovery every charge must reach the provider")
	}
}

// Answers about the request itself (declined, rejected) are not outages.
func TestCharge_BreakerIgnoresBusinessAnswers(t *testing.T) {
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.WriteHeader(http.StatusPaymentRequired)
	}))
	defer srv.Close()
	c, _ := newClient(t, config{BaseURL: srv.URL, Config: payment.Config{MaxConcurrency: 4}})
	for range 20 {
		if out, err := c.Charge(context.Background(), payment.Request{IdempotencyKey: eventID, OrderID: 1, CustomerID: 1, Amount: 1, Currency: "EUR"}); err != nil || out.Kind != payment.Declined {
			t.Fatalf("got %v, want declined", err)
		}
	}
	if requests.Load() != 20 {
		t.Errorf("%d of 20 declines reached the provider", requests.Load())
	}
}
