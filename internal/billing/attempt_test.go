package billing_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/trace/noop"

	"example.com/billing/internal/billing"
	"example.com/billing/internal/dedup"
	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/dlq/reason"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/payment"
	"example.com/billing/internal/payment/contract"
)

// restart returns a Processor on f's database and provider with nothing in
// memory, as after a kill -9 of the process that ran f.proc.
func (f *fixture) restart(t *testing.T) (*billing.Processor, *metrics.Metrics) {
	t.Helper()
	srv := httptest.NewServer(f.psp)
	t.Cleanup(srv.Close)
	m := metrics.New(prometheus.NewRegistry())
	payer := payment.New(contract.New(srv.URL, ""), payment.Config{Timeout: 5 * time.Second, MaxConcurrency: 64}, m)
	t.Cleanup(payer.Close)
	horizon := billing.Horizon{Retention: 7 * 24 * time.Hour, MaxFutureSkew: time.Hour, ProviderWindow: 24 * time.Hour}
	return running(t, billing.NewProcessor(f.db, dedup.NewStore("test-group"), payer, horizon, m, noop.NewTracerProvider(),
		slog.New(slog.NewTextHandler(io.Discard, nil)))), m
}

// A crash after the claim leaves the claim and a pending attempt; whether
// the provider was never asked or charged and lost its answer, the
// redelivered message resumes the attempt under the same key: one charge.
func TestProcess_RedeliveryAfterACrashResumesThePendingAttempt(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault fakepsp.Options // what the first process met
	}{
		{"crash between claim and charge", fakepsp.Options{FailRate: 1}},
		{"crash between charge and settle", fakepsp.Options{ResetRate: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.fault)
			ev, value := newEvent(t, 21, time.Now())
			if res, err := f.proc.Process(context.Background(), messages(value)); err == nil || res[0].Outcome != billing.Pending {
				t.Fatalf("first process: %v, %v; want pending and an error", res[0].Outcome, err)
			}
			if got := f.count(t, `SELECT count(*) FROM charge WHERE event_id = $1 AND status = 'pending'`, ev.ID); got != 1 {
				t.Fatalf("pending attempts = %d, want 1 (the recovery point)", got)
			}

			f.psp.SetOptions(fakepsp.Options{})
			next, m := f.restart(t)
			res := process(t, next, value)
			if res[0].Outcome != billing.Charged {
				t.Errorf("redelivery: %v, want charged", res[0].Outcome)
			}
			if st := f.psp.Stats(); st.ChargesCreated != 1 || st.OrdersChargedTwice != 0 {
				t.Errorf("provider stats %+v, want one charge", st)
			}
			if got := f.count(t, `SELECT count(*) FROM charge WHERE event_id = $1 AND status = 'succeeded'`, ev.ID); got != 1 {
				t.Errorf("succeeded rows = %d, want 1", got)
			}
			if n := testutil.CollectAndCount(m.Transaction); n != 2 {
				t.Errorf("billing_db_transaction_seconds has %d phases, want claim and settle", n)
			}
			// Redelivered once more after settling: a plain duplicate that
			// knows what was recorded.
			if res := process(t, next, value); res[0].Outcome != billing.Duplicate || res[0].Recorded != billing.Charged {
				t.Errorf("after settling: %v (recorded %v), want duplicate (recorded charged)", res[0].Outcome, res[0].Recorded)
			}
		})
	}
}

