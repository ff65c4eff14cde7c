package payment_test

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"example.com/billing/internal/metrics"
	"example.com/billing/internal/payment"
	"example.com/billing/internal/payment/contract"
)

// provider counts the charges (POST) and lookups (GET) it is sent.
type provider struct {
	charges, lookups atomic.Int64
	status           int // of every answer; 0: the usual (201, 200)
}

func (p *provider) start(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			p.lookups.Add(1)
			answer(cmp.Or(p.status, http.StatusOK), `{"data":[]}`)(w, r)
			return
		}
		p.charges.Add(1)
		answer(cmp.Or(p.status, http.StatusCreated), chargeOK)(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// within runs f and returns its error, or nil with ok false when it has
// not returned after d (it goes on in the background).
func within(d time.Duration, f func() error) (err error, ok bool) {
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err, true
	case <-time.After(d):
		return nil, false
	}
}

// While charging is paused no charge is sent: it waits, unsent, and is
// sent after the resume; lookups, which only read, go on.
func TestClient_PauseHoldsChargesNotLookups(t *testing.T) {
	t.Parallel()
	var p provider
	c, m := newClient(t, config{BaseURL: p.start(t), Config: payment.Config{MaxConcurrency: 1}})
	c.SetPaused(true)
	if !c.Paused() {
		t.Fatal("Paused() = false after SetPaused(true)")
	}
	done := make(chan error, 1)
	go func() { _, err := c.Charge(context.Background(), charge); done <- err }()
	time.Sleep(300 * time.Millisecond)
	if n := p.charges.Load(); n != 0 {
		t.Fatalf("%d charges sent while paused", n)
	}
	// The waiting charge holds no slot: the lookup gets the only one.
	if err, ok := within(2*time.Second, func() error {
		_, err := c.Resolve(context.Background(), payment.Lookup{Request: charge})
		return err
	}); !ok || err != nil {
		t.Fatalf("a lookup while paused: returned %v, err %v", ok, err)
	}
	if n := p.lookups.Load(); n != 1 {
		t.Errorf("%d lookups sent while paused, want 1", n)
	}
	c.SetPaused(false)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := p.charges.Load(); n != 1 {
		t.Errorf("%d charges sent after the resume, want 1", n)
	}
	if got := testutil.ToFloat64(m.PaymentRequests.WithLabelValues("charged")); got != 1 {
		t.Errorf("billing_payment_requests_total{result=charged} = %v, want 1", got)
	}
}

// A charge waiting for its turn (the rate's next gap) when the pause comes
// is not sent then: it waits for the resume.
func TestClient_PauseStopsAChargeWaitingForItsTurn(t *testing.T) {
	t.Parallel()
	var p provider
	c, _ := newClient(t, config{BaseURL: p.start(t), Config: payment.Config{MaxConcurrency: 4, MaxRPS: 1}})
	if _, err := c.Charge(context.Background(), charge); err != nil { // the next gap is a second away
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := c.Charge(context.Background(), charge); done <- err }()
	time.Sleep(200 * time.Millisecond)
	c.SetPaused(true)
	time.Sleep(1500 * time.Millisecond)
	if n := p.charges.Load(); n != 1 {
		t.Fatalf("%d charges sent, want only the one before the pause", n)
	}
	c.SetPaused(false)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := p.charges.Load(); n != 2 {
		t.Errorf("%d charges sent after the resume, want 2", n)
	}
}

// A caller that no longer wants its charge (its Ready refuses) is not kept
// waiting for the resume: whether it refuses when the pause holds its
// charge or later (its partition revoked, a drain), within a second.
func TestClient_PauseAsksReady(t *testing.T) {
	t.Parallel()
	var p provider
	c, _ := newClient(t, config{BaseURL: p.start(t)})
	c.SetPaused(true)
	gone := errors.New("the partition is another consumer's")
	var refuse atomic.Bool
	refuse.Store(true)
	r := charge
	r.Ready = func() error {
		if refuse.Load() {
			return gone
		}
		return nil
	}
	err, ok := within(time.Second, func() error { _, err := c.Charge(context.Background(), r); return err })
	if !ok || !errors.Is(err, payment.ErrNotSent) || !errors.Is(err, gone) {
		t.Errorf("returned %v with %v, want ErrNotSent and the caller's reason at once", ok, err)
	}

	refuse.Store(false)
	done := make(chan error, 1)
	go func() { _, err := c.Charge(context.Background(), r); done <- err }()
	time.Sleep(300 * time.Millisecond)
	refuse.Store(true)
	select {
	case err := <-done:
		if !errors.Is(err, payment.ErrNotSent) {
			t.Errorf("err = %v, want ErrNotSent", err)
		}
	case <-time.After(3 * time.Second):
		t.Error("a charge its caller gave up during the pause still waits for the resume")
	}
	if n := p.charges.Load(); n != 0 {
		t.Errorf("%d charges sent", n)
	}
}

