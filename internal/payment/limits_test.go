package payment_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"example.com/billing/internal/payment"
)

// The whole client, not each caller, stays within MaxConcurrency requests in
// flight; callers beyond it wait for a slot.
func TestClient_MaxConcurrencyBoundsRequestsInFlight(t *testing.T) {
	var inFlight, peak atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(30 * time.Millisecond)
		inFlight.Add(-1)
		answer(200, chargeOK)(w, r)
	}))
	t.Cleanup(srv.Close)
	c, _ := newClient(t, config{BaseURL: srv.URL, Config: payment.Config{MaxConcurrency: 3}})
	var wg sync.WaitGroup
	for range 24 {
		wg.Go(func() {
			if _, err := c.Charge(context.Background(), charge); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if p := peak.Load(); p != 3 {
		t.Errorf("peak requests in flight = %d, want 3", p)
	}
}

// MaxRPS is a token bucket for the whole client, with a burst of one: in
// any one-second window the provider sees at most MaxRPS requests (one more
// is tolerated for arrival jitter: requests sent 50 ms apart can arrive
// closer).
func TestClient_MaxRPSBoundsRequestsPerSecond(t *testing.T) {
	var mu sync.Mutex
	var arrivals []time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrivals = append(arrivals, time.Now())
		mu.Unlock()
		answer(200, chargeOK)(w, r)
	}))
	t.Cleanup(srv.Close)
	c, _ := newClient(t, config{BaseURL: srv.URL, Config: payment.Config{MaxConcurrency: 50, MaxRPS: 20}})
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() { _, _ = c.Charge(context.Background(), charge) })
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for i := range arrivals {
		n := 0
		for _, a := range arrivals[i:] {
			if a.Sub(arrivals[i]) < time.Second {
				n++
			}
		}
		if n > 20+1 {
			t.Fatalf("%d requests within one second from arrival %d, want at most 20", n, i)
		}
	}
	if first, last := arrivals[0], arrivals[len(arrivals)-1]; last.Sub(first) < 2400*time.Millisecond {
		t.Errorf("50 requests at 20/s took %s, want at least 2.45s", last.Sub(first))
	}
}

// A 429 with Retry-After holds every caller back, not only the one that met
// it, and the wait ends with the caller's context.
func TestClient_RetryAfterOf429PausesTheWholeClient(t *testing.T) {
	var calls atomic.Int64
	var second atomic.Int64 // UnixNano of the first request after the 429
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			answer(http.StatusTooManyRequests, `{"error":"slow down"}`, "Retry-After", "1")(w, r)
			return
		}
		second.CompareAndSwap(0, time.Now().UnixNano())
		answer(200, chargeOK)(w, r)
	}))
	t.Cleanup(srv.Close)
	c, _ := newClient(t, config{BaseURL: srv.URL, Config: payment.Config{MaxConcurrency: 8}})
	limited := time.Now()
	if _, err := c.Charge(context.Background(), charge); err == nil {
		t.Fatal("the 429 was not an error")
	}
	// Another caller, which never met the 429, waits too.
	if _, err := c.Charge(context.Background(), charge); err != nil {
		t.Fatal(err)
	}
	if waited := time.Unix(0, second.Load()).Sub(limited); waited < 900*time.Millisecond {
		t.Errorf("the next request went out %s after the 429, want after its Retry-After of 1s", waited)
	}
	calls.Store(0)
	second.Store(0)
	if _, err := c.Charge(context.Background(), charge); err == nil {
		t.Fatal("the second 429 was not an error")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := c.Charge(ctx, charge); err == nil {
		t.Error("a caller whose context ends during the pause got through")
	}
	if second.Load() != 0 {
		t.Error("a request was sent during the pause")
	}
}
