package stripe

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

// listPageSize is sent as limit: Stripe's maximum.
const listPageSize = 100

// maxListPages bounds the pages of one reconciliation's listing, so that
// an answer that keeps saying has_more cannot keep it running for ever. At
// Stripe's rate limits (100 requests a second live) a day holds at most
// 8.64 million payments, 86,400 pages.
const maxListPages = 1_000_000

// Charges lists every PaymentIntent Stripe created in [from, to), for
// reconciliation: GET /v1/payment_intents?created[gte]=&created[lt]=
// (unix seconds, so from and to are taken to the second below), limit=100,
// then starting_after=<the last one's id> while has_more. Each is reported
// with the event, order and customer of its metadata, its currency in upper
// case, and status succeeded only when money moved (else its own status).
func (p *Protocol) Charges(ctx context.Context, do payment.Doer, from, to time.Time) ([]payment.ListedCharge, error) {
	q := url.Values{
		"created[gte]": {strconv.FormatInt(from.Unix(), 10)},
		"created[lt]":  {strconv.FormatInt(to.Unix(), 10)},
	}
	var out []payment.ListedCharge
	seen := map[string]bool{}
	err := p.list(ctx, do, q, maxListPages, func(pi paymentIntent) bool {
		// A cursor's pages do not overlap, but a payment seen twice would
		// be reported as two payments under one key.
		if !seen[pi.ID] {
			seen[pi.ID] = true
			out = append(out, listed(pi))
		}
		return false
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// listed is pi as reconciliation compares it with billing's charges.
func listed(pi paymentIntent) payment.ListedCharge {
	// Metadata billing did not write (a payment made another way) reads
	// as 0 and "": reconciliation reports it as unknown to billing.
	order, _ := strconv.ParseInt(pi.Metadata["order_id"], 10, 64)
	customer, _ := strconv.ParseInt(pi.Metadata["customer_id"], 10, 64)
	return payment.ListedCharge{
		ID:             pi.ID,
		IdempotencyKey: pi.eventID(),
		OrderID:        order,
		CustomerID:     customer,
		Amount:         pi.Amount,
		Currency:       strings.ToUpper(pi.Currency),
		// A PaymentIntent's succeeded is money moved, the contract's
		// meaning of succeeded; any other status is reported as it is.
		Status:  pi.Status,
		Created: time.Unix(pi.Created, 0).UTC(),
	}
}

// list reads GET /v1/payment_intents?q, limit=100, page after page
// (starting_after, newest first) while has_more, at most maxPages pages,
// and calls each with every PaymentIntent until it returns true.
func (p *Protocol) list(ctx context.Context, do payment.Doer, q url.Values, maxPages int, each func(paymentIntent) (stop bool)) error {
	q.Set("limit", strconv.Itoa(listPageSize))
	for range maxPages {
		var pg struct {
			Data    []paymentIntent `json:"data"`
			HasMore bool            `json:"has_more"`
		}
		if err := p.get(ctx, do, chargePath, q, &pg); err != nil {
			return err
		}
		for _, pi := range pg.Data {
			if each(pi) {
				return nil
			}
		}
		if !pg.HasMore {
			return nil
		}
		after := q.Get("starting_after")
		if len(pg.Data) == 0 || pg.Data[len(pg.Data)-1].ID == after {
			return fmt.Errorf("GET %s: has_more with no new payment after %q", chargePath, after)
		}
		q.Set("starting_after", pg.Data[len(pg.Data)-1].ID)
	}
	return fmt.Errorf("GET %s: more than %d pages", chargePath, maxPages)
}

// get reads GET {base}{path}?q, a 200's JSON, into v.
func (p *Protocol) get(ctx context.Context, do payment.Doer, path string, q url.Values, v any) error {
	u := p.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	p.authorize(req)
	resp, err := do.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	if resp.Status != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", path, resp.Status, payment.Snippet(resp.Body, p.apiKey))
	}
	if err := json.Unmarshal(resp.Body, v); err != nil {
		return fmt.Errorf("GET %s: decode answer: %w", path, err)
	}
	return nil
}