// A pause asks Ready and never Leave: Leave is the one answer that sends
// (billing's callers then wait for the answer whatever their context
// does), asked once, when the request goes after the resume.
func TestClient_PauseAsksReadyLeaveOnlySends(t *testing.T) {
	t.Parallel()
	var p provider
	c, _ := newClient(t, config{BaseURL: p.start(t)})
	c.SetPaused(true)
	var ready, leave atomic.Int64
	r := charge
	r.Ready = func() error { ready.Add(1); return nil }
	r.Leave = func() error {
		leave.Add(1)
		if n := p.charges.Load(); n != 0 {
			t.Errorf("Leave asked after %d charges were sent, want before", n)
		}
		return nil
	}
	done := make(chan error, 1)
	go func() { _, err := c.Charge(context.Background(), r); done <- err }()
	time.Sleep(1500 * time.Millisecond) // the pause asks Ready at once and every second
	if n := ready.Load(); n < 2 {
		t.Errorf("Ready asked %d times during the pause, want at least 2", n)
	}
	if n := leave.Load(); n != 0 {
		t.Fatalf("Leave asked %d times during the pause, want 0", n)
	}
	c.SetPaused(false)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n, sent := leave.Load(), p.charges.Load(); n != 1 || sent != 1 {
		t.Errorf("after the resume: Leave asked %d times, %d charges sent; want 1 and 1", n, sent)
	}
}

// resending is the contract with a lookup that sends the payment again,
// as Adyen's does.
type resending struct{ payment.Protocol }

func (resending) ResolveResends() bool { return true }

// A lookup that sends the payment again waits while paused, as a charge.
func TestClient_PauseHoldsLookupsThatResend(t *testing.T) {
	t.Parallel()
	var p provider
	c := payment.New(resending{contract.New(p.start(t), "")}, payment.Config{Timeout: 5 * time.Second}, metrics.New(prometheus.NewRegistry()))
	t.Cleanup(c.Close)
	if !c.ResolveSends() {
		t.Fatal("ResolveSends() = false for a Resender")
	}
	c.SetPaused(true)
	if _, ok := within(500*time.Millisecond, func() error {
		_, err := c.Resolve(context.Background(), payment.Lookup{Request: charge})
		return err
	}); ok {
		t.Fatal("a lookup that resends returned while paused")
	}
	if n := p.lookups.Load(); n != 0 {
		t.Fatalf("%d lookups sent while paused", n)
	}
	c.SetPaused(false)
	time.Sleep(200 * time.Millisecond)
	if n := p.lookups.Load(); n != 1 {
		t.Errorf("%d lookups sent after the resume, want 1", n)
	}
}

// With a shared account budget the client sends nothing before it has a
// share, paces itself to its share, and sends nothing once its share's
// lease lapsed.
func TestClient_AccountShare(t *testing.T) {
	t.Parallel()
	var p provider
	c, _ := newClient(t, config{BaseURL: p.start(t), Config: payment.Config{MaxConcurrency: 8, AccountShared: true}})
	charged := func(d time.Duration) bool {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		_, err := c.Charge(ctx, charge)
		return err == nil
	}
	if charged(300 * time.Millisecond) {
		t.Fatal("charged without a share")
	}
	c.SetAccountShare(10, time.Now().Add(time.Minute))
	began := time.Now()
	for range 6 {
		if !charged(2 * time.Second) {
			t.Fatal("not charged with a share")
		}
	}
	// 10/s paced over rpsMargin: 5 gaps of 105 ms.
	if took := time.Since(began); took < 500*time.Millisecond {
		t.Errorf("6 charges at a share of 10/s took %s, want at least 0.5s", took)
	}
	c.SetAccountShare(10, time.Now().Add(-time.Millisecond))
	if charged(300 * time.Millisecond) {
		t.Error("charged with a lapsed share")
	}
	if n := p.charges.Load(); n != 6 {
		t.Errorf("%d charges sent, want 6", n)
	}
}

// Every 429 counts, a lookup's too: what the fleet's budget shrinks by.
func TestClient_RateLimitedCountsEvery429(t *testing.T) {
	t.Parallel()
	p := provider{status: http.StatusTooManyRequests}
	c, m := newClient(t, config{BaseURL: p.start(t)})
	_, _ = c.Charge(context.Background(), charge)
	_, _ = c.Resolve(context.Background(), payment.Lookup{Request: charge})
	if got := c.RateLimited(); got != 2 {
		t.Errorf("RateLimited() = %d, want 2", got)
	}
	if got := testutil.ToFloat64(m.PaymentRateLimited); got != 2 {
		t.Errorf("billing_payment_rate_limited_total = %v, want 2", got)
	}
}
