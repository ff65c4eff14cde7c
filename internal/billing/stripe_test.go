package billing_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace/noop"

	"example.com/billing/internal/billing"
	"example.com/billing/internal/dedup"
	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/dlq/reason"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/order"
	"example.com/billing/internal/payment"
	"example.com/billing/internal/payment/stripe"
	"example.com/billing/internal/testenv/dbtest"
	"example.com/billing/internal/wallet"
)

// stripeFixture is a Processor charging through the Stripe adapter, over
// HTTP, at the fake provider's stripe profile, on a database of its own.
type stripeFixture struct {
	providerFixture
	psp *fakepsp.Server
}

func newStripeFixture(t *testing.T, opts fakepsp.Options) *stripeFixture {
	t.Helper()
	db, _ := dbtest.New(t)
	opts.Profile = fakepsp.ProfileStripe
	psp := fakepsp.New(opts)
	srv := httptest.NewServer(psp)
	t.Cleanup(func() { srv.Close(); _ = psp.Close() })
	m := metrics.New(prometheus.NewRegistry())
	client := payment.New(stripe.New(srv.URL, "sk_test_billing"), payment.Config{Wallet: "stripe", Timeout: 5 * time.Second, MaxConcurrency: 16}, m)
	t.Cleanup(client.Close)
	horizon := billing.Horizon{Retention: 7 * 24 * time.Hour, MaxFutureSkew: time.Hour, ProviderWindow: 24 * time.Hour, ResolveAfter: time.Hour}
	proc := running(t, billing.NewProcessor(db, dedup.NewStore("test-group"), client, horizon, m, noop.NewTracerProvider(),
		slog.New(slog.NewTextHandler(io.Discard, nil))))
	return &stripeFixture{providerFixture: providerFixture{db: db, proc: proc, rec: proc.Recoverer(), m: m}, psp: psp}
}

// card saves pm as customer's card.
func (f *stripeFixture) card(t *testing.T, customer int64, pm string) {
	t.Helper()
	if err := wallet.Save(context.Background(), f.db, "stripe", []wallet.Method{{CustomerID: customer, CustomerRef: "cus_" + pm, PaymentMethodRef: pm}}); err != nil {
		t.Fatal(err)
	}
}

// intents are the fake's PaymentIntents of ev.
func (f *stripeFixture) intents(ev order.Event) []fakepsp.Payment {
	var out []fakepsp.Payment
	for _, p := range f.psp.Payments() {
		if p.EventID == ev.ID.String() {
			out = append(out, p)
		}
	}
	return out
}

