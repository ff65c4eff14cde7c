package stripe_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	"example.com/billing/internal/payment/stripe"
)

// pi is a PaymentIntent as Stripe's API writes it.
type pi struct {
	ID               string            `json:"id"`
	Object           string            `json:"object"`
	Status           string            `json:"status"`
	Amount           int64             `json:"amount"`
	Currency         string            `json:"currency"`
	Created          int64             `json:"created"`
	Customer         string            `json:"customer,omitempty"`
	Metadata         map[string]string `json:"metadata"`
	LastPaymentError map[string]string `json:"last_payment_error,omitempty"`
}

// fakeStripe answers the lookups and listings of PaymentIntents as Stripe
// does, from what a test put in it, and records what it was asked.
type fakeStripe struct {
	t        *testing.T
	srv      *httptest.Server
	search   []pi // what search finds (it lags: a test leaves out what it has not indexed yet)
	all      []pi // what the list holds, newest first
	pageSize int  // the list's pages; 0: the limit asked for

	mu       sync.Mutex
	requests []*url.URL
}

func newFakeStripe(t *testing.T) *fakeStripe {
	t.Helper()
	f := &fakeStripe{t: t}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

// asked returns the requests' paths and queries, decoded.
func (f *fakeStripe) asked() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, u := range f.requests {
		q, _ := url.QueryUnescape(u.RawQuery)
		out = append(out, strings.TrimSuffix(u.Path+"?"+q, "?"))
	}
	return out
}

func (f *fakeStripe) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.requests = append(f.requests, r.URL)
	f.mu.Unlock()
	if auth := r.Header.Get("Authorization"); auth != "Bearer "+apiKey {
		// Stripe masks a wrong key in its answer; a proxy may not.
		w.WriteHeader(http.StatusUnauthorized)
		f.write(w, map[string]any{"error": map[string]string{"type": "invalid_request_error", "message": "Invalid API Key provided: " + auth}})
		return
	}
	if r.Method != http.MethodGet || r.Header.Get("Stripe-Version") != stripe.APIVersion {
		f.t.Errorf("%s %s with Stripe-Version %q", r.Method, r.URL, r.Header.Get("Stripe-Version"))
	}
	q := r.URL.Query()
	switch path := r.URL.Path; {
	case path == "/v1/payment_intents/search":
		f.write(w, map[string]any{"object": "search_result", "data": f.matching(q.Get("query")), "has_more": false})
	case path == "/v1/payment_intents":
		f.list(w, q)
	case strings.HasPrefix(path, "/v1/payment_intents/"):
		id := strings.TrimPrefix(path, "/v1/payment_intents/")
		for _, p := range f.all {
			if p.ID == id {
				f.write(w, p)
				return
			}
		}
		w.WriteHeader(http.StatusNotFound)
		f.write(w, map[string]any{"error": map[string]string{"type": "invalid_request_error", "code": "resource_missing", "message": "No such payment_intent: '" + id + "'"}})
	default:
		http.NotFound(w, r)
	}
}

// matching is what search finds for a query metadata['event_id']:'<id>'.
func (f *fakeStripe) matching(query string) []pi {
	id, ok := strings.CutPrefix(query, "metadata['event_id']:'")
	id, ok2 := strings.CutSuffix(id, "'")
	if !ok || !ok2 {
		f.t.Errorf("search query %q", query)
	}
	var out []pi
	for _, p := range f.search {
		if p.Metadata["event_id"] == id {
			out = append(out, p)
		}
	}
	return out
}

// list serves GET /v1/payment_intents: customer, created[gte], created[lt]
// filter; limit and starting_after page.
func (f *fakeStripe) list(w http.ResponseWriter, q url.Values) {
	limit, err := strconv.Atoi(q.Get("limit"))
	if err != nil || limit < 1 || limit > 100 {
		http.Error(w, `{"error":{"type":"invalid_request_error","message":"limit"}}`, http.StatusBadRequest)
		return
	}
	size := limit
	if f.pageSize > 0 {
		size = f.pageSize
	}
	bound := func(name string) (int64, bool) {
		v := q.Get(name)
		if v == "" {
			return 0, false
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			f.t.Errorf("%s=%q is not unix seconds", name, v)
		}
		return n, true
	}
	gte, hasGte := bound("created[gte]")
	lt, hasLt := bound("created[lt]")
	var match []pi
	for _, p := range f.all {
		if (q.Get("customer") == "" || p.Customer == q.Get("customer")) &&
			(!hasGte || p.Created >= gte) && (!hasLt || p.Created < lt) {
			match = append(match, p)
		}
	}
	i := 0
	if after := q.Get("starting_after"); after != "" {
		for i < len(match) && match[i].ID != after {
			i++
		}
		i++
	}
	i = min(i, len(match))
	end := min(i+size, len(match))
	f.write(w, map[string]any{"object": "list", "url": "/v1/payment_intents", "data": match[i:end], "has_more": end < len(match)})
}

func (f *fakeStripe) write(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(v); err != nil {
		f.t.Error(err)
	}
}
