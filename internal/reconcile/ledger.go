package reconcile

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// HTTPLedger lists charges through the provider's
// GET {base}/v1/charges?created_gte=&created_lt= API.
//
// It follows Stripe-style pages: while an answer says "has_more": true, it
// asks again with starting_after=<the last charge's id>. The fake provider
// answers everything at once and never says has_more, which ends the loop
// after one request.
type HTTPLedger struct {
	url      string
	apiKey   string
	timeout  time.Duration
	pageSize int
	http     *http.Client
}

// HTTPConfig configures an HTTPLedger.
type HTTPConfig struct {
	BaseURL string        // PAYMENT_BASE_URL
	APIKey  string        // PAYMENT_API_KEY: sent as a bearer token, never logged
	Timeout time.Duration // per request (PAYMENT_TIMEOUT)
	// PageSize is sent as limit; 0 means 100, Stripe's maximum.
	PageSize int
}

// NewHTTPLedger returns a ledger reading the provider at cfg.BaseURL.
func NewHTTPLedger(cfg HTTPConfig) *HTTPLedger {
	if cfg.PageSize <= 0 {
		cfg.PageSize = 100
	}
	return &HTTPLedger{
		url:      strings.TrimRight(cfg.BaseURL, "/") + "/v1/charges",
		apiKey:   cfg.APIKey,
		timeout:  cfg.Timeout,
		pageSize: cfg.PageSize,
		// A redirect could carry the bearer token to another host.
		http: &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
	}
}

// page is one answer of the list API.
type page struct {
	Data    []Charge `json:"data"`
	HasMore bool     `json:"has_more"`
}

// maxPages bounds the pages of one listing, so that a provider that keeps
// saying has_more cannot keep reconcile running forever.
const maxPages = 1_000_000

// maxPageBytes bounds one answer; a page of 100 charges is ~30 KB.
const maxPageBytes = 32 << 20

// Charges returns every charge the provider created in [from, to).
func (l *HTTPLedger) Charges(ctx context.Context, from, to time.Time) ([]Charge, error) {
	var out []Charge
	seen := map[string]bool{}
	after := ""
	for n := 0; n < maxPages; n++ {
		p, err := l.page(ctx, from, to, after)
		if err != nil {
			return nil, err
		}
		for _, c := range p.Data {
			// A provider's cursor pages are stable, but a charge seen twice
			// would be reported as two charges under one key.
			if seen[c.ID] {
				continue
			}
			seen[c.ID] = true
			c.Created = c.Created.UTC()
			out = append(out, c)
		}
		if !p.HasMore {
			return out, nil
		}
		if len(p.Data) == 0 || p.Data[len(p.Data)-1].ID == after {
			return nil, fmt.Errorf("GET %s: has_more with no new charge after %q", l.url, after)
		}
		after = p.Data[len(p.Data)-1].ID
	}
	return nil, fmt.Errorf("GET %s: more than %d pages", l.url, maxPages)
}

func (l *HTTPLedger) page(ctx context.Context, from, to time.Time, after string) (page, error) {
	q := url.Values{}
	q.Set("created_gte", from.UTC().Format(time.RFC3339Nano))
	q.Set("created_lt", to.UTC().Format(time.RFC3339Nano))
	q.Set("limit", strconv.Itoa(l.pageSize))
	if after != "" {
		q.Set("starting_after", after)
	}
	if l.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, l.url+"?"+q.Encode(), nil)
	if err != nil {
		return page{}, fmt.Errorf("GET %s: %w", l.url, err)
	}
	req.Header.Set("Accept", "application/json")
	if l.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+l.apiKey)
	}
	resp, err := l.http.Do(req)
	if err != nil {
		return page{}, fmt.Errorf("GET %s: %w", l.url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxPageBytes+1))
	if err != nil {
		return page{}, fmt.Errorf("GET %s: read answer: %w", l.url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return page{}, fmt.Errorf("GET %s: %s: %s", l.url, resp.Status, excerpt(body))
	}
	if len(body) > maxPageBytes {
		return page{}, fmt.Errorf("GET %s: answer larger than %d bytes", l.url, maxPageBytes)
	}
	var p page
	if err := json.Unmarshal(body, &p); err != nil {
		return page{}, fmt.Errorf("GET %s: decode answer: %w", l.url, err)
	}
	return p, nil
}

// excerpt shortens an error answer for a message.
func excerpt(b []byte) string {
	const n = 200
	s := strings.TrimSpace(string(b))
	if len(s) > n {
		s = s[:n] + "..."
	}
	return s
}
