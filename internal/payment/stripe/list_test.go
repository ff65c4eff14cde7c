package stripe_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"example.com/billing/internal/payment"
)

var (
	listFrom = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	listTo   = listFrom.Add(24 * time.Hour)
)

func TestCharges_FollowsPages(t *testing.T) {
	f := newFakeStripe(t)
	// Newest first, as Stripe lists; one before and one at the window's
	// end, which the list leaves out.
	f.all = append(f.all, pi{ID: "pi_late", Object: "payment_intent", Status: "succeeded", Created: listTo.Unix()})
	for i := range 250 {
		p := pi{ID: fmt.Sprintf("pi_%03d", i), Object: "payment_intent", Status: "succeeded", Amount: int64(100 + i), Currency: "eur",
			Created:  listTo.Add(-time.Duration(i+1) * time.Minute).Unix(),
			Metadata: map[string]string{"event_id": fmt.Sprintf("evt-%d", i), "order_id": fmt.Sprint(1000 + i), "customer_id": "45"}}
		switch i {
		case 7:
			p.Status = "processing"
		case 8:
			p.Status = "requires_payment_method"
		case 9:
			// A payment billing did not create.
			p.Metadata = map[string]string{}
		}
		f.all = append(f.all, p)
	}
	f.all = append(f.all, pi{ID: "pi_early", Object: "payment_intent", Status: "succeeded", Created: listFrom.Unix() - 1})

	c, _ := newClient(t, f.srv.URL)
	got, err := c.Charges(context.Background(), listFrom, listTo)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 250 {
		t.Fatalf("%d charges, want 250", len(got))
	}
	want := fmt.Sprintf("/v1/payment_intents?created[gte]=%d&created[lt]=%d&limit=100", listFrom.Unix(), listTo.Unix())
	asked := f.asked()
	if len(asked) != 3 || asked[0] != want || asked[1] != want+"&starting_after=pi_099" || asked[2] != want+"&starting_after=pi_199" {
		t.Errorf("asked\n%s\nwant 3 pages of\n%s", strings.Join(asked, "\n"), want)
	}
	first := payment.ListedCharge{ID: "pi_000", IdempotencyKey: "evt-0", OrderID: 1000, CustomerID: 45, Amount: 100, Currency: "EUR",
		Status: "succeeded", Created: listTo.Add(-time.Minute)}
	if got[0] != first {
		t.Errorf("first charge %+v, want %+v", got[0], first)
	}
	if got[7].Status != "processing" || got[8].Status != "requires_payment_method" {
		t.Errorf("statuses %q, %q: want the PaymentIntents' own when no money moved", got[7].Status, got[8].Status)
	}
	if g := got[9]; g.IdempotencyKey != "" || g.OrderID != 0 || g.CustomerID != 0 {
		t.Errorf("a payment without billing's metadata: %+v", g)
	}
}

func TestCharges_Errors(t *testing.T) {
	f := newFakeStripe(t)
	c, _ := newClientKey(t, f.srv.URL, "sk_test_wrong")
	if _, err := c.Charges(context.Background(), listFrom, listTo); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("wrong key: err = %v, want the 401", err)
	}

	// has_more without a new page would loop for ever.
	for name, body := range map[string]string{
		"empty page": `{"object":"list","data":[],"has_more":true}`,
		"same page":  `{"object":"list","data":[{"id":"pi_1","status":"succeeded"}],"has_more":true}`,
	} {
		stuck := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(body))
		}))
		t.Cleanup(stuck.Close)
		c, _ := newClient(t, stuck.URL)
		if _, err := c.Charges(context.Background(), listFrom, listTo); err == nil {
			t.Errorf("%s: has_more with nothing new was accepted", name)
		}
	}

	garbled := answer(t, 200, `<html>`)
	c, _ = newClient(t, garbled.URL)
	if _, err := c.Charges(context.Background(), listFrom, listTo); err == nil {
		t.Error("an answer that is no list was accepted")
	}
}
