package contract

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"example.com/billing/internal/payment"
)

// page is one answer of the list API.
type page struct {
	Data    []payment.ListedCharge `json:"data"`
	HasMore bool                   `json:"has_more"`
}

// listPageSize is sent as limit: Stripe's maximum, which the contract
// follows.
const listPageSize = 100

// maxPages bounds the pages of one listing, so that a provider that keeps
// saying has_more cannot keep a reconciliation running for ever.
const maxPages = 1_000_000

// Charges lists every charge the provider created in [from, to), through
// GET {base}/v1/charges?created_gte=&created_lt=. It follows Stripe-style
// pages: while an answer says "has_more": true it asks again with
// starting_after=<the last charge's id>.
func (p *Protocol) Charges(ctx context.Context, do payment.Doer, from, to time.Time) ([]payment.ListedCharge, error) {
	var out []payment.ListedCharge
	seen := map[string]bool{}
	after := ""
	for n := 0; n < maxPages; n++ {
		pg, err := p.page(ctx, do, from, to, after)
		if err != nil {
			return nil, err
		}
		for _, ch := range pg.Data {
			// A provider's cursor pages are stable, but a charge seen twice
			// would be reported as two charges under one key.
			if seen[ch.ID] {
				continue
			}
			seen[ch.ID] = true
			ch.Created = ch.Created.UTC()
			ch.Currency = strings.ToUpper(ch.Currency)
			out = append(out, ch)
		}
		if !pg.HasMore {
			return out, nil
		}
		if len(pg.Data) == 0 || pg.Data[len(pg.Data)-1].ID == after {
			return nil, fmt.Errorf("GET %s: has_more with no new charge after %q", p.charges, after)
		}
		after = pg.Data[len(pg.Data)-1].ID
	}
	return nil, fmt.Errorf("GET %s: more than %d pages", p.charges, maxPages)
}

func (p *Protocol) page(ctx context.Context, do payment.Doer, from, to time.Time, after string) (page, error) {
	q := url.Values{}
	q.Set("created_gte", from.UTC().Format(time.RFC3339Nano))
	q.Set("created_lt", to.UTC().Format(time.RFC3339Nano))
	q.Set("limit", strconv.Itoa(listPageSize))
	if after != "" {
		q.Set("starting_after", after)
	}
	var pg page
	if err := p.get(ctx, do, q, &pg); err != nil {
		return page{}, err
	}
	return pg, nil
}

// get reads GET {base}/v1/charges?q into v.
func (p *Protocol) get(ctx context.Context, do payment.Doer, q url.Values, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.charges+"?"+q.Encode(), nil)
	if err != nil {
		return fmt.Errorf("GET %s: %w", p.charges, err)
	}
	req.Header.Set("Accept", "application/json")
	p.authorize(req)
	resp, err := do.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", p.charges, err)
	}
	if resp.Status != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", p.charges, resp.Status, payment.Snippet(resp.Body, p.apiKey))
	}
	if err := json.Unmarshal(resp.Body, v); err != nil {
		return fmt.Errorf("GET %s: decode answer: %w", p.charges, err)
	}
	return nil
}
