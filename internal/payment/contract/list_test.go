package contract_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"example.com/billing/internal/metrics"
	"example.com/billing/internal/payment"
	"example.com/billing/internal/payment/contract"
)

var (
	listFrom = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	listTo   = listFrom.Add(24 * time.Hour)
)

// pagingProvider serves charges Stripe-style, size per page, newest first.
func pagingProvider(t *testing.T, charges []payment.ListedCharge, size int, requests *atomic.Int32) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if r.Header.Get("Authorization") != "Bearer k" {
			http.Error(rw, `{"error":{"type":"authentication_error"}}`, http.StatusUnauthorized)
			return
		}
		q := r.URL.Query()
		if q.Get("created_gte") == "" || q.Get("created_lt") == "" {
			http.Error(rw, "window missing", http.StatusBadRequest)
			return
		}
		if q.Get("limit") != strconv.Itoa(size) {
			http.Error(rw, "limit "+q.Get("limit"), http.StatusBadRequest)
			return
		}
		i := 0
		if after := q.Get("starting_after"); after != "" {
			for i < len(charges) && charges[i].ID != after {
				i++
			}
			i++
		}
		end := min(i+size, len(charges))
		var b bytes.Buffer
		_ = json.NewEncoder(&b).Encode(map[string]any{"object": "list", "data": charges[i:end], "has_more": end < len(charges)})
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write(b.Bytes())
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestCharges_FollowsPages(t *testing.T) {
	var charges []payment.ListedCharge
	for i := range 250 {
		charges = append(charges, payment.ListedCharge{ID: fmt.Sprintf("ch_%d", i), IdempotencyKey: fmt.Sprintf("k%d", i), Amount: 1, Currency: "EUR", Status: "succeeded", Created: listFrom.Add(12 * time.Hour)})
	}
	var requests atomic.Int32
	srv := pagingProvider(t, charges, 100, &requests)
	l, _ := newClient(t, srv.URL+"/", "k", 0)
	got, err := l.Charges(context.Background(), listFrom, listTo)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(charges) || requests.Load() != 3 {
		t.Errorf("got %d charges in %d requests, want %d in 3 pages of 100", len(got), requests.Load(), len(charges))
	}
}

func TestCharges_Errors(t *testing.T) {
	var requests atomic.Int32
	srv := pagingProvider(t, nil, 100, &requests)
	l, _ := newClient(t, srv.URL, "wrong", 0)
	if _, err := l.Charges(context.Background(), listFrom, listTo); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("wrong key: err = %v, want the 401", err)
	}

	// has_more without a page would loop forever.
	stuck := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		_, _ = rw.Write([]byte(`{"data":[],"has_more":true}`))
	}))
	t.Cleanup(stuck.Close)
	l, _ = newClient(t, stuck.URL, "", 0)
	if _, err := l.Charges(context.Background(), listFrom, listTo); err == nil {
		t.Error("has_more with an empty page was accepted")
	}

	slow := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}))
	t.Cleanup(slow.Close)
	l, _ = newClient(t, slow.URL, "", 50*time.Millisecond)
	if _, err := l.Charges(context.Background(), listFrom, listTo); err == nil {
		t.Error("a provider that does not answer did not time out")
	}
}

// newClient returns a client of the contract at base.
func newClient(t *testing.T, base, apiKey string, timeout time.Duration) (*payment.Client, *metrics.Metrics) {
	t.Helper()
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	m := metrics.New(prometheus.NewRegistry())
	c := payment.New(contract.New(base, apiKey), payment.Config{Timeout: timeout}, m)
	t.Cleanup(c.Close)
	return c, m
}
