package stripe

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"example.com/billing/internal/payment"
)

// createdSlack is how much earlier than billing recorded an attempt a
// lookup's list starts: Stripe created the PaymentIntent after that, by
// Stripe's clock, which may be behind billing's database's. Missing the
// payment would report no payment for one that exists; an hour more of one
// customer's payments costs a page at most.
const createdSlack = time.Hour

// maxLookupPages bounds the pages of a lookup's list, one customer's
// payments since the attempt: past it the lookup has no verdict.
const maxLookupPages = 100

// searchQuoting escapes a value for a quoted string of Stripe's search
// query language.
var searchQuoting = strings.NewReplacer(`\`, `\\`, `'`, `\'`)

// Resolve asks Stripe what became of the attempt l.
//
// With its PaymentIntent's id: GET /v1/payment_intents/{id}. Without it:
// GET /v1/payment_intents/search?query=metadata['event_id']:'<key>', then,
// unless that found a succeeded one, the list GET
// /v1/payment_intents?customer=<cus_>&created[gte]=<recorded - 1h>&limit=100
// page after page. Search is eventually consistent (about a minute behind),
// so its empty answer is no verdict; the list is consistent. Unknown when
// neither finds a PaymentIntent whose metadata names the attempt's event.
//
// One key creates one PaymentIntent, so several for one event cannot come
// from billing; should there be some (created by hand with the event's
// metadata), the most telling is returned: a succeeded one, else one still
// processing (money may still move), else a decline.
func (p *Protocol) Resolve(ctx context.Context, do payment.Doer, l payment.Lookup) (payment.Outcome, error) {
	if l.Ref != "" {
		path := chargePath + "/" + url.PathEscape(l.Ref)
		var pi paymentIntent
		if err := p.get(ctx, do, path, nil, &pi); err != nil {
			return payment.Outcome{}, err
		}
		if pi.ID == "" || pi.Status == "" {
			return payment.Outcome{}, fmt.Errorf("GET %s: the answer is no PaymentIntent", path)
		}
		return pi.outcome(p.apiKey), nil
	}

	if l.IdempotencyKey == "" {
		// Every PaymentIntent billing did not create would match.
		return payment.Outcome{}, errors.New("stripe lookup: neither a PaymentIntent id nor an event id")
	}
	f := finding{key: l.IdempotencyKey, secret: p.apiKey}
	var found struct {
		Data []paymentIntent `json:"data"`
	}
	q := url.Values{"query": {"metadata['event_id']:'" + searchQuoting.Replace(l.IdempotencyKey) + "'"}}
	if err := p.get(ctx, do, chargePath+"/search", q, &found); err != nil {
		return payment.Outcome{}, err
	}
	for _, pi := range found.Data {
		f.add(pi)
	}
	if f.best.Kind == payment.Succeeded {
		return f.best, nil
	}

	q = url.Values{}
	if l.CustomerRef != "" {
		q.Set("customer", l.CustomerRef)
	}
	if !l.Created.IsZero() {
		q.Set("created[gte]", strconv.FormatInt(l.Created.Add(-createdSlack).Unix(), 10))
	}
	err := p.list(ctx, do, q, maxLookupPages, func(pi paymentIntent) bool {
		f.add(pi)
		return f.best.Kind == payment.Succeeded
	})
	if err != nil {
		return payment.Outcome{}, err
	}
	return f.best, nil
}

// finding keeps the most telling outcome of the PaymentIntents found for
// one event; Unknown until one is found.
type finding struct {
	key    string // the event id
	secret string // masked in details
	best   payment.Outcome
}

// add considers pi, when its metadata names the event.
func (f *finding) add(pi paymentIntent) {
	if pi.eventID() != f.key {
		return
	}
	if out := pi.outcome(f.secret); rank(out.Kind) > rank(f.best.Kind) {
		f.best = out
	}
}

// rank orders what a lookup may find by how much it tells: money moved,
// money that may still move, none.
func rank(k payment.Kind) int {
	switch k {
	case payment.Succeeded:
		return 3
	case payment.InProgress:
		return 2
	case payment.Declined:
		return 1
	}
	return 0
}
