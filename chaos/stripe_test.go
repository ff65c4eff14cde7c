//go:build chaos

package chaos_test

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"example.com/billing/internal/charge"
	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/dlq/reason"
	"example.com/billing/internal/outbox"
)

// The stripe scenario (issue 39): serve speaks Stripe's PaymentIntents API
// to `billing fakepsp --profile stripe`. Each customer's saved payment
// method chooses what a charge comes to: a card charged or declined at
// once, a bank debit processing and decided a moment later (announced by
// webhook), a payment method Stripe does not know (404), or no saved
// method at all (never sent, parked until one is imported). On top, the
// provider stores a 500 for a few keys while it creates their
// PaymentIntents all the same, and its webhooks are delayed, repeated,
// forged, stale or dropped. They reach the two replicas through one load
// balancer, as Stripe posts to one endpoint, while the replicas are
// restarted one at a time. The wiring and the judge's common part are
// provider_test.go's.

const (
	stripeAPIKey = "sk_test_chaos"
	// The provider signs with the current secret, which billing lists
	// second, after the one being rolled in: every webhook billing
	// accepts shows that any listed secret verifies, as during a rotation.
	stripeSecretNext    = "whsec_chaos_next"
	stripeSecretCurrent = "whsec_chaos_current"
	// stripeLateMethod is what the customers without a payment method get
	// after the stream, before their parked events are replayed.
	stripeLateMethod = "pm_card_visa"
	// stripeUnknownMethod is a payment method Stripe does not have: 404
	// resource_missing, parked provider-rejected.
	stripeUnknownMethod = "pm_missing_chaos"
)

// stripeProvider is the stripe scenario's provider.
var stripeProvider = &providerSpec{
	name: fakepsp.ProfileStripe,
	fakeArgs: []string{"--processing-delay", "1500ms", "--search-lag", "2s",
		"--stored-500-rate", "0.04", "--stored-500-drop-rate", "0.5",
		// From no delay (a webhook racing the answer it follows) to 3s;
		// a webhook no replica took is tried again within a second.
		"--webhook-delay-min", "0s", "--webhook-delay-max", "3s", "--webhook-retry-max", "1s",
		"--webhook-repeat-rate", "0.2", "--webhook-forge-rate", "0.1", "--webhook-stale-rate", "0.1", "--webhook-drop-rate", "0.05"},
	fakeEnv: map[string]string{"PAYMENT_API_KEY": stripeAPIKey, "PAYMENT_WEBHOOK_SECRET": stripeSecretCurrent},
	serveEnv: map[string]string{
		"PAYMENT_API_KEY":        stripeAPIKey,
		"PAYMENT_WEBHOOK_SECRET": stripeSecretNext + "," + stripeSecretCurrent,
	},
	chargePath:  "/v1/payment_intents",
	methodOf:    stripeMethodOf,
	lateMethod:  stripeLateMethod,
	customerRef: stripeCustomerRef,
	wantOf:      stripeWantOf,
	currency:    strings.ToLower,
	processing: func(st fakepsp.Stats) int64 {
		return st.Stripe.Processing - st.Stripe.ProcessingSucceeded - st.Stripe.ProcessingFailed
	},
	faults: func(r *run, st fakepsp.Stats) {
		wh := st.Stripe.Webhooks
		r.addFaults("stored-500", int(st.Stripe.Stored500s))
		r.addFaults("webhook-repeated", int(wh.Repeated))
		r.addFaults("webhook-forged", int(wh.Forged))
		r.addFaults("webhook-stale", int(wh.Stale))
		r.addFaults("webhook-dropped", int(wh.Dropped))
	},
	verify: verifyStripe,
}

// stripeMethodOf is the payment method saved for customer before the
// stream, "" for none: a fixed mix by customer id, mostly cards that are
// charged.
func stripeMethodOf(customer int64) string {
	switch n := customer % 100; {
	case n < 3:
		return "" // parked no-payment-method, charged after import and replay
	case n < 4:
		return stripeUnknownMethod
	case n < 7:
		return "pm_card_chargeDeclined"
	case n < 9:
		return "pm_card_chargeDeclinedInsufficientFunds"
	case n < 10:
		return "pm_card_authenticationRequired"
	case n < 20:
		return "pm_fakeDebit_success"
	case n < 24:
		return "pm_fakeDebit_failure"
	}
	return "pm_card_visa"
}

// stripeCustomerRef is customer's Stripe customer id.
func stripeCustomerRef(customer int64) string {
	return fmt.Sprintf("cus_chaos%d", customer)
}

