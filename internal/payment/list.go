package payment

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// ListedCharge is a charge as the provider's list API returns it: its side
// of a reconciliation.
type ListedCharge struct {
	ID             string    `json:"id"`
	IdempotencyKey string    `json:"idempotencyKey,omitempty"`
	OrderID        int64     `json:"orderId"`
	CustomerID     int64     `json:"customerId"`
	Amount         int64     `json:"amount"` // minor units
	Currency       string    `json:"currency"`
	Status         string    `json:"status"`
	Created        time.Time `json:"created"`
}

// page is one answer of the list API.
type page struct {
	Data    []ListedCharge `json:"data"`
	HasMore bool           `json:"has_more"`
}

// listPageSize is sent as limit: Stripe's maximum.
const listPageSize = 100

// maxPages bounds the pages of one listing, so that a provider that keeps
// saying has_more cannot keep a reconciliation running for ever.
const maxPages = 1_000_000

// maxPageBytes bounds one answer; a page of 100 charges is ~30 KB.
const maxPageBytes = 32 << 20

// Charges lists every charge the provider created in [from, to), through
// GET {base}/v1/charges?created_gte=&created_lt=. It follows Stripe-style
// pages: while an answer says "has_more": true it asks again with
// starting_after=<the last charge's id>. Listing is for reconciliation, an
// operator's batch job: it takes none of the charging requests' slots or
// rate budget, and no circuit breaker stands in its way.
func (c *Client) Charges(ctx context.Context, from, to time.Time) ([]ListedCharge, error) {
	var out []ListedCharge
	seen := map[string]bool{}
	after := ""
	for n := 0; n < maxPages; n++ {
		p, err := c.page(ctx, from, to, after)
		if err != nil {
			return nil, err
		}
		for _, ch := range p.Data {
			// A provider's cursor pages are stable, but a charge seen twice
			// would be reported as two charges under one key.
			if seen[ch.ID] {
				continue
			}
			seen[ch.ID] = true
			ch.Created = ch.Created.UTC()
			out = append(out, ch)
		}
		if !p.HasMore {
			return out, nil
		}
		if len(p.Data) == 0 || p.Data[len(p.Data)-1].ID == after {
			return nil, fmt.Errorf("GET %s: has_more with no new charge after %q", c.url, after)
		}
		after = p.Data[len(p.Data)-1].ID
	}
	return nil, fmt.Errorf("GET %s: more than %d pages", c.url, maxPages)
}

func (c *Client) page(ctx context.Context, from, to time.Time, after string) (page, error) {
	q := url.Values{}
	q.Set("created_gte", from.UTC().Format(time.RFC3339Nano))
	q.Set("created_lt", to.UTC().Format(time.RFC3339Nano))
	q.Set("limit", strconv.Itoa(listPageSize))
	if after != "" {
		q.Set("starting_after", after)
	}
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url+"?"+q.Encode(), nil)
	if err != nil {
		return page{}, fmt.Errorf("GET %s: %w", c.url, err)
	}
	req.Header.Set("Accept", "application/json")
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return page{}, fmt.Errorf("GET %s: %w", c.url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxPageBytes+1))
	if err != nil {
		return page{}, fmt.Errorf("GET %s: read answer: %w", c.url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return page{}, fmt.Errorf("GET %s: %s: %s", c.url, resp.Status, c.snippet(body))
	}
	if len(body) > maxPageBytes {
		return page{}, fmt.Errorf("GET %s: answer larger than %d bytes", c.url, maxPageBytes)
	}
	var p page
	if err := json.Unmarshal(body, &p); err != nil {
		return page{}, fmt.Errorf("GET %s: decode answer: %w", c.url, err)
	}
	return p, nil
}
