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
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/testenv/kafkatest"
)

// What the scenarios on a real provider's API share (stripe_test.go,
// adyen_test.go): serve speaks the provider's API to `billing fakepsp
// --profile <provider>`, whose requests reach it through a proxy that
// counts them per Idempotency-Key and replica, and whose webhooks reach
// the replicas through one load balancer, as a provider posts to one
// endpoint. Each customer's saved payment method chooses what a charge
// comes to; the customers without one are parked no-payment-method until
// their methods are imported and the parked events replayed. The judge
// compares billing with the provider's books (GET /_payments): one payment
// per event that may have one, no order charged twice, every attempt's
// final status the provider's, none left open, each outcome event once.

const (
	// loadgenCustomers: loadgen draws customer ids in 1..50,000.
	loadgenCustomers = 50_000
	// providerSettleLimit bounds each wait for every payment to be
	// settled.
	providerSettleLimit = 2 * time.Minute
)

// providerSpec is what a provider's scenario sets: how fakepsp and serve
// are configured, the mix of payment methods by customer, and its own
// part of the judge.
type providerSpec struct {
	// name is PAYMENT_PROVIDER, fakepsp's profile and the webhook path's
	// last element.
	name string
	// fakeArgs are fakepsp's flags besides --profile, --seed, --latency
	// and --webhook-url; fakeEnv is its environment.
	fakeArgs []string
	fakeEnv  map[string]string
	// serveEnv is serve's provider configuration, but PAYMENT_BASE_URL
	// (the counting proxy's, with the replica's name) and WEBHOOK_ADDR.
	serveEnv map[string]string
	// apiRoot follows the replica's name in PAYMENT_BASE_URL (Adyen's
	// Checkout version); chargePath is the path of the request that
	// creates a payment, as fakepsp serves it.
	apiRoot, chargePath string
	// methodOf is the payment method saved for a customer before the
	// stream, "" for none; lateMethod is what those without one get after
	// the stream, before their parked events are replayed.
	methodOf   func(customer int64) string
	lateMethod string
	// customerRef is a customer's id at the provider.
	customerRef func(customer int64) string
	// wantOf is what a valid event of a customer must come to.
	wantOf func(customer int64) providerWant
	// currency is an event's currency as the provider's books write it.
	currency func(string) string
	// processing is how many payments the provider has not decided yet.
	processing func(fakepsp.Stats) int64
	// prepare, when set, runs once the load balancer is started and
	// before fakepsp is.
	prepare func(r *run, p *providerRun) error
	// faults counts the provider's injected faults once every payment is
	// settled.
	faults func(r *run, st fakepsp.Stats)
	// verify is the provider's own part of the judge, after the common
	// one (verifyProvider); it logs the figures.
	verify func(r *run, j *judged)
}

// providerWant is what one valid event must come to.
type providerWant struct {
	// method is the payment method its payment charges ("" when none may
	// exist).
	method string
	status string      // its attempt's final status
	parked reason.Code // "" when it is never parked
	// outcomes are its outcome events, in order, as type/reason.
	outcomes []string
}

// providerRun is a provider scenario's wiring: the webhooks' load
// balancer, the proxy that counts the requests per key, and what the run
// gathered from the replicas. Its fields are the test goroutine's: the
// scenario's inject, check and verify run on it one after another.
type providerRun struct {
	*providerSpec
	lb  *webhookBalancer
	api *keyCounter

	// counters sums, over every serve process, the series of
	// providerCounters, each read once the process got its last webhook
	// (retire).
	counters map[string]float64
	// replayed is how many parked messages billing dlq replay republished
	// to the order topic.
	replayed int
	// settledAfter is how long after the group caught up every payment
	// was settled; replayCharged how long after the replay started its
	// events were all charged.
	settledAfter, replayCharged time.Duration
	// adyen is what the adyen scenario sees of the notifications.
	adyen *adyenWatch
}

// providerCounters are the metrics summed over the replicas.
var providerCounters = []string{"billing_webhooks_total", "billing_payment_lookups_total", "billing_payment_replays_total"}