// Two different events of one order: the first one's answer is lost after
// the provider charged. The second one finds the first's attempt pending,
// completes it (the provider replays the charge) and then decides: the
// order is paid. One charge, whatever the order of arrival.
func TestProcess_AnEventMeetingAnotherPendingAttemptCompletesItFirst(t *testing.T) {
	f := newFixture(t, fakepsp.Options{ResetRate: 1})
	first, a := newEvent(t, 33, time.Now())
	_, b := newEvent(t, 33, time.Now())
	if res, _ := f.proc.Process(context.Background(), messages(a)); res[0].Outcome != billing.Pending {
		t.Fatalf("first event: %v, want pending (answer lost)", res[0].Outcome)
	}

	f.psp.SetOptions(fakepsp.Options{})
	res := process(t, f.proc, b)
	if res[0].Outcome != billing.AlreadyCharged {
		t.Errorf("second event: %v, want already_charged", res[0].Outcome)
	}
	if st := f.psp.Stats(); st.ChargesCreated != 1 || st.OrdersChargedTwice != 0 || st.Replays != 1 {
		t.Errorf("provider stats %+v, want one charge and one replay", st)
	}
	if got := f.count(t, `SELECT count(*) FROM charge WHERE event_id = $1 AND status = 'succeeded'`, first.ID); got != 1 {
		t.Errorf("the first event's attempt is not settled as succeeded")
	}
	// The first event's own retry finds its attempt settled by the other
	// and counted for nobody: it counts the charge, once.
	if res := process(t, f.proc, a); res[0].Outcome != billing.Charged {
		t.Errorf("first event's retry: %v, want charged", res[0].Outcome)
	}
	if res := process(t, f.proc, a); res[0].Outcome != billing.Duplicate || res[0].Recorded != billing.Charged {
		t.Errorf("another copy of the first event: %v (recorded %v), want duplicate (recorded charged)", res[0].Outcome, res[0].Recorded)
	}
}