// stripeWantOf is what an event of customer must come to.
func stripeWantOf(customer int64) providerWant {
	succeeded := outcomeLabel(outcome{EventType: outbox.Succeeded})
	switch pm := stripeMethodOf(customer); pm {
	case "":
		failed := outcomeLabel(outcome{EventType: outbox.Failed, Reason: string(reason.NoPaymentMethod)})
		return providerWant{method: stripeLateMethod, status: charge.Succeeded, parked: reason.NoPaymentMethod, outcomes: []string{failed, succeeded}}
	case stripeUnknownMethod:
		failed := outcomeLabel(outcome{EventType: outbox.Failed, Reason: string(reason.ProviderRejected)})
		return providerWant{status: charge.Rejected, parked: reason.ProviderRejected, outcomes: []string{failed}}
	case "pm_card_chargeDeclined", "pm_card_chargeDeclinedInsufficientFunds", "pm_card_authenticationRequired", "pm_fakeDebit_failure":
		return providerWant{method: pm, status: charge.Declined, outcomes: []string{outcomeLabel(outcome{EventType: outbox.Declined})}}
	default:
		return providerWant{method: pm, status: charge.Succeeded, outcomes: []string{succeeded}}
	}
}

// verifyStripe is the stripe scenario's own part of the judge, after the
// common one (verifyProvider): every stored 500 re-sent at most once, no
// request Stripe would refuse, forged and stale webhooks refused. It ends
// with the figures issue 39's closing note gives.
func verifyStripe(r *run, j *judged) {
	t := r.t
	s := r.provider
	st := j.st

	// A stored 500 is sent once more, then looked up. A request answered
	// 409 (the key in flight) arrived before the answer was stored and
	// changed nothing: not a send of the stored 500. Every other request
	// of the key reached it: the creating one, and the re-sends.
	sent := s.api.sentPerKey()
	resent := map[int]int{} // stored 500s by how many requests reached them
	for _, p := range j.payments {
		if p.Answer != http.StatusInternalServerError {
			continue
		}
		var reached int
		var sends []string
		for _, s := range sent[p.IdempotencyKey] {
			if s.status != http.StatusConflict {
				reached++
			}
			sends = append(sends, fmt.Sprintf("%s %d at +%s", s.replica, s.status, s.at.Sub(r.start).Round(time.Millisecond)))
		}
		resent[reached]++
		if reached > 2 {
			t.Errorf("event %s (at %s) was answered with a stored 500, and %d requests reached it (%s): at most two, the one re-send included",
				p.EventID, strings.Join(r.placesOf(p.EventID), ", "), reached, strings.Join(sends, "; "))
		}
	}
	ps := st.Stripe
	if ps.IdempotencyErrors+ps.BadRequests+ps.Unauthorized+ps.RateLimited+ps.KeysExpired+ps.InjectedFailures+ps.DownRejections != 0 {
		t.Errorf("provider: %d idempotency errors, %d bad requests, %d unauthorized, %d rate limited, %d keys expired, %d injected failures, %d down: want none",
			ps.IdempotencyErrors, ps.BadRequests, ps.Unauthorized, ps.RateLimited, ps.KeysExpired, ps.InjectedFailures, ps.DownRejections)
	}

	// --- The webhooks: forged and stale ones refused, every refusal
	// counted.
	wh := st.Stripe.Webhooks
	refused := s.counter(`billing_webhooks_total{result="refused"}`)
	lb := s.lb.stats()
	if wh.ForgedAccepted != 0 || wh.StaleAccepted != 0 {
		t.Errorf("billing accepted %d forged and %d stale webhooks", wh.ForgedAccepted, wh.StaleAccepted)
	}
	if copies := float64(wh.Forged + wh.Stale); refused > copies || refused < copies-float64(lb.noReplica) {
		t.Errorf("billing refused %.0f webhooks; the provider posted %.0f forged or stale ones, %d of all webhooks found no replica", refused, copies, lb.noReplica)
	}
	if refused != float64(lb.answers[http.StatusBadRequest]) {
		t.Errorf("billing_webhooks_total{result=\"refused\"} is %.0f; the replicas answered %d webhooks 400", refused, lb.answers[http.StatusBadRequest])
	}

	r.logStripeFigures(stripeFigures{judged: j, resent: resent, lb: lb})
}

// stripeFigures is what the figures are computed from.
type stripeFigures struct {
	*judged
	resent map[int]int // stored 500s by how many requests reached them
	lb     balancerStats
}