func stripeEvent(t *testing.T, orderID, customer int64) (order.Event, []byte) {
	t.Helper()
	ev, err := order.New(orderID, customer, order.Money{Minor: 1999, Currency: "EUR"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return ev, marshal(t, ev)
}

// A stored 500 is sent once more, then looked up: the lookup finds the
// PaymentIntent Stripe rolled forward and settles the attempt with it;
// Stripe saw two requests under the key and created one PaymentIntent.
func TestStripe_AStored500IsSentTwiceThenResolvedByLookup(t *testing.T) {
	f := newStripeFixture(t, fakepsp.Options{Stored500Rate: 1, Stored500DropRate: 1, SearchLag: time.Nanosecond})
	ev, value := stripeEvent(t, 201, 31)
	f.card(t, 31, "pm_card_visa")
	if res, err := f.proc.Process(context.Background(), messages(value)); res[0].Outcome != billing.Pending || err == nil {
		t.Fatalf("first answer: %v (%v); want pending, to ask once more", res[0].Outcome, err)
	}
	if res := process(t, f.proc, value); res[0].Outcome != billing.InProgress {
		t.Fatalf("second answer: %v, want in progress (looked up from now on)", res[0].Outcome)
	}
	rep, err := f.rec.Recover(context.Background(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Resolved["succeeded"] != 1 {
		t.Fatalf("recovery report %+v, want one resolved succeeded", rep)
	}
	intents := f.intents(ev)
	if len(intents) != 1 || intents[0].Status != "succeeded" {
		t.Fatalf("PaymentIntents of the event %+v, want one, succeeded", intents)
	}
	if got := f.count(t, `SELECT count(*) FROM charge WHERE event_id = $1 AND status = 'succeeded' AND provider_charge_id = $2 AND requests = 2`, ev.ID, intents[0].ID); got != 1 {
		t.Errorf("the attempt is not settled succeeded with the PaymentIntent's id after two requests")
	}
	if st := f.psp.Stats().Stripe; st.Requests != 2 || st.Stored500s != 1 {
		t.Errorf("provider saw %d requests and %d stored 500s, want 2 and 1", st.Requests, st.Stored500s)
	}
}

// A request Stripe refuses is parked with Stripe's words, never asked
// again: an unknown payment method (404 resource_missing, not stored), and
// the key used before with other parameters (idempotency_error).
func TestStripe_RefusedRequestsAreParkedNotRetried(t *testing.T) {
	f := newStripeFixture(t, fakepsp.Options{})
	missing, a := stripeEvent(t, 202, 32)
	f.card(t, 32, "pm_missing_card")
	reused, b := stripeEvent(t, 203, 33)
	f.card(t, 33, "pm_card_visa")
	// Someone used the event's key first, with another amount.
	form := url.Values{"amount": {"500"}, "currency": {"eur"}, "customer": {"cus_pm_card_visa"}, "payment_method": {"pm_card_visa"},
		"confirm": {"true"}, "off_session": {"true"}, "metadata[event_id]": {reused.ID.String()}}
	req := httptest.NewRequest(http.MethodPost, "/v1/payment_intents", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", reused.ID.String())
	f.psp.ServeHTTP(httptest.NewRecorder(), req)

	for _, tc := range []struct {
		ev    order.Event
		value []byte
		code  string
	}{{missing, a, "resource_missing"}, {reused, b, "idempotency_error"}} {
		res := process(t, f.proc, tc.value)
		if res[0].Outcome != billing.Parked || res[0].Reason.Code != reason.ProviderRejected || !strings.Contains(res[0].Reason.Detail, tc.code) {
			t.Errorf("%s: %v %q, want parked provider-rejected naming %s", tc.code, res[0].Outcome, res[0].Reason, tc.code)
		}
		if got := f.count(t, `SELECT requests FROM charge WHERE event_id = $1`, tc.ev.ID); got != 1 {
			t.Errorf("%s: %d requests, want 1: never asked again", tc.code, got)
		}
	}
	if rep, err := f.rec.Recover(context.Background(), 0); err != nil || rep.Pending != 0 {
		t.Errorf("recovery found %+v (%v); want nothing left to send", rep, err)
	}
	if st := f.psp.Stats().Stripe; st.Requests != 3 {
		t.Errorf("provider saw %d charge requests, want 3 (the other party's and one of each event's)", st.Requests)
	}
}

// A pending attempt whose answer was lost and whose window passed is never
// sent again: the resolver finds its PaymentIntent by the metadata search
// and settles it.
func TestStripe_APendingAttemptPastTheWindowIsFoundBySearch(t *testing.T) {
	f := newStripeFixture(t, fakepsp.Options{ResetRate: 1, SearchLag: time.Nanosecond})
	ev, value := stripeEvent(t, 204, 34)
	f.card(t, 34, "pm_card_visa")
	if res, _ := f.proc.Process(context.Background(), messages(value)); res[0].Outcome != billing.Pending {
		t.Fatalf("answer lost: %v, want pending", res[0].Outcome)
	}
	if _, err := f.db.Exec(`UPDATE charge SET created_at = now() - interval '25 hours', updated_at = now() - interval '1 hour' WHERE event_id = $1`, ev.ID); err != nil {
		t.Fatal(err)
	}
	rep, err := f.rec.Recover(context.Background(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Resolved["succeeded"] != 1 {
		t.Fatalf("report %+v, want the attempt resolved succeeded", rep)
	}
	if st := f.psp.Stats().Stripe; st.Requests != 1 || st.Lookups.Search == 0 {
		t.Errorf("provider saw %d charge requests and %d searches; want one request and a search", st.Requests, st.Lookups.Search)
	}
	if res := process(t, f.proc, value); res[0].Outcome != billing.Charged {
		t.Errorf("the event's redelivery: %v, want charged (its outcome counted once)", res[0].Outcome)
	}
}

// A bank debit answers processing: the attempt is in_progress with the
// PaymentIntent's id, and a lookup, once due, settles it with Stripe's
// verdict.
func TestStripe_ProcessingIsSettledByALookupWithoutAWebhook(t *testing.T) {
	f := newStripeFixture(t, fakepsp.Options{ProcessingDelay: 10 * time.Millisecond})
	ev, value := stripeEvent(t, 205, 35)
	f.card(t, 35, "pm_fakeDebit_failure")
	if res := process(t, f.proc, value); res[0].Outcome != billing.InProgress {
		t.Fatalf("%v, want in progress", res[0].Outcome)
	}
	time.Sleep(50 * time.Millisecond) // the debit fails meanwhile
	f.dueNow(t)
	if _, err := f.rec.Recover(context.Background(), time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := f.count(t, `SELECT count(*) FROM charge WHERE event_id = $1 AND status = 'declined' AND decline_code = 'insufficient_funds'`, ev.ID); got != 1 {
		t.Errorf("the failed debit is not recorded declined insufficient_funds")
	}
	if got := f.psp.Stats().Stripe.Lookups.Retrieve; got != 1 {
		t.Errorf("%d retrieves, want one by the PaymentIntent's id", got)
	}
}
