//go:build chaos

package chaos_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"

	"example.com/billing/internal/charge"
	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/dev/loadgen"
	"example.com/billing/internal/dlq"
	"example.com/billing/internal/dlq/reason"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/outbox"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/testenv/kafkatest"
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
// restarted one at a time.

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
	// loadgenCustomers: loadgen draws customer ids in 1..50,000.
	loadgenCustomers = 50_000
	// stripeSettleLimit bounds each wait for every payment to be settled.
	stripeSettleLimit = 2 * time.Minute
)

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

// stripeWant is what one valid event must come to.
type stripeWant struct {
	// method is the payment method its PaymentIntent charges ("" when
	// none may exist).
	method string
	status string      // its attempt's final status
	parked reason.Code // "" when it is never parked
	// outcomes are its outcome events, in order, as type/reason.
	outcomes []string
}

// stripeWantOf is what an event of customer must come to.
func stripeWantOf(customer int64) stripeWant {
	succeeded := outcomeLabel(outcome{EventType: outbox.Succeeded})
	switch pm := stripeMethodOf(customer); pm {
	case "":
		failed := outcomeLabel(outcome{EventType: outbox.Failed, Reason: string(reason.NoPaymentMethod)})
		return stripeWant{method: stripeLateMethod, status: charge.Succeeded, parked: reason.NoPaymentMethod, outcomes: []string{failed, succeeded}}
	case stripeUnknownMethod:
		failed := outcomeLabel(outcome{EventType: outbox.Failed, Reason: string(reason.ProviderRejected)})
		return stripeWant{status: charge.Rejected, parked: reason.ProviderRejected, outcomes: []string{failed}}
	case "pm_card_chargeDeclined", "pm_card_chargeDeclinedInsufficientFunds", "pm_card_authenticationRequired", "pm_fakeDebit_failure":
		return stripeWant{method: pm, status: charge.Declined, outcomes: []string{outcomeLabel(outcome{EventType: outbox.Declined})}}
	default:
		return stripeWant{method: pm, status: charge.Succeeded, outcomes: []string{succeeded}}
	}
}

// stripeRun is the stripe scenario's wiring around the provider: the
// webhooks' load balancer, the proxy that counts the requests per key,
// and what the run gathered from the replicas. Its fields are the test
// goroutine's: the scenario's inject, check and verify run on it one
// after another.
type stripeRun struct {
	lb  *webhookBalancer
	api *keyCounter

	// counters sums, over every serve process, the series of
	// stripeCounters, each read once the process got its last webhook
	// (retire).
	counters map[string]float64
	// replayed is how many parked messages billing dlq replay republished
	// to the order topic.
	replayed int
	// settledAfter is how long after the group caught up every payment
	// was settled; replayCharged how long after the replay started its
	// events were all charged.
	settledAfter, replayCharged time.Duration
}

// stripeCounters are the metrics summed over the replicas.
var stripeCounters = []string{"billing_webhooks_total", "billing_payment_lookups_total", "billing_payment_replays_total"}

// startStripe starts the webhooks' load balancer, fakepsp with the stripe
// profile posting to it, and the counting proxy in front of fakepsp's API;
// each is stopped when the run ends.
func (r *run) startStripe() (*stripeRun, error) {
	s := &stripeRun{counters: map[string]float64{}}
	var err error
	if s.lb, err = startWebhookBalancer(r.webhookBackends); err != nil {
		return nil, err
	}
	r.t.Cleanup(s.lb.close)
	args := []string{"--profile", fakepsp.ProfileStripe, "--seed", fmt.Sprint(r.seed), "--latency", r.sc.latency.String(),
		"--processing-delay", "1500ms", "--search-lag", "2s",
		"--stored-500-rate", "0.04", "--stored-500-drop-rate", "0.5",
		"--webhook-url", s.lb.url + "/webhooks/stripe",
		// From no delay (a webhook racing the answer it follows) to 3s;
		// a webhook no replica took is tried again within a second.
		"--webhook-delay-min", "0s", "--webhook-delay-max", "3s", "--webhook-retry-max", "1s",
		"--webhook-repeat-rate", "0.2", "--webhook-forge-rate", "0.1", "--webhook-stale-rate", "0.1", "--webhook-drop-rate", "0.05"}
	env := map[string]string{"PAYMENT_API_KEY": stripeAPIKey, "PAYMENT_WEBHOOK_SECRET": stripeSecretCurrent}
	if r.psp, err = startPSP(filepath.Join(r.dir, "fakepsp.log"), env, args...); err != nil {
		return nil, err
	}
	r.t.Cleanup(r.stopPSP)
	if s.api, err = startKeyCounter(r.psp.url, filepath.Join(r.dir, "provider-requests.log")); err != nil {
		return nil, err
	}
	r.t.Cleanup(s.api.close)
	return s, nil
}

// serveEnv is the provider configuration of the serve process named
// replica, besides its WEBHOOK_ADDR. Its PAYMENT_BASE_URL names it, so
// that the counting proxy knows who sent each request.
func (s *stripeRun) serveEnv(replica string) map[string]string {
	return map[string]string{
		"PAYMENT_PROVIDER":       "stripe",
		"PAYMENT_BASE_URL":       s.api.url + "/" + replica,
		"PAYMENT_API_KEY":        stripeAPIKey,
		"PAYMENT_WEBHOOK_SECRET": stripeSecretNext + "," + stripeSecretCurrent,
	}
}