// startProvider starts the webhooks' load balancer, fakepsp with spec's
// profile posting to it, and the counting proxy in front of fakepsp's
// API; each is stopped when the run ends.
func (r *run) startProvider(spec *providerSpec) (*providerRun, error) {
	p := &providerRun{providerSpec: spec, counters: map[string]float64{}}
	var err error
	if p.lb, err = startWebhookBalancer(r.webhookBackends); err != nil {
		return nil, err
	}
	r.t.Cleanup(p.lb.close)
	if spec.prepare != nil {
		if err := spec.prepare(r, p); err != nil {
			return nil, err
		}
	}
	args := append([]string{"--profile", spec.name, "--seed", fmt.Sprint(r.seed), "--latency", r.sc.latency.String(),
		"--webhook-url", p.lb.url + "/webhooks/" + spec.name}, spec.fakeArgs...)
	if r.psp, err = startPSP(filepath.Join(r.dir, "fakepsp.log"), spec.fakeEnv, args...); err != nil {
		return nil, err
	}
	r.t.Cleanup(r.stopPSP)
	if p.api, err = startKeyCounter(r.psp.url, spec.chargePath, filepath.Join(r.dir, "provider-requests.log")); err != nil {
		return nil, err
	}
	r.t.Cleanup(p.api.close)
	return p, nil
}

// baseURL is the PAYMENT_BASE_URL of the serve process named replica:
// the counting proxy's, which knows by it who sent each request.
func (p *providerRun) baseURL(replica string) string {
	return p.api.url + "/" + replica + p.apiRoot
}

