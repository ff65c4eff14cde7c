package stripe_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"example.com/billing/internal/payment"
)

// recorded is when billing recorded the attempt the lookups are about.
var recorded = time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)

// ours is the PaymentIntent billing's charge of eventID created.
func ours(id, status string) pi {
	return pi{ID: id, Object: "payment_intent", Status: status, Amount: 1999, Currency: "eur", Created: recorded.Unix() + 1,
		Customer: "cus_123", Metadata: map[string]string{"event_id": eventID, "order_id": "123", "customer_id": "45"}}
}

// others are n PaymentIntents of the same customer for other events.
func others(n int) []pi {
	var out []pi
	for i := range n {
		out = append(out, pi{ID: fmt.Sprintf("pi_other%d", i), Object: "payment_intent", Status: "succeeded", Amount: 500, Currency: "eur",
			Created: recorded.Unix() + 2, Customer: "cus_123", Metadata: map[string]string{"event_id": fmt.Sprintf("other-%d", i)}})
	}
	return out
}

func TestResolve(t *testing.T) {
	lookup := payment.Lookup{Request: charge, Created: recorded}
	byRef := lookup
	byRef.Ref = "pi_1"
	declined := ours("pi_1", "requires_payment_method")
	declined.LastPaymentError = map[string]string{"type": "card_error", "code": "card_declined", "decline_code": "do_not_honor"}
	searched := "/v1/payment_intents/search?query=metadata['event_id']:'" + eventID + "'"
	listed := fmt.Sprintf("/v1/payment_intents?created[gte]=%d&customer=cus_123&limit=100", recorded.Add(-time.Hour).Unix())

	tests := []struct {
		name      string
		lookup    payment.Lookup
		search    []pi
		all       []pi
		pageSize  int
		want      payment.Outcome // compared without Detail
		wantAsked []string        // the requests, in order; a prefix when the list pages
	}{
		{name: "ByRef", lookup: byRef, all: []pi{ours("pi_1", "succeeded")},
			want: payment.Outcome{Kind: payment.Succeeded, Ref: "pi_1"}, wantAsked: []string{"/v1/payment_intents/pi_1"}},
		{name: "ByRefProcessing", lookup: byRef, all: []pi{ours("pi_1", "processing")},
			want: payment.Outcome{Kind: payment.InProgress, Ref: "pi_1"}},
		{name: "ByRefDeclined", lookup: byRef, all: []pi{declined},
			want: payment.Outcome{Kind: payment.Declined, Ref: "pi_1", Code: "do_not_honor"}},
		{name: "ByRefRequiresAction", lookup: byRef, all: []pi{ours("pi_1", "requires_action")},
			want: payment.Outcome{Kind: payment.Declined, Ref: "pi_1", Code: "authentication_required"}},
		{name: "BySearch", lookup: lookup, search: []pi{ours("pi_1", "succeeded")}, all: []pi{ours("pi_1", "succeeded")},
			want: payment.Outcome{Kind: payment.Succeeded, Ref: "pi_1"}, wantAsked: []string{searched}},
		{name: "SearchLagsListFinds", lookup: lookup, all: append(others(150), ours("pi_1", "succeeded")), pageSize: 100,
			want:      payment.Outcome{Kind: payment.Succeeded, Ref: "pi_1"},
			wantAsked: []string{searched, listed, listed + "&starting_after=pi_other99"}},
		{name: "SearchFindsADeclineListASuccess", lookup: lookup, search: []pi{declined},
			all:  []pi{ours("pi_2", "succeeded"), declined},
			want: payment.Outcome{Kind: payment.Succeeded, Ref: "pi_2"}},
		{name: "ProcessingBeforeDeclined", lookup: lookup, all: []pi{declined, ours("pi_2", "processing")},
			want: payment.Outcome{Kind: payment.InProgress, Ref: "pi_2"}},
		{name: "SearchDeclinedListNothingMore", lookup: lookup, search: []pi{declined}, all: []pi{declined},
			want: payment.Outcome{Kind: payment.Declined, Ref: "pi_1", Code: "do_not_honor"}},
		{name: "Nothing", lookup: lookup, all: others(3),
			want: payment.Outcome{Kind: payment.Unknown}, wantAsked: []string{searched, listed}},
		{name: "NothingWithoutACustomerOrTime", lookup: payment.Lookup{Request: payment.Request{IdempotencyKey: eventID}},
			want:      payment.Outcome{Kind: payment.Unknown},
			wantAsked: []string{searched, "/v1/payment_intents?limit=100"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeStripe(t)
			f.search, f.all, f.pageSize = tt.search, tt.all, tt.pageSize
			c, m := newClient(t, f.srv.URL)
			got, err := c.Resolve(context.Background(), tt.lookup)
			if err != nil {
				t.Fatal(err)
			}
			got.Detail = ""
			if got != tt.want {
				t.Errorf("Resolve = %+v, want %+v", got, tt.want)
			}
			if asked := f.asked(); tt.wantAsked != nil && !slices.Equal(asked[:min(len(asked), len(tt.wantAsked))], tt.wantAsked) {
				t.Errorf("asked\n%s\nwant\n%s", strings.Join(asked, "\n"), strings.Join(tt.wantAsked, "\n"))
			}
			checkLookup(t, m, tt.want.Kind.String())
		})
	}
}

func TestResolve_Errors(t *testing.T) {
	f := newFakeStripe(t)
	c, _ := newClient(t, f.srv.URL)
	// billing's id of a PaymentIntent Stripe does not have (another
	// account's key): no verdict, not "no payment".
	if out, err := c.Resolve(context.Background(), payment.Lookup{Ref: "pi_elsewhere"}); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("unknown id: %+v, %v; want the 404", out, err)
	}
	// Without an event id every PaymentIntent billing did not create
	// would match.
	if out, err := c.Resolve(context.Background(), payment.Lookup{Request: payment.Request{CustomerRef: "cus_123"}}); err == nil {
		t.Errorf("a lookup without an id or an event id: %+v", out)
	}

	wrongKey := newFakeStripe(t)
	other, _ := newClientKey(t, wrongKey.srv.URL, "sk_test_other")
	if out, err := other.Resolve(context.Background(), payment.Lookup{Request: charge}); err == nil ||
		!strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "xxxxx") || strings.Contains(err.Error(), "sk_test_other") {
		t.Errorf("refused search: %+v, %v; want the 401, the key masked", out, err)
	}
}