// logStripeFigures logs, in one block, the figures issue 39's closing note
// gives.
func (r *run) logStripeFigures(f stripeFigures) {
	s := r.provider
	// Payments by kind: what the creating request was answered, then
	// what it came to.
	kinds := map[string]map[string]int{}
	add := func(kind, status string) {
		if kinds[kind] == nil {
			kinds[kind] = map[string]int{}
		}
		kinds[kind][status]++
	}
	for _, p := range f.payments {
		switch ev := f.events[p.EventID]; {
		case stripeMethodOf(ev.CustomerID) == "":
			add("no-payment-method, then imported and replayed", p.Status)
		case p.Answer == http.StatusInternalServerError:
			add("stored-500", p.Status)
		case strings.HasPrefix(p.PaymentMethod, "pm_fakeDebit"):
			add("processing", p.Status)
		case p.Answer == http.StatusPaymentRequired:
			add("declined", p.Status)
		default:
			add("immediate", p.Status)
		}
	}
	for _, ev := range f.events {
		if stripeWantOf(ev.CustomerID).method == "" {
			add("unknown payment method (404, parked)", "no PaymentIntent")
		}
	}
	var byKind []string
	for _, k := range []string{"immediate", "declined", "processing", "stored-500", "unknown payment method (404, parked)", "no-payment-method, then imported and replayed"} {
		var n int
		var parts []string
		for _, status := range slices.Sorted(maps.Keys(kinds[k])) {
			n += kinds[k][status]
			parts = append(parts, fmt.Sprintf("%s %d", status, kinds[k][status]))
		}
		byKind = append(byKind, fmt.Sprintf("%s %d (%s)", k, n, strings.Join(parts, ", ")))
	}

	// Time from a stored 500 to its settle, by the charge table.
	var waits []struct {
		EventID string  `db:"event_id"`
		Seconds float64 `db:"seconds"`
	}
	const q = `SELECT event_id::text AS event_id, extract(epoch FROM settled_at - created_at) AS seconds
FROM charge WHERE indeterminate > 0 AND settled_at IS NOT NULL ORDER BY 2`
	if err := f.db.Select(&waits, q); err != nil {
		r.t.Errorf("read the stored 500s' settles: %v", err)
	}
	stored500, short := "none", "none"
	if n := len(waits); n > 0 {
		short = fmt.Sprintf("median %.1fs, max %.1fs", waits[n/2].Seconds, waits[n-1].Seconds)
		stored500 = fmt.Sprintf("%d attempts, %s (event %s)", n, short, waits[n-1].EventID)
	}
	var resent []string
	for _, n := range slices.Sorted(maps.Keys(f.resent)) {
		resent = append(resent, fmt.Sprintf("%d× %d", n, f.resent[n]))
	}

	wh := f.st.Stripe.Webhooks
	lk := f.st.Stripe.Lookups
	r.t.Logf(`stripe figures (seed %d):
  events: %d valid (%d messages); provider: %d PaymentIntents
  payments by kind: %s
  webhooks at the provider: %d events, %d delivered, %d repeated, %d forged, %d stale, %d dropped (%d POSTs answered other than 2xx, %d unanswered)
  webhooks at billing: %s; balancer: replicas answered %v, %d moved on to the next replica (connection refused), %d found no replica (502)
  lookups at the provider: %d retrieve, %d search, %d list (%d not found, %d refused); billing's lookups by result: %s
  stored 500s: %d; requests that reached each (409s aside): %s; stored 500 to settle: %s
  orders charged twice: %d; attempts left pending or in_progress: %d
  settled %s after the group caught up; the %d replayed no-payment-method messages charged %s after the import began`,
		r.seed,
		len(f.events), len(r.stream.messages()), len(f.payments),
		strings.Join(byKind, "; "),
		wh.Events, wh.Delivered, wh.Repeated, wh.Forged, wh.Stale, wh.Dropped, wh.Refused, wh.Failed,
		formatCounts(s.countersOf("billing_webhooks_total")), f.lb.answers, f.lb.movedOn, f.lb.noReplica,
		lk.Retrieve, lk.Search, lk.List, lk.NotFound, lk.Rejected, formatCounts(s.countersOf("billing_payment_lookups_total")),
		f.st.Stripe.Stored500s, strings.Join(resent, ", "), stored500,
		f.res.double, f.unsettled,
		s.settledAfter.Round(100*time.Millisecond), s.replayed, s.replayCharged.Round(100*time.Millisecond))
	r.figure("stored 500→settle %s; webhooks refused %.0f of %d forged+stale", short, s.counter(`billing_webhooks_total{result="refused"}`), wh.Forged+wh.Stale)
}