// env is the provider configuration of the serve process named replica,
// besides its WEBHOOK_ADDR.
func (p *providerRun) env(replica string) map[string]string {
	env := maps.Clone(p.serveEnv)
	env["PAYMENT_PROVIDER"] = p.name
	env["PAYMENT_BASE_URL"] = p.baseURL(replica)
	return env
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
func (p *providerRun) retire(r *run, c *consumer) {
	if err := p.lb.drain(c.webhook); err != nil {
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
		if name, _, _ := strings.Cut(series, "{"); slices.Contains(providerCounters, name) {
			p.counters[series] += v
		}
	}
}

// counter returns the run's sum of one series, e.g.
// billing_webhooks_total{result="refused"}.
func (p *providerRun) counter(series string) float64 {
	return p.counters[series]
}

// countersOf returns the run's sums of metric's series by their label
// value, e.g. billing_webhooks_total by result.
func (p *providerRun) countersOf(metric string) map[string]float64 {
	out := map[string]float64{}
	for series, v := range p.counters {
		name, labels, _ := strings.Cut(series, "{")
		if name == metric {
			_, value, _ := strings.Cut(strings.TrimSuffix(labels, "}"), "=")
			out[strings.Trim(value, `"`)] += v
		}
	}
	return out
}

// importProviderMethods saves, through billing payment-methods import,
// the payment method of every customer the stream can use that the
// provider's methodOf gives one.
func importProviderMethods(r *run) error {
	_, err := r.importMethods("payment-methods-import", r.provider.methodOf)
	return err
}

// importMethods imports method(customer) for every customer the stream
// can use that it gives one, and returns how many it imported.
func (r *run) importMethods(name string, method func(customer int64) string) (int, error) {
	p := r.provider
	var csv bytes.Buffer
	csv.WriteString("customer_id,customer_ref,payment_method_ref\n")
	n := 0
	for customer := int64(1); customer <= loadgenCustomers; customer++ {
		if pm := method(customer); pm != "" {
			fmt.Fprintf(&csv, "%d,%s,%s\n", customer, p.customerRef(customer), pm)
			n++
		}
	}
	out, err := r.billingCommand(name, map[string]string{"DATABASE_URL": r.dsn, "PAYMENT_PROVIDER": p.name}, &csv, "payment-methods", "import",
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
// suite it dies with the suite. An exit status other than 0 is an error
// that wraps the *exec.ExitError.
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

// injectProviderRollingRestart replaces the two replicas one at a time
// mid-stream: each is taken out of the load balancer, stopped with
// SIGTERM and started again, and the next one waits until it is ready.
func injectProviderRollingRestart(r *run) {
	rng := r.rng(r.provider.name + "-rolling")
	d := r.stream.duration()
	r.sleepUntil(between(rng, d/4, d/3))
	for _, c := range r.running() {
		slot := r.slotOf(c)
		r.provider.retire(r, c)
		r.stop(c, "sigterm")
		if n := r.startInSlot(slot); n != nil {
			if err := n.waitReady(time.Minute); err != nil {
				r.t.Errorf("%s after the rolling restart: %v", n.name, err)
			}
		}
		r.faultOver()
	}
}

// checkProvider runs once the group caught up: it waits until every
// payment is settled, imports a payment method for the customers that had
// none, replays their parked events and waits until those are charged
// too; then, also when that failed, the replicas are retired (their
// counters read) before they are stopped.
func checkProvider(r *run) {
	p := r.provider
	defer func() {
		for _, c := range r.running() {
			p.retire(r, c)
		}
	}()
	db, err := postgres.Open(r.dsn, 1)
	if err != nil {
		r.t.Errorf("open database: %v", err)
		return
	}
	defer db.Close()
	if !r.waitSettled(db) {
		return
	}
	r.mu.Lock()
	p.settledAfter = time.Since(r.lagZero)
	r.mu.Unlock()

	replayStart := time.Now()
	late := func(customer int64) string {
		if p.methodOf(customer) == "" {
			return p.lateMethod
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
	if !r.waitCaughtUp(time.Minute) || !r.waitSettled(db) {
		return
	}
	p.replayCharged = time.Since(replayStart)
	r.waitOutboxPublished(time.Minute)

	st, err := r.pspStats()
	if err != nil {
		r.t.Errorf("provider stats: %v", err)
	}
	p.faults(r, st)
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
	r.provider.replayed = n
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

// waitSettled waits, at most providerSettleLimit, until nothing waits for
// an outcome: no webhook left to deliver, no payment processing at the
// provider, no charge attempt pending or in_progress.
func (r *run) waitSettled(db *sqlx.DB) bool {
	began := time.Now()
	told := began
	for {
		left, err := r.unsettled(db)
		if err == nil && left == "" {
			r.t.Logf("[+%s] every payment settled and every webhook delivered (waited %s)", r.elapsed(), time.Since(began).Round(100*time.Millisecond))
			return true
		}
		if err == nil && time.Since(told) >= 5*time.Second {
			r.t.Logf("[+%s] still open: %s", r.elapsed(), left)
			told = time.Now()
		}
		if time.Since(began) > providerSettleLimit {
			if err != nil {
				left = err.Error()
			}
			r.t.Errorf("not settled within %s: %s", providerSettleLimit, left)
			return false
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// unsettled says what still waits for an outcome, "" when nothing.
func (r *run) unsettled(db *sqlx.DB) (string, error) {
	st, err := r.pspStats()
	if err != nil {
		return "", err
	}
	var pending, inProgress int
	const q = `SELECT count(*) FILTER (WHERE status = $1), count(*) FILTER (WHERE status = $2) FROM charge`
	if err := db.QueryRow(q, charge.Pending, charge.InProgress).Scan(&pending, &inProgress); err != nil {
		return "", err
	}
	processing := r.provider.processing(st)
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

func (r *run) pspStats() (fakepsp.Stats, error) {
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

// judged is what the common judge (verifyProvider) read and found, for
// the provider's own part and its figures.
type judged struct {
	res *result
	st  fakepsp.Stats
	// payments are the provider's books, byEvent the same by event id.
	payments []fakepsp.Payment
	byEvent  map[string][]fakepsp.Payment
	events   map[string]loadgen.Event
	rows     []charge.Row
	rowOf    map[string]charge.Row // by event id
	// unsettled counts the attempts left pending or in_progress.
	unsettled int
	db        *sqlx.DB
}

// verifyProvider is verify for a provider scenario, once every consumer
// has stopped: the provider's books are its payments (GET /_payments),
// and what each event must come to is chosen by its customer's payment
// method (wantOf). It ends with the provider's own part of the judge,
// which gives the figures.
func (r *run) verifyProvider() result {
	t := r.t
	p := r.provider
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
	if end != int64(len(msgs)+p.replayed) {
		t.Errorf("the topic holds %d messages; %d were acknowledged and %d replayed", end, len(msgs), p.replayed)
	}

	// --- The provider: one payment per event that may have one, created
	// under its event id, for its order, customer, saved method and exact
	// amount; no order charged twice.
	st, err := r.pspStats()
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
	for _, pay := range books.Data {
		payments[pay.EventID] = append(payments[pay.EventID], pay)
		ev, ok := events[pay.EventID]
		want := p.wantOf(ev.CustomerID)
		switch {
		case !ok:
			t.Errorf("payment %s (key %q, order %d) is not a valid event's", pay.ID, pay.IdempotencyKey, pay.OrderID)
		case pay.IdempotencyKey != pay.EventID:
			t.Errorf("payment %s of event %s was created under key %q", pay.ID, pay.EventID, pay.IdempotencyKey)
		case pay.OrderID != ev.OrderID || pay.Customer != p.customerRef(ev.CustomerID) || pay.PaymentMethod != want.method ||
			pay.Amount != ev.Amount.Minor || pay.Currency != p.currency(ev.Amount.Currency):
			t.Errorf("payment %s of event %s: order %d %s %s %d %s, want order %d %s %s %d %s", pay.ID, pay.EventID,
				pay.OrderID, pay.Customer, pay.PaymentMethod, pay.Amount, pay.Currency,
				ev.OrderID, p.customerRef(ev.CustomerID), want.method, ev.Amount.Minor, p.currency(ev.Amount.Currency))
		}
		if pay.Status == "succeeded" {
			succeededPerOrder[pay.OrderID]++
		}
	}
	for order, n := range succeededPerOrder {
		if n > 1 {
			res.double++
			t.Errorf("order %d has %d succeeded payments", order, n)
		}
	}
	if st.OrdersChargedTwice != 0 {
		t.Errorf("provider ordersChargedTwice = %d", st.OrdersChargedTwice)
		res.double = max(res.double, int(st.OrdersChargedTwice))
	}
	for id, ev := range events {
		want, n := 0, len(payments[id])
		if p.wantOf(ev.CustomerID).method != "" {
			want = 1
		}
		switch {
		case n > 1:
			t.Errorf("event %s (order %d): %d payments created, want one", id, ev.OrderID, n)
		case n < want:
			lost[id] = "no payment at the provider"
		case n > want:
			t.Errorf("event %s (order %d, customer %d with %s): a payment, want none", id, ev.OrderID, ev.CustomerID, p.methodOf(ev.CustomerID))
		}
	}
	res.charges = len(books.Data)

	// --- The database: processed_event holds exactly the valid events;
	// each has one attempt, in the status its payment method chooses,
	// which is the provider's status of its payment; none is left open.
	db, err := postgres.Open(r.dsn, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	r.checkProcessed(db, events, lost)
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
		want := p.wantOf(ev.CustomerID)
		if row.OrderID != ev.OrderID || row.CustomerID != ev.CustomerID || row.Amount != ev.Amount.Minor || row.Currency != ev.Amount.Currency {
			t.Errorf("charge row of %s: order %d customer %d %d %s, want order %d customer %d %d %s",
				id, row.OrderID, row.CustomerID, row.Amount, row.Currency, ev.OrderID, ev.CustomerID, ev.Amount.Minor, ev.Amount.Currency)
		}
		if charge.Open(row.Status) {
			unsettled++
		}
		if row.Status != want.status {
			t.Errorf("charge row of %s (customer %d, %s) is %s, want %s (last error %s)", id, ev.CustomerID, p.methodOf(ev.CustomerID), row.Status, want.status, deref(row.LastError))
		}
		pays := payments[id]
		switch {
		case len(pays) == 0 && row.Status != charge.Rejected:
			t.Errorf("charge row of %s is %s; the provider has no payment for it", id, row.Status)
		case len(pays) == 1 && !sameStatus(row.Status, pays[0].Status):
			t.Errorf("charge row of %s is %s; the provider's payment %s is %s", id, row.Status, pays[0].ID, pays[0].Status)
		case len(pays) == 1 && row.Status == charge.Succeeded && deref(row.ProviderChargeID) != pays[0].ID:
			t.Errorf("charge row of %s says payment %q; the provider's is %s", id, deref(row.ProviderChargeID), pays[0].ID)
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
		res.settled += len(p.wantOf(ev.CustomerID).outcomes)
	}

	// --- The outcome topic: every event's outcomes, each announced once
	// (distinct by eventId), in order: a parked event's payment.failed.v1
	// before the payment.succeeded.v1 of its replay.
	announced, err := r.outcomesByEvent(events)
	if err != nil {
		t.Fatalf("%v", err)
	}
	for id, ev := range events {
		want := p.wantOf(ev.CustomerID).outcomes
		if got := announced[id]; !slices.Equal(got, want) {
			t.Errorf("event %s (customer %d, %s) announced %v, want %v", id, ev.CustomerID, p.methodOf(ev.CustomerID), got, want)
		}
	}
	for _, got := range announced {
		res.outcomes += len(got)
	}

	// --- The dead-letter topic: every invalid message, and the events of
	// the customers without a usable payment method, each with its reason.
	res.dlqRepark = r.checkProviderDLQ(msgs, events, byOrder)

	res.lost = len(lost)
	ids := slices.Sorted(maps.Keys(lost))
	for i, id := range ids {
		if i == 20 {
			t.Errorf("... %d lost events in all", len(ids))
			break
		}
		t.Errorf("lost event %s (order %d, customer %d): %s", id, events[id].OrderID, events[id].CustomerID, strings.TrimPrefix(lost[id], "; "))
	}

	p.verify(r, &judged{res: &res, st: st, payments: books.Data, byEvent: payments, events: events, rows: rows, rowOf: rowOf,
		unsettled: unsettled, db: db})
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

// sameStatus reports whether an attempt's status is its payment's.
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

// outcomesByEvent reads the outcome topic and returns, by order event,
// the labels of its outcome events (outcomeLabel) in the order published,
// each eventId once; an outcome of another event, or with another order
// or amount than its event's, fails the run.
func (r *run) outcomesByEvent(events map[string]loadgen.Event) (map[string][]string, error) {
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

// checkProviderDLQ checks the dead-letter topic: each message parked
// unchanged from where it came from, invalid ones as invalid-event, valid
// ones with the reason their customer's payment method gives (none, or
// one the provider refuses); every invalid message and every such event
// parked at least once. It returns how many messages were parked more
// than once from the same place.
func (r *run) checkProviderDLQ(msgs []*sent, events map[string]loadgen.Event, byOrder map[int64]string) int {
	t := r.t
	p := r.provider
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
		if want := p.wantOf(customer).parked; want == "" || why.Code != want {
			t.Errorf("%s: event %s of customer %d (%s) parked as %q: %s", where, id, customer, p.methodOf(customer), why.Code, why.Detail)
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
		if p.wantOf(ev.CustomerID).parked != "" && !parkedEvents[id] {
			t.Errorf("event %s of customer %d (%s) was never parked", id, ev.CustomerID, p.methodOf(ev.CustomerID))
		}
	}
	return repark
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

// webhookBalancer is the one URL the provider posts its webhooks to, as a
// provider posts to one endpoint behind a load balancer: it sends each to
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
	// answered, when set, is told of every answer of a replica before it
	// is relayed, and returns true to lose it on the way back: the
	// provider is answered 502 instead, as when the connection breaks
	// after the replica answered. It is told of a webhook no replica
	// answered too, with status 0 (and addr "" when none was tried).
	answered func(addr string, body []byte, status int, answer []byte) (lose bool)

	mu        sync.Mutex
	next      int
	out       map[string]bool // replicas taken out
	inFlight  map[string]int
	answers   map[int]int // the replicas' answers, by status
	movedOn   int
	noReplica int
	unknown   int // webhooks sent to a replica that did not answer
	lostAcks  int // answers answered lost
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
			b.mu.Lock()
			b.unknown++
			b.mu.Unlock()
			if b.answered != nil {
				b.answered(addr, body, 0, nil)
			}
			b.fail(w)
			return
		}
		b.mu.Lock()
		b.answers[resp.StatusCode]++
		b.mu.Unlock()
		if b.answered != nil && b.answered(addr, body, resp.StatusCode, answer) {
			b.mu.Lock()
			b.lostAcks++
			b.mu.Unlock()
			http.Error(w, "the replica's answer was lost", http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(answer) // the provider has gone: it sends it again
		return
	}
	if b.answered != nil {
		b.answered("", body, 0, nil)
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

// balancerStats is what the load balancer saw.
type balancerStats struct {
	answers map[int]int // the replicas' answers, by status
	// movedOn counts the webhooks tried on another replica after a
	// refused connection; noReplica those no replica answered (502),
	// unknown among them those a replica got and did not answer.
	movedOn, noReplica, unknown int
	lostAcks                    int // replicas' answers lost on the way back (answered)
}

func (b *webhookBalancer) stats() balancerStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return balancerStats{answers: maps.Clone(b.answers), movedOn: b.movedOn, noReplica: b.noReplica, unknown: b.unknown, lostAcks: b.lostAcks}
}

// --- the requests per key ---

// keyCounter is a reverse proxy in front of the provider's API, which the
// replicas call (PAYMENT_BASE_URL, with the replica's name as the first
// element of the path): it notes every POST to the path that creates a
// payment by its Idempotency-Key, who sent it and what it was answered,
// which the provider's books do not keep, and logs every request (charges
// and lookups) with its replica to a file beside the processes' logs.
type keyCounter struct {
	srv        *http.Server
	url        string
	chargePath string
	log        *os.File

	mu   sync.Mutex
	sent map[string][]send // by Idempotency-Key, in the order answered
}

// send is one request of a key.
type send struct {
	replica string
	status  int // 502: the provider did not answer (nor the proxy)
	at      time.Time
}

// startKeyCounter serves on a free loopback port, forwarding to the
// provider at target and counting the POSTs to chargePath, its log at
// logPath.
func startKeyCounter(target, chargePath, logPath string) (*keyCounter, error) {
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
	k := &keyCounter{url: "http://" + ln.Addr().String(), chargePath: chargePath, log: logf, sent: map[string][]send{}}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(backend) },
		// A connection per request: on a kept-alive connection that
		// breaks, Go's transport sends a request with an Idempotency-Key
		// again on its own, which billing, not the proxy, must decide.
		Transport: &http.Transport{DisableKeepAlives: true},
		// The provider did not answer (it reset the connection, as the
		// adyen profile does after charging): neither does the proxy,
		// whose caller sees its connection break (ServeHTTP below).
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, _ error) {
			w.(*statusRecorder).lost = true
		},
	}
	k.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		replica, path, _ := strings.Cut(strings.TrimPrefix(req.URL.Path, "/"), "/")
		req.URL.Path, req.URL.RawPath = "/"+path, ""
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		began := time.Now()
		proxy.ServeHTTP(rec, req)
		status := rec.status
		if rec.lost {
			status = http.StatusBadGateway
		}
		key := req.Header.Get("Idempotency-Key")
		k.note(req, key, send{replica: replica, status: status, at: time.Now()}, began)
		if rec.lost {
			// The server closes the connection without an answer.
			panic(http.ErrAbortHandler)
		}
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
// creates a payment.
func (k *keyCounter) note(req *http.Request, key string, s send, began time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	// A line lost to a full disk costs a diagnosis, not the judge's
	// counts.
	_, _ = fmt.Fprintf(k.log, "%s %s %s %s key=%q %d in %s\n", began.UTC().Format(time.RFC3339Nano), s.replica, req.Method,
		req.URL.RequestURI(), key, s.status, s.at.Sub(began).Round(time.Millisecond))
	if req.Method == http.MethodPost && req.URL.Path == k.chargePath {
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

// statusRecorder notes the status a handler answers with, and whether the
// provider left the request unanswered.
type statusRecorder struct {
	http.ResponseWriter
	status int
	lost   bool
}

func (s *statusRecorder) WriteHeader(status int) {
	s.status = status
	s.ResponseWriter.WriteHeader(status)
}