// A declined pending attempt does not pay the order: the next event of the
// order, having completed it, charges its own.
func TestProcess_AfterADeclinedAttemptTheNextEventCharges(t *testing.T) {
	f := newFixture(t, fakepsp.Options{FailRate: 1})
	first, a := newEvent(t, 40, time.Now())
	second, b := newEvent(t, 40, time.Now())
	if res, _ := f.proc.Process(context.Background(), messages(a)); res[0].Outcome != billing.Pending {
		t.Fatalf("first event: %v, want pending", res[0].Outcome)
	}
	// This provider declines the first event's card and takes the second's.
	f.psp.SetOptions(fakepsp.Options{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == first.ID.String() {
			w.WriteHeader(http.StatusPaymentRequired)
			_, _ = io.WriteString(w, `{"error":{"code":"card_declined"}}`)
			return
		}
		f.psp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	m := metrics.New(prometheus.NewRegistry())
	payer := payment.New(contract.New(srv.URL, ""), payment.Config{Timeout: 5 * time.Second, MaxConcurrency: 4}, m)
	t.Cleanup(payer.Close)
	proc := running(t, billing.NewProcessor(f.db, dedup.NewStore("test-group"), payer, billing.Horizon{Retention: 7 * 24 * time.Hour, MaxFutureSkew: time.Hour, ProviderWindow: 24 * time.Hour},
		m, noop.NewTracerProvider(), slog.New(slog.NewTextHandler(io.Discard, nil))))

	if res := process(t, proc, b); res[0].Outcome != billing.Charged {
		t.Errorf("second event: %v, want charged", res[0].Outcome)
	}
	if got := f.count(t, `SELECT count(*) FROM charge WHERE event_id = $1 AND status = 'declined'`, first.ID); got != 1 {
		t.Errorf("the first event's attempt is not settled as declined")
	}
	if got := f.count(t, `SELECT count(*) FROM charge WHERE event_id = $1 AND status = 'succeeded'`, second.ID); got != 1 {
		t.Errorf("the second event's own attempt is not settled as succeeded")
	}
	if res := process(t, proc, a); res[0].Outcome != billing.Declined {
		t.Errorf("first event's retry: %v, want declined (its attempt's answer, counted once)", res[0].Outcome)
	}
}

// Maintenance completes an attempt a crash left pending, from its row alone.
func TestRecover_CompletesAttemptsLeftPending(t *testing.T) {
	f := newFixture(t, fakepsp.Options{FailRate: 1})
	ev, value := newEvent(t, 51, time.Now())
	_, declinedValue := newEvent(t, 60, time.Now())
	if res, _ := f.proc.Process(context.Background(), messages(value, declinedValue)); res[0].Outcome != billing.Pending {
		t.Fatalf("first event: %v, want pending", res[0].Outcome)
	}

	f.psp.SetOptions(fakepsp.Options{DeclineEvery: 60})
	proc, m := f.restart(t)
	// Not idle for long enough yet: left alone.
	if rep, err := proc.Recoverer().Recover(context.Background(), time.Hour); err != nil || rep.Pending != 2 || len(rep.Completed) != 0 {
		t.Fatalf("Recover(1h) = %+v, %v; want 2 pending, none taken", rep, err)
	}
	rep, err := proc.Recoverer().Recover(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Completed["succeeded"] != 1 || rep.Completed["declined"] != 1 || rep.Unanswered != 0 {
		t.Errorf("Recover = %+v, want one succeeded and one declined", rep)
	}
	if got := testutil.ToFloat64(m.AttemptsRecovered.WithLabelValues("succeeded")); got != 1 {
		t.Errorf("billing_charge_attempts_recovered_total{result=succeeded} = %v, want 1", got)
	}
	if st := f.psp.Stats(); st.ChargesCreated != 1 || st.OrdersChargedTwice != 0 {
		t.Errorf("provider stats %+v, want one charge", st)
	}
	if got := f.count(t, `SELECT count(*) FROM charge WHERE event_id = $1 AND status = 'succeeded'`, ev.ID); got != 1 {
		t.Errorf("the orphan is not settled as succeeded")
	}
	if rep, err := proc.Recoverer().Recover(context.Background(), 0); err != nil || rep.Pending != 0 {
		t.Errorf("a second run: %+v, %v; want nothing pending", rep, err)
	}
}

// billing maintain's recoverer, of a process that consumes nothing, reports
// the attempts left pending without a payer and completes them with one.
func TestRecoverer_StandaloneReportsWithoutAPayerAndCompletesWithOne(t *testing.T) {
	f := newFixture(t, fakepsp.Options{FailRate: 1})
	ev, value := newEvent(t, 81, time.Now())
	if res, _ := f.proc.Process(context.Background(), messages(value)); res[0].Outcome != billing.Pending {
		t.Fatalf("event: %v, want pending", res[0].Outcome)
	}
	f.psp.SetOptions(fakepsp.Options{})
	before := f.psp.Stats().Requests
	m := metrics.New(prometheus.NewRegistry())
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	rep, err := billing.NewRecoverer(f.db, nil, billing.Horizon{ProviderWindow: 24 * time.Hour, ResolveAfter: time.Minute}, m, log).Recover(context.Background(), 0)
	if err != nil || rep.Pending != 1 || len(rep.Completed) != 0 {
		t.Fatalf("without a payer: %+v, %v; want 1 pending, none completed", rep, err)
	}
	if got := f.psp.Stats().Requests; got != before {
		t.Errorf("without a payer the provider got %d requests, want none", got-before)
	}

	srv := httptest.NewServer(f.psp)
	t.Cleanup(srv.Close)
	payer := payment.New(contract.New(srv.URL, ""), payment.Config{Timeout: 5 * time.Second, MaxConcurrency: 4}, m)
	t.Cleanup(payer.Close)
	rep, err = billing.NewRecoverer(f.db, payer, billing.Horizon{ProviderWindow: 24 * time.Hour, ResolveAfter: time.Minute}, m, log).Recover(context.Background(), 0)
	if err != nil || rep.Completed["succeeded"] != 1 {
		t.Fatalf("with a payer: %+v, %v; want one succeeded", rep, err)
	}
	if got := f.count(t, `SELECT count(*) FROM charge WHERE event_id = $1 AND status = 'succeeded'`, ev.ID); got != 1 {
		t.Errorf("the attempt is not settled as succeeded")
	}
}

// An attempt older than the provider's idempotency window is never sent:
// the provider may have forgotten the key and would charge again. It is
// reported, and the events that need it are parked for a human.
func TestRecover_AttemptPastTheProviderWindowIsReportedNotRetried(t *testing.T) {
	f := newFixture(t, fakepsp.Options{FailRate: 1})
	ev, value := newEvent(t, 71, time.Now())
	_, second := newEvent(t, 71, time.Now())
	if res, _ := f.proc.Process(context.Background(), messages(value)); res[0].Outcome != billing.Pending {
		t.Fatalf("first event: %v, want pending", res[0].Outcome)
	}
	if _, err := f.db.Exec(`UPDATE charge SET created_at = now() - interval '25 hours', updated_at = now() - interval '25 hours' WHERE event_id = $1`, ev.ID); err != nil {
		t.Fatal(err)
	}
	f.psp.SetOptions(fakepsp.Options{})
	before := f.psp.Stats().Requests

	proc, m := f.restart(t)
	rep, err := proc.Recoverer().Recover(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Expired) != 1 || rep.Expired[0] != ev.ID || len(rep.Completed) != 0 {
		t.Errorf("Recover = %+v, want the attempt listed as expired and nothing completed", rep)
	}
	if got := testutil.ToFloat64(m.AttemptsExpired); got != 1 {
		t.Errorf("billing_charge_attempts_expired = %v, want 1", got)
	}
	res := process(t, proc, value, second)
	for i, r := range res {
		if r.Outcome != billing.Parked || r.Reason.Code != reason.StaleEvent || !strings.Contains(r.Reason.Detail, "idempotency window") {
			t.Errorf("event %d: %v %q %q, want parked stale-event naming the window", i, r.Outcome, r.Reason.Code, r.Reason.Detail)
		}
	}
	if got := f.psp.Stats().Requests; got != before {
		t.Errorf("%d requests for an attempt past the window", got-before)
	}
	if got := f.count(t, `SELECT count(*) FROM charge WHERE order_id = 71 AND status = 'pending'`); got != 1 {
		t.Errorf("the expired attempt is no longer pending: it must wait for a human")
	}
}

// A try whose settle committed without its answer reaching billing (the
// connection cut right after COMMIT) is tried again as the same message: it
// finds the outcome its earlier try recorded and counts it, once; another
// copy of the event is a duplicate.
func TestProcess_RetryAfterAnUnansweredCommitCountsTheOutcomeOnce(t *testing.T) {
	f := newFixture(t, fakepsp.Options{})
	_, value := newEvent(t, 91, time.Now())
	msg := messages(value)
	msg[0].ID = "g/orders/0/17"
	if res, err := f.proc.Process(context.Background(), msg); err != nil || res[0].Outcome != billing.Charged {
		t.Fatalf("first try: %v, %v", res[0].Outcome, err)
	}
	// Whatever the first try's caller learnt, the same message again
	// finds its own count: it is this message's outcome, not a duplicate.
	if res, _ := f.proc.Process(context.Background(), msg); res[0].Outcome != billing.Charged {
		t.Errorf("the same message after an unanswered commit: %v, want charged", res[0].Outcome)
	}
	copyMsg := messages(value)
	copyMsg[0].ID = "g/orders/1/4"
	if res, _ := f.proc.Process(context.Background(), copyMsg); res[0].Outcome != billing.Duplicate {
		t.Errorf("a copy in another partition: %v, want duplicate", res[0].Outcome)
	}
	// Another process (after a crash) does not count what this one did.
	next, _ := f.restart(t)
	if res, _ := next.Process(context.Background(), msg); res[0].Outcome != billing.Duplicate {
		t.Errorf("the message redelivered to another process: %v, want duplicate", res[0].Outcome)
	}
}

// A provider-rejected event is parked with its claim and attempt kept;
// replayed from the DLQ after the provider is fixed, it is charged.
func TestProcess_ReplayOfARejectedEventAsksAgain(t *testing.T) {
	f := newFixture(t, fakepsp.Options{})
	ev, value := newEvent(t, 81, time.Now())
	other := ev
	other.Amount.Minor++
	seedProviderKey(t, f, other)
	if res := process(t, f.proc, value); res[0].Outcome != billing.Parked || res[0].Reason.Code != reason.ProviderRejected {
		t.Fatalf("first: %v %q, want parked provider-rejected", res[0].Outcome, res[0].Reason.Code)
	}
	// The operator clears the key at the provider (a fresh provider here).
	fixed := fakepsp.New(fakepsp.Options{})
	f.psp = fixed
	srv := httptest.NewServer(fixed)
	t.Cleanup(srv.Close)
	m := metrics.New(prometheus.NewRegistry())
	payer := payment.New(contract.New(srv.URL, ""), payment.Config{Timeout: 5 * time.Second, MaxConcurrency: 4}, m)
	t.Cleanup(payer.Close)
	proc := running(t, billing.NewProcessor(f.db, dedup.NewStore("test-group"), payer, billing.Horizon{Retention: 7 * 24 * time.Hour, MaxFutureSkew: time.Hour, ProviderWindow: 24 * time.Hour},
		m, noop.NewTracerProvider(), slog.New(slog.NewTextHandler(io.Discard, nil))))
	if res := process(t, proc, value); res[0].Outcome != billing.Charged {
		t.Fatalf("replay: %v, want charged", res[0].Outcome)
	}
	if st := fixed.Stats(); st.ChargesCreated != 1 {
		t.Errorf("fixed provider: %+v, want one charge", st)
	}
}