// webhookBackends are the WEBHOOK_ADDRs of the replicas that run and are
// not being stopped.
func (r *run) webhookBackends() []string {
	var addrs []string
	for _, c := range r.running() {
		if c.webhook != "" && !c.wasSignaled() {
			addrs = append(addrs, c.webhook)
		}
	}
	return addrs
}

// retire takes c out of the load balancer, waits until it answered the
// webhooks it was sent, and adds its counters to the run's: it gets no
// webhook after, so its billing_webhooks_total is final before it is
// stopped. Its lookups after this (a drain's) are not counted; the
// provider's books count every lookup.
func (s *stripeRun) retire(r *run, c *consumer) {
	if err := s.lb.drain(c.webhook); err != nil {
		r.t.Errorf("%s: %v", c.name, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	snap, err := metrics.Scrape(ctx, "http://"+c.addr+"/metrics")
	if err != nil {
		r.t.Errorf("%s: %v", c.name, err)
		return
	}
	for series, v := range snap.Values {
		if name, _, _ := strings.Cut(series, "{"); slices.Contains(stripeCounters, name) {
			s.counters[series] += v
		}
	}
}

// counter returns the run's sum of one series, e.g.
// billing_webhooks_total{result="refused"}.
func (s *stripeRun) counter(series string) float64 {
	return s.counters[series]
}

// countersOf returns the run's sums of metric's series by their label
// value, e.g. billing_webhooks_total by result.
func (s *stripeRun) countersOf(metric string) map[string]float64 {
	out := map[string]float64{}
	for series, v := range s.counters {
		name, labels, _ := strings.Cut(series, "{")
		if name == metric {
			_, value, _ := strings.Cut(strings.TrimSuffix(labels, "}"), "=")
			out[strings.Trim(value, `"`)] += v
		}
	}
	return out
}

// importStripeMethods saves, through billing payment-methods import, the
// payment method of every customer the stream can use that stripeMethodOf
// gives one.
func importStripeMethods(r *run) error {
	_, err := r.importMethods("payment-methods-import", stripeMethodOf)
	return err
}

// importMethods imports method(customer) for every customer the stream
// can use that it gives one, and returns how many it imported.
func (r *run) importMethods(name string, method func(customer int64) string) (int, error) {
	var csv bytes.Buffer
	csv.WriteString("customer_id,customer_ref,payment_method_ref\n")
	n := 0
	for customer := int64(1); customer <= loadgenCustomers; customer++ {
		if pm := method(customer); pm != "" {
			fmt.Fprintf(&csv, "%d,%s,%s\n", customer, stripeCustomerRef(customer), pm)
			n++
		}
	}
	out, err := r.billingCommand(name, map[string]string{"DATABASE_URL": r.dsn, "PAYMENT_PROVIDER": "stripe"}, &csv, "payment-methods", "import",
		"--reason", "chaos: the cards of the stream's customers", "--by", "chaos")
	if err != nil {
		return 0, err
	}
	var got struct {
		Imported int `json:"imported"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || got.Imported != n {
		return 0, fmt.Errorf("billing payment-methods import printed %q, want %d imported (%v)", out, n, err)
	}
	r.t.Logf("billing payment-methods import: %d customers' payment methods", n)
	return n, nil
}

// billingCommand runs a billing command that ends on its own (a minute at
// most), its standard input stdin, its standard error in the run's
// <name>.log, and returns its standard output. Like every process of the
// suite it dies with the suite.
func (r *run) billingCommand(name string, env map[string]string, stdin io.Reader, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	logPath := filepath.Join(r.dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return "", err
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, suite.binary, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, io.MultiWriter(&out, logf), logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	exited := make(chan error, 1)
	if err := startOnOwnThread(cmd, func(err error) { exited <- err }); err != nil {
		return "", fmt.Errorf("start billing %s: %w", strings.Join(args, " "), err)
	}
	if err := <-exited; err != nil {
		return out.String(), fmt.Errorf("billing %s: %w\n%s", strings.Join(args, " "), err, tailFile(logPath, 20))
	}
	return out.String(), nil
}

// injectStripeRollingRestart replaces the two replicas one at a time
// mid-stream: each is taken out of the load balancer, stopped with SIGTERM
// and started again, and the next one waits until it is ready.
func injectStripeRollingRestart(r *run) {
	rng := r.rng("stripe-rolling")
	d := r.stream.duration()
	r.sleepUntil(between(rng, d/4, d/3))
	for _, c := range r.running() {
		slot := r.slotOf(c)
		r.stripe.retire(r, c)
		r.stop(c, "sigterm")
		if n := r.startInSlot(slot); n != nil {
			if err := n.waitReady(time.Minute); err != nil {
				r.t.Errorf("%s after the rolling restart: %v", n.name, err)
			}
		}
		r.faultOver()
	}
}

// checkStripe runs once the group caught up: it waits until every payment
// is settled, imports a payment method for the customers that had none,
// replays their parked events and waits until those are charged too; then,
// also when that failed, the replicas are retired (their counters read)
// before they are stopped.
func checkStripe(r *run) {
	s := r.stripe
	defer func() {
		for _, c := range r.running() {
			s.retire(r, c)
		}
	}()
	db, err := postgres.Open(r.dsn, 1)
	if err != nil {
		r.t.Errorf("open database: %v", err)
		return
	}
	defer db.Close()
	if !r.waitStripeSettled(db) {
		return
	}
	r.mu.Lock()
	s.settledAfter = time.Since(r.lagZero)
	r.mu.Unlock()

	replayStart := time.Now()
	late := func(customer int64) string {
		if stripeMethodOf(customer) == "" {
			return stripeLateMethod
		}
		return ""
	}
	if _, err := r.importMethods("payment-methods-import-late", late); err != nil {
		r.t.Errorf("%v", err)
		return
	}
	if err := r.replayNoPaymentMethod(); err != nil {
		r.t.Errorf("%v", err)
		return
	}
	if !r.waitCaughtUp(time.Minute) || !r.waitStripeSettled(db) {
		return
	}
	s.replayCharged = time.Since(replayStart)
	r.waitOutboxPublished(time.Minute)

	st, err := r.stripeStats()
	if err != nil {
		r.t.Errorf("provider stats: %v", err)
	}
	wh := st.Stripe.Webhooks
	r.addFaults("stored-500", int(st.Stripe.Stored500s))
	r.addFaults("webhook-repeated", int(wh.Repeated))
	r.addFaults("webhook-forged", int(wh.Forged))
	r.addFaults("webhook-stale", int(wh.Stale))
	r.addFaults("webhook-dropped", int(wh.Dropped))
}

// replayNoPaymentMethod republishes the events parked no-payment-method
// with billing dlq replay.
func (r *run) replayNoPaymentMethod() error {
	env := map[string]string{
		"KAFKA_BROKERS": r.brokers, "KAFKA_TOPIC": r.topic, "KAFKA_DLQ_TOPIC": r.dlqTopic,
		"KAFKA_OUTCOME_TOPIC": r.outcomeTopic, "KAFKA_GROUP_ID": r.group, "KAFKA_CLIENT_ID": "chaos-dlq-replay",
		"DATABASE_URL": r.dsn,
	}
	out, err := r.billingCommand("dlq-replay", env, nil, "dlq", "replay", "--code", string(reason.NoPaymentMethod),
		"--reason", "chaos: the missing cards are imported", "--by", "chaos")
	if err != nil {
		return err
	}
	m := replayedPattern.FindStringSubmatch(out)
	if m == nil {
		return fmt.Errorf("billing dlq replay printed no summary:\n%s", out)
	}
	n, _ := strconv.Atoi(m[1]) // the pattern's digits
	r.stripe.replayed = n
	r.t.Logf("[+%s] billing dlq replay --code %s: %d messages republished", r.elapsed(), reason.NoPaymentMethod, n)
	return nil
}

// replayedPattern reads billing dlq replay's summary line.
var replayedPattern = regexp.MustCompile(`(?m)^replayed (\d+), passed over`)

// waitCaughtUp waits until the group has committed every partition of the
// order topic to its end, at most limit.
func (r *run) waitCaughtUp(limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for {
		done, lag, err := r.caughtUp()
		if err == nil && done {
			return true
		}
		if time.Now().After(deadline) {
			if err != nil {
				lag = err.Error()
			}
			r.t.Errorf("group did not catch up with the replayed messages within %s: %s", limit, lag)
			return false
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// waitStripeSettled waits, at most stripeSettleLimit, until nothing waits
// for an outcome: no webhook left to deliver, no payment processing at the
// provider, no charge attempt pending or in_progress.
func (r *run) waitStripeSettled(db *sqlx.DB) bool {
	began := time.Now()
	told := began
	for {
		left, err := r.stripeUnsettled(db)
		if err == nil && left == "" {
			r.t.Logf("[+%s] every payment settled and every webhook delivered (waited %s)", r.elapsed(), time.Since(began).Round(100*time.Millisecond))
			return true
		}
		if err == nil && time.Since(told) >= 5*time.Second {
			r.t.Logf("[+%s] still open: %s", r.elapsed(), left)
			told = time.Now()
		}
		if time.Since(began) > stripeSettleLimit {
			if err != nil {
				left = err.Error()
			}
			r.t.Errorf("not settled within %s: %s", stripeSettleLimit, left)
			return false
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// stripeUnsettled says what still waits for an outcome, "" when nothing.
func (r *run) stripeUnsettled(db *sqlx.DB) (string, error) {
	st, err := r.stripeStats()
	if err != nil {
		return "", err
	}
	var pending, inProgress int
	const q = `SELECT count(*) FILTER (WHERE status = $1), count(*) FILTER (WHERE status = $2) FROM charge`
	if err := db.QueryRow(q, charge.Pending, charge.InProgress).Scan(&pending, &inProgress); err != nil {
		return "", err
	}
	processing := st.Stripe.Processing - st.Stripe.ProcessingSucceeded - st.Stripe.ProcessingFailed
	if st.PendingWebhooks == 0 && processing == 0 && pending == 0 && inProgress == 0 {
		return "", nil
	}
	var oldest []string
	const open = `SELECT event_id::text || ' ' || status FROM charge WHERE status IN ($1, $2) ORDER BY created_at LIMIT 3`
	if err := db.Select(&oldest, open, charge.Pending, charge.InProgress); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d webhooks to deliver, %d payments processing at the provider; %d attempts pending, %d in_progress (oldest: %s)",
		st.PendingWebhooks, processing, pending, inProgress, strings.Join(oldest, ", ")), nil
}

func (r *run) stripeStats() (fakepsp.Stats, error) {
	var st fakepsp.Stats
	err := r.psp.getJSON("/_stats", &st)
	return st, err
}

// --- the judge ---

// outcome is a payment outcome event as the outcome topic holds it.
type outcome struct {
	EventID     string          `json:"eventId"`
	EventType   string          `json:"eventType"`
	CausationID string          `json:"causationId"`
	OrderID     int64           `json:"orderId"`
	TotalAmount json.RawMessage `json:"totalAmount"`
	Currency    string          `json:"currency"`
	Reason      string          `json:"reason"`
}

// outcomeLabel is o's type, and its reason when it has one.
func outcomeLabel(o outcome) string {
	if o.Reason == "" {
		return o.EventType
	}
	return o.EventType + "/" + o.Reason
}

// verifyStripe is verify for the stripe scenario, once every consumer has
// stopped: the provider's books are its PaymentIntents (GET /_payments),
// and what each event must come to is chosen by its customer's payment
// method (stripeWantOf). It ends with the figures the closing note
// gives.
func (r *run) verifyStripe() result {
	t := r.t
	s := r.stripe
	msgs := r.stream.messages()
	exp := r.stream.expected
	var res result
	res.messages, res.valid, res.invalid = len(msgs), exp.Unique, exp.Invalid
	res.dups = len(msgs) - exp.Unique - exp.Invalid
	for _, m := range msgs {
		if m.cross {
			res.cross++
		}
	}
	events := map[string]loadgen.Event{}
	byOrder := map[int64]string{}
	for _, ev := range exp.Events {
		events[ev.ID.String()] = ev
		byOrder[ev.OrderID] = ev.ID.String()
	}
	lost := map[string]string{} // event id -> what is missing

	// --- The broker: the stream and the replayed messages, all committed.
	end, err := r.checkCommitted()
	if err != nil {
		t.Fatalf("%v", err)
	}
	if end != int64(len(msgs)+s.replayed) {
		t.Errorf("the topic holds %d messages; %d were acknowledged and %d replayed", end, len(msgs), s.replayed)
	}

	// --- The provider: one PaymentIntent per event that may have one,
	// created under its event id, for its order, customer, saved method
	// and exact amount; no order charged twice; a stored 500 re-sent at
	// most once.
	st, err := r.stripeStats()
	if err != nil {
		t.Fatalf("provider stats: %v", err)
	}
	var books struct {
		Data []fakepsp.Payment `json:"data"`
	}
	if err := r.psp.getJSON("/_payments", &books); err != nil {
		t.Fatalf("provider payments: %v", err)
	}
	payments := map[string][]fakepsp.Payment{}
	succeededPerOrder := map[int64]int{}
	for _, p := range books.Data {
		payments[p.EventID] = append(payments[p.EventID], p)
		ev, ok := events[p.EventID]
		want := stripeWantOf(ev.CustomerID)
		switch {
		case !ok:
			t.Errorf("PaymentIntent %s (key %q, order %d) is not a valid event's", p.ID, p.IdempotencyKey, p.OrderID)
		case p.IdempotencyKey != p.EventID:
			t.Errorf("PaymentIntent %s of event %s was created under key %q", p.ID, p.EventID, p.IdempotencyKey)
		case p.OrderID != ev.OrderID || p.Customer != stripeCustomerRef(ev.CustomerID) || p.PaymentMethod != want.method ||
			p.Amount != ev.Amount.Minor || p.Currency != strings.ToLower(ev.Amount.Currency):
			t.Errorf("PaymentIntent %s of event %s: order %d %s %s %d %s, want order %d %s %s %d %s", p.ID, p.EventID,
				p.OrderID, p.Customer, p.PaymentMethod, p.Amount, p.Currency,
				ev.OrderID, stripeCustomerRef(ev.CustomerID), want.method, ev.Amount.Minor, strings.ToLower(ev.Amount.Currency))
		}
		if p.Status == "succeeded" {
			succeededPerOrder[p.OrderID]++
		}
	}
	for order, n := range succeededPerOrder {
		if n > 1 {
			res.double++
			t.Errorf("order %d has %d succeeded PaymentIntents", order, n)
		}
	}
	if st.OrdersChargedTwice != 0 {
		t.Errorf("provider ordersChargedTwice = %d", st.OrdersChargedTwice)
		res.double = max(res.double, int(st.OrdersChargedTwice))
	}
	for id, ev := range events {
		want, n := 0, len(payments[id])
		if stripeWantOf(ev.CustomerID).method != "" {
			want = 1
		}
		switch {
		case n > 1:
			t.Errorf("event %s (order %d): %d PaymentIntents created, want one", id, ev.OrderID, n)
		case n < want:
			lost[id] = "no PaymentIntent at the provider"
		case n > want:
			t.Errorf("event %s (order %d, customer %d with %s): a PaymentIntent, want none", id, ev.OrderID, ev.CustomerID, stripeMethodOf(ev.CustomerID))
		}
	}
	// A stored 500 is sent once more, then looked up. A request answered
	// 409 (the key in flight) arrived before the answer was stored and
	// changed nothing: not a send of the stored 500. Every other request
	// of the key reached it: the creating one, and the re-sends.
	sent := s.api.sentPerKey()
	resent := map[int]int{} // stored 500s by how many requests reached them
	for _, p := range books.Data {
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
	res.charges = len(books.Data)

	// --- The database: processed_event holds exactly the valid events;
	// each has one attempt, in the status its payment method chooses,
	// which is the provider's status of its PaymentIntent; none is left
	// open.
	db, err := postgres.Open(r.dsn, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var processed []string
	if err := db.Select(&processed, `SELECT event_id::text FROM processed_event WHERE consumer_group = $1`, r.group); err != nil {
		t.Fatalf("read processed_event: %v", err)
	}
	seen := map[string]bool{}
	for _, id := range processed {
		if seen[id] {
			t.Errorf("processed_event holds %s twice", id)
		}
		seen[id] = true
		if _, ok := events[id]; !ok {
			t.Errorf("processed_event holds %s, which is not a valid event", id)
		}
	}
	for id := range events {
		if !seen[id] {
			lost[id] += "; not in processed_event"
		}
	}
	rows, err := charge.Select(context.Background(), db, "")
	if err != nil {
		t.Fatalf("read charge: %v", err)
	}
	rowOf := map[string]charge.Row{}
	succeeded := map[int64]int{}
	unsettled := 0
	for _, row := range rows {
		id := row.EventID.String()
		rowOf[id] = row
		ev, ok := events[id]
		if !ok {
			t.Errorf("charge row for %s, which is not a valid event", id)
			continue
		}
		want := stripeWantOf(ev.CustomerID)
		if row.OrderID != ev.OrderID || row.CustomerID != ev.CustomerID || row.Amount != ev.Amount.Minor || row.Currency != ev.Amount.Currency {
			t.Errorf("charge row of %s: order %d customer %d %d %s, want order %d customer %d %d %s",
				id, row.OrderID, row.CustomerID, row.Amount, row.Currency, ev.OrderID, ev.CustomerID, ev.Amount.Minor, ev.Amount.Currency)
		}
		if charge.Open(row.Status) {
			unsettled++
		}
		if row.Status != want.status {
			t.Errorf("charge row of %s (customer %d, %s) is %s, want %s (last error %s)", id, ev.CustomerID, stripeMethodOf(ev.CustomerID), row.Status, want.status, deref(row.LastError))
		}
		pays := payments[id]
		switch {
		case len(pays) == 0 && row.Status != charge.Rejected:
			t.Errorf("charge row of %s is %s; the provider has no PaymentIntent for it", id, row.Status)
		case len(pays) == 1 && !sameStatus(row.Status, pays[0].Status):
			t.Errorf("charge row of %s is %s; the provider's PaymentIntent %s is %s", id, row.Status, pays[0].ID, pays[0].Status)
		case len(pays) == 1 && row.Status == charge.Succeeded && deref(row.ProviderChargeID) != pays[0].ID:
			t.Errorf("charge row of %s says PaymentIntent %q; the provider's is %s", id, deref(row.ProviderChargeID), pays[0].ID)
		}
		if row.Status == charge.Succeeded {
			succeeded[row.OrderID]++
		}
	}
	if unsettled > 0 {
		t.Errorf("%d charge attempts left pending or in_progress after the drain", unsettled)
	}
	for order, n := range succeeded {
		if n > 1 {
			res.double++
			t.Errorf("order %d has %d succeeded charge rows", order, n)
		}
	}
	for id := range events {
		if _, ok := rowOf[id]; !ok {
			lost[id] += "; no charge row"
		}
	}
	for _, ev := range events {
		res.settled += len(stripeWantOf(ev.CustomerID).outcomes)
	}

	// --- The outcome topic: every event's outcomes, each announced once
	// (distinct by eventId), in order: a parked event's payment.failed.v1
	// before the payment.succeeded.v1 of its replay.
	announced, err := r.stripeOutcomes(events)
	if err != nil {
		t.Fatalf("%v", err)
	}
	for id, ev := range events {
		want := stripeWantOf(ev.CustomerID).outcomes
		if got := announced[id]; !slices.Equal(got, want) {
			t.Errorf("event %s (customer %d, %s) announced %v, want %v", id, ev.CustomerID, stripeMethodOf(ev.CustomerID), got, want)
		}
	}
	for _, got := range announced {
		res.outcomes += len(got)
	}

	// --- The dead-letter topic: every invalid message, and the events of
	// the customers without a usable payment method, each with its reason.
	res.dlqRepark = r.checkStripeDLQ(msgs, events, byOrder)

	// --- The webhooks: forged and stale ones refused, every refusal
	// counted.
	wh := st.Stripe.Webhooks
	refused := s.counter(`billing_webhooks_total{result="refused"}`)
	answers, movedOn, noReplica := s.lb.stats()
	if wh.ForgedAccepted != 0 || wh.StaleAccepted != 0 {
		t.Errorf("billing accepted %d forged and %d stale webhooks", wh.ForgedAccepted, wh.StaleAccepted)
	}
	if copies := float64(wh.Forged + wh.Stale); refused > copies || refused < copies-float64(noReplica) {
		t.Errorf("billing refused %.0f webhooks; the provider posted %.0f forged or stale ones, %d of all webhooks found no replica", refused, copies, noReplica)
	}
	if refused != float64(answers[http.StatusBadRequest]) {
		t.Errorf("billing_webhooks_total{result=\"refused\"} is %.0f; the replicas answered %d webhooks 400", refused, answers[http.StatusBadRequest])
	}

	res.lost = len(lost)
	ids := slices.Sorted(maps.Keys(lost))
	for i, id := range ids {
		if i == 20 {
			t.Errorf("... %d lost events in all", len(ids))
			break
		}
		t.Errorf("lost event %s (order %d, customer %d): %s", id, events[id].OrderID, events[id].CustomerID, strings.TrimPrefix(lost[id], "; "))
	}

	r.logStripeFigures(stripeFigures{st: st, payments: books.Data, events: events, rows: rows, resent: resent,
		answers: answers, movedOn: movedOn, noReplica: noReplica, double: res.double, unsettled: unsettled, db: db})
	return res
}

// placesOf returns where the stream put the messages of the event id
// (partition/offset), marking duplicates and copies on another partition.
func (r *run) placesOf(id string) []string {
	var places []string
	for _, m := range r.stream.messages() {
		if m.kind == loadgen.Invalid || !bytes.Contains(m.value, []byte(id)) {
			continue
		}
		place := fmt.Sprintf("%d/%d", m.partition, m.offset)
		switch {
		case m.cross:
			place += " (copy on another partition)"
		case m.kind == loadgen.Duplicate:
			place += " (duplicate)"
		}
		places = append(places, place)
	}
	return places
}

// sameStatus reports whether an attempt's status is its PaymentIntent's.
func sameStatus(attempt, payment string) bool {
	return attempt == payment && (attempt == charge.Succeeded || attempt == charge.Declined)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// checkCommitted checks that the group committed every partition of the
// order topic to its end, and returns how many messages the topic holds.
func (r *run) checkCommitted() (int64, error) {
	end, err := kafka.EndOffsets(r.client, r.topic)
	if err != nil {
		return 0, fmt.Errorf("end offsets: %w", err)
	}
	committed, err := committedOffsets(r.client, r.group, r.topic)
	if err != nil {
		return 0, fmt.Errorf("committed offsets: %w", err)
	}
	var total int64
	for p := range int32(partitions) {
		total += end[p]
		if committed[p] != end[p] {
			r.t.Errorf("partition %d: committed offset %d, end offset %d (skipped or left behind)", p, committed[p], end[p])
		}
	}
	return total, nil
}

// stripeOutcomes reads the outcome topic and returns, by order event, the
// labels of its outcome events (outcomeLabel) in the order published, each
// eventId once; an outcome of another event, or with another order or
// amount than its event's, fails the run.
func (r *run) stripeOutcomes(events map[string]loadgen.Event) (map[string][]string, error) {
	msgs, err := r.readTopic(r.outcomeTopic)
	if err != nil {
		return nil, fmt.Errorf("read the outcome topic: %w", err)
	}
	// Outcomes are keyed by order, so one event's are in one partition,
	// in the order recorded.
	sort.SliceStable(msgs, func(i, j int) bool {
		return msgs[i].Partition < msgs[j].Partition || (msgs[i].Partition == msgs[j].Partition && msgs[i].Offset < msgs[j].Offset)
	})
	seen := map[string]bool{}
	announced := map[string][]string{}
	for _, m := range msgs {
		var o outcome
		if err := json.Unmarshal(m.Value, &o); err != nil {
			r.t.Errorf("outcome %d/%d is not JSON: %v", m.Partition, m.Offset, err)
			continue
		}
		if seen[o.EventID] {
			continue // a re-publication: the consumer deduplicates it
		}
		seen[o.EventID] = true
		ev, ok := events[o.CausationID]
		switch {
		case !ok:
			r.t.Errorf("outcome %s for %s, which is not a valid event", o.EventID, o.CausationID)
		case o.OrderID != ev.OrderID || string(o.TotalAmount) != ev.Amount.Decimal() || o.Currency != ev.Amount.Currency:
			r.t.Errorf("outcome %s of %s: order %d %s %s, want order %d %s %s", o.EventID, o.CausationID,
				o.OrderID, o.TotalAmount, o.Currency, ev.OrderID, ev.Amount.Decimal(), ev.Amount.Currency)
		}
		announced[o.CausationID] = append(announced[o.CausationID], outcomeLabel(o))
	}
	return announced, nil
}

// checkStripeDLQ checks the dead-letter topic: each message parked
// unchanged from where it came from, invalid ones as invalid-event, valid
// ones with the reason their customer's payment method gives (none, or one
// Stripe does not know); every invalid message and every such event parked
// at least once. It returns how many messages were parked more than once
// from the same place.
func (r *run) checkStripeDLQ(msgs []*sent, events map[string]loadgen.Event, byOrder map[int64]string) int {
	t := r.t
	at := map[position]*sent{}
	for _, m := range msgs {
		at[position{m.partition, m.offset}] = m
	}
	parked := map[position]int{}
	parkedEvents := map[string]bool{}
	dlqs, err := r.readTopic(r.dlqTopic)
	if err != nil {
		t.Fatalf("read the DLQ: %v", err)
	}
	repark := 0
	for _, d := range dlqs {
		why := reason.Parse(kafkatest.Header(d, dlq.HeaderReason))
		part, perr := strconv.ParseInt(kafkatest.Header(d, dlq.HeaderOriginalPartition), 10, 32)
		off, oerr := strconv.ParseInt(kafkatest.Header(d, dlq.HeaderOriginalOffset), 10, 64)
		where := fmt.Sprintf("DLQ message %d/%d (%s)", d.Partition, d.Offset, why.Code)
		if perr != nil || oerr != nil {
			t.Errorf("%s: x-original-partition/offset unreadable: %v %v", where, perr, oerr)
			continue
		}
		pos := position{int32(part), off}
		orig, ok := at[pos]
		if !ok {
			t.Errorf("%s: from %d/%d, which the stream did not publish", where, pos.partition, pos.offset)
			continue
		}
		if !bytes.Equal(d.Value, orig.value) || !bytes.Equal(d.Key, orig.key) {
			t.Errorf("%s: key or value differ from the original at %d/%d", where, pos.partition, pos.offset)
		}
		if parked[pos]++; parked[pos] > 1 {
			repark++
		}
		if orig.kind == loadgen.Invalid {
			if why.Code != reason.InvalidEvent {
				t.Errorf("%s: an invalid message (%s) parked as %q", where, orig.defect, why.Code)
			}
			continue
		}
		id := byOrder[orig.orderID]
		customer := events[id].CustomerID
		if want := stripeWantOf(customer).parked; want == "" || why.Code != want {
			t.Errorf("%s: event %s of customer %d (%s) parked as %q: %s", where, id, customer, stripeMethodOf(customer), why.Code, why.Detail)
			continue
		}
		parkedEvents[id] = true
	}
	for pos, m := range at {
		if m.kind == loadgen.Invalid && parked[pos] == 0 {
			t.Errorf("invalid message at %d/%d (%s) is not in the DLQ", pos.partition, pos.offset, m.defect)
		}
	}
	for id, ev := range events {
		if stripeWantOf(ev.CustomerID).parked != "" && !parkedEvents[id] {
			t.Errorf("event %s of customer %d (%s) was never parked", id, ev.CustomerID, stripeMethodOf(ev.CustomerID))
		}
	}
	return repark
}

// stripeFigures is what the figures are computed from.
type stripeFigures struct {
	st        fakepsp.Stats
	payments  []fakepsp.Payment
	events    map[string]loadgen.Event
	rows      []charge.Row
	resent    map[int]int // stored 500s by how many requests reached them
	answers   map[int]int // the replicas' answers to webhooks, by status
	movedOn   int         // webhooks tried on another replica after a refused connection
	noReplica int         // webhooks no replica answered (502)
	double    int
	unsettled int
	db        *sqlx.DB
}

// logStripeFigures logs, in one block, the figures issue 39's closing note
// gives.
func (r *run) logStripeFigures(f stripeFigures) {
	s := r.stripe
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
		formatCounts(s.countersOf("billing_webhooks_total")), f.answers, f.movedOn, f.noReplica,
		lk.Retrieve, lk.Search, lk.List, lk.NotFound, lk.Rejected, formatCounts(s.countersOf("billing_payment_lookups_total")),
		f.st.Stripe.Stored500s, strings.Join(resent, ", "), stored500,
		f.double, f.unsettled,
		s.settledAfter.Round(100*time.Millisecond), s.replayed, s.replayCharged.Round(100*time.Millisecond))
	r.figure("stored 500→settle %s; webhooks refused %.0f of %d forged+stale", short, s.counter(`billing_webhooks_total{result="refused"}`), wh.Forged+wh.Stale)
}

// formatCounts formats counters by label as "a 1, b 2", sorted.
func formatCounts(m map[string]float64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %.0f", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// --- the load balancer in front of the webhooks ---

// webhookBalancer is the one URL the provider posts its webhooks to, as
// Stripe posts to one endpoint behind a load balancer: it sends each to
// the next replica in turn, moves on to the next one when a replica
// refuses the connection (restarting, not listening yet), and answers 502
// when none answers, so that the provider tries again later. A replica
// being stopped is first taken out (drain), as a load balancer
// deregisters it.
type webhookBalancer struct {
	srv      *http.Server
	url      string
	backends func() []string
	// client opens a connection per webhook: a replica that stopped
	// listening shows as a refused connection, never as a kept-alive one
	// it closes under a request.
	client *http.Client

	mu        sync.Mutex
	next      int
	out       map[string]bool // replicas taken out
	inFlight  map[string]int
	answers   map[int]int // the replicas' answers, by status
	movedOn   int
	noReplica int
}

// errTakenOut: the replica was taken out between its choice and the send.
var errTakenOut = errors.New("replica taken out of the load balancer")

// startWebhookBalancer serves on a free loopback port; backends returns
// the replicas' WEBHOOK_ADDRs at each webhook.
func startWebhookBalancer(backends func() []string) (*webhookBalancer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("webhook load balancer: %w", err)
	}
	b := &webhookBalancer{
		url:      "http://" + ln.Addr().String(),
		backends: backends,
		client:   &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}},
		out:      map[string]bool{},
		inFlight: map[string]int{},
		answers:  map[int]int{},
	}
	b.srv = &http.Server{Handler: b, ReadHeaderTimeout: 5 * time.Second}
	// Serve returns http.ErrServerClosed once close is called.
	go func() { _ = b.srv.Serve(ln) }()
	return b, nil
}

func (b *webhookBalancer) close() { _ = b.srv.Close() }

func (b *webhookBalancer) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	for _, addr := range b.turn() {
		resp, answer, err := b.send(req, addr, body)
		var op *net.OpError
		switch {
		case errors.Is(err, errTakenOut):
			continue
		case errors.As(err, &op) && op.Op == "dial":
			// Nothing was sent: the next replica may take it.
			b.mu.Lock()
			b.movedOn++
			b.mu.Unlock()
			continue
		case err != nil:
			// Sent, and no answer: whether the replica recorded it is
			// unknown, and the provider sends it again.
			b.fail(w)
			return
		}
		b.mu.Lock()
		b.answers[resp.StatusCode]++
		b.mu.Unlock()
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(answer) // the provider has gone: it sends it again
		return
	}
	b.fail(w)
}

func (b *webhookBalancer) fail(w http.ResponseWriter) {
	b.mu.Lock()
	b.noReplica++
	b.mu.Unlock()
	http.Error(w, "no replica answered", http.StatusBadGateway)
}

// turn returns the replicas in service, the next one in turn first.
func (b *webhookBalancer) turn() []string {
	addrs := b.backends()
	b.mu.Lock()
	defer b.mu.Unlock()
	addrs = slices.DeleteFunc(addrs, func(a string) bool { return b.out[a] })
	if len(addrs) == 0 {
		return nil
	}
	first := b.next % len(addrs)
	b.next++
	return slices.Concat(addrs[first:], addrs[:first])
}

// send posts the webhook to addr and returns its answer.
func (b *webhookBalancer) send(req *http.Request, addr string, body []byte) (*http.Response, []byte, error) {
	b.mu.Lock()
	if b.out[addr] {
		b.mu.Unlock()
		return nil, nil, errTakenOut
	}
	b.inFlight[addr]++
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.inFlight[addr]--
		b.mu.Unlock()
	}()
	fwd, err := http.NewRequestWithContext(req.Context(), req.Method, "http://"+addr+req.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	fwd.Header = req.Header.Clone()
	resp, err := b.client.Do(fwd)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	return resp, answer, err
}

// drain takes addr out of service and waits until the webhooks sent to it
// are answered.
func (b *webhookBalancer) drain(addr string) error {
	b.mu.Lock()
	b.out[addr] = true
	b.mu.Unlock()
	deadline := time.Now().Add(b.client.Timeout + 5*time.Second)
	for {
		b.mu.Lock()
		n := b.inFlight[addr]
		b.mu.Unlock()
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("load balancer: %d webhooks to %s unanswered after %s", n, addr, b.client.Timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stats returns the replicas' answers by status, how many webhooks moved
// on to another replica after a refused connection, and how many found no
// replica.
func (b *webhookBalancer) stats() (answers map[int]int, movedOn, noReplica int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.answers), b.movedOn, b.noReplica
}

// --- the requests per key ---

// keyCounter is a reverse proxy in front of the provider's API, which the
// replicas call (PAYMENT_BASE_URL, with the replica's name as the first
// element of the path): it notes every POST /v1/payment_intents by its
// Idempotency-Key, who sent it and what it was answered, which the
// provider's books do not keep, and logs every request (charges and
// lookups) with its replica to a file beside the processes' logs.
type keyCounter struct {
	srv *http.Server
	url string
	log *os.File

	mu   sync.Mutex
	sent map[string][]send // by Idempotency-Key, in the order answered
}

// send is one request of a key.
type send struct {
	replica string
	status  int // 502: the provider did not answer
	at      time.Time
}

// startKeyCounter serves on a free loopback port, forwarding to the
// provider at target, its log at logPath.
func startKeyCounter(target, logPath string) (*keyCounter, error) {
	backend, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("key counter: %w", err)
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("key counter: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		logf.Close()
		return nil, fmt.Errorf("key counter: %w", err)
	}
	k := &keyCounter{url: "http://" + ln.Addr().String(), log: logf, sent: map[string][]send{}}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(backend) },
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			http.Error(w, err.Error(), http.StatusBadGateway)
		},
	}
	k.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		replica, path, _ := strings.Cut(strings.TrimPrefix(req.URL.Path, "/"), "/")
		req.URL.Path, req.URL.RawPath = "/"+path, ""
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		began := time.Now()
		proxy.ServeHTTP(rec, req)
		key := req.Header.Get("Idempotency-Key")
		k.note(req, key, send{replica: replica, status: rec.status, at: time.Now()}, began)
	})}
	// Serve returns http.ErrServerClosed once close is called.
	go func() { _ = k.srv.Serve(ln) }()
	return k, nil
}

func (k *keyCounter) close() {
	_ = k.srv.Close()
	k.mu.Lock()
	defer k.mu.Unlock()
	k.log.Close()
}

// note logs one request, answered s.status, and counts it when it
// creates a PaymentIntent.
func (k *keyCounter) note(req *http.Request, key string, s send, began time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	// A line lost to a full disk costs a diagnosis, not the judge's
	// counts.
	_, _ = fmt.Fprintf(k.log, "%s %s %s %s key=%q %d in %s\n", began.UTC().Format(time.RFC3339Nano), s.replica, req.Method,
		req.URL.RequestURI(), key, s.status, s.at.Sub(began).Round(time.Millisecond))
	if req.Method == http.MethodPost && req.URL.Path == "/v1/payment_intents" {
		k.sent[key] = append(k.sent[key], s)
	}
}

// sentPerKey returns every key's requests.
func (k *keyCounter) sentPerKey() map[string][]send {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make(map[string][]send, len(k.sent))
	for key, sends := range k.sent {
		out[key] = slices.Clone(sends)
	}
	return out
}

// statusRecorder notes the status a handler answers with.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(status int) {
	s.status = status
	s.ResponseWriter.WriteHeader(status)
}
