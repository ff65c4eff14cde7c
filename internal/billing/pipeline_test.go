package billing_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"example.com/billing/internal/billing"
	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/testenv/wait"
)

// handled handles values each on a goroutine of its own, as the
// consumer's keys do, and returns a function that waits for their results.
func handled(t *testing.T, p *billing.Processor, values ...[]byte) func() []billing.Result {
	t.Helper()
	results := make([]billing.Result, len(values))
	var wg sync.WaitGroup
	for i, v := range values {
		wg.Go(func() { results[i], _ = p.Handle(context.Background(), messages(v)[0]) })
	}
	return func() []billing.Result { wg.Wait(); return results }
}

// An event whose provider answer is slow holds no other event: each goes
// through claim → charge → settle at its own pace, and the transactions
// they share do not wait for the slow one's answer.
func TestHandle_ASlowAnswerHoldsNoOtherEvent(t *testing.T) {
	f := newFixture(t, fakepsp.Options{})
	slow, slowValue := newEvent(t, 1, time.Now())
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == slow.ID.String() {
			<-release
		}
		f.psp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	proc := f.processorFor(t, srv.URL)

	var fast [][]byte
	for i := range 20 {
		_, v := newEvent(t, int64(100+i), time.Now())
		fast = append(fast, v)
	}
	slowDone := handled(t, proc, slowValue)
	for i, r := range handled(t, proc, fast...)() {
		if r.Outcome != billing.Charged {
			t.Errorf("event %d behind a slow answer: %v, want charged", i, r.Outcome)
		}
	}
	release <- struct{}{}
	if r := slowDone()[0]; r.Outcome != billing.Charged {
		t.Errorf("the slow event: %v, want charged", r.Outcome)
	}
}

// Under load the claims and settles of many events share transactions
// (group commit): far fewer transactions than events, and every event
// still charged once.
func TestHandle_ClaimsAndSettlesShareTransactions(t *testing.T) {
	f := newFixture(t, fakepsp.Options{Latency: 20 * time.Millisecond})
	const events = 400
	var values [][]byte
	for i := range events {
		_, v := newEvent(t, int64(1000+i), time.Now())
		values = append(values, v)
	}
	for i, r := range handled(t, f.proc, values...)() {
		if r.Outcome != billing.Charged {
			t.Fatalf("event %d: %v, want charged", i, r.Outcome)
		}
	}
	txs := transactions(t, f)
	// The claims arrive together and share a few transactions. The answers
	// come back spread over the provider's latency, 64 at a time, to
	// several settle writers: 3-5 of them share a settle on a fast
	// database (85-119 settles for 400 events under -race), far fewer than
	// one each. One transaction per event would be 400.
	if txs["claim"] >= events/4 || txs["settle"] >= events/2 {
		t.Errorf("%d claim and %d settle transactions for %d events, want fewer than a quarter of claims and half of settles (shared)", txs["claim"], txs["settle"], events)
	}
	t.Logf("%d events: %d claim and %d settle transactions", events, txs["claim"], txs["settle"])
	if st := f.psp.Stats(); st.ChargesCreated != events || st.OrdersChargedTwice != 0 {
		t.Errorf("provider stats %+v, want %d charges", st, events)
	}
}

// transactions counts the pipeline's transactions by phase.
func transactions(t *testing.T, f *fixture) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, phase := range []string{"claim", "settle"} {
		h, err := f.m.Transaction.GetMetricWithLabelValues(phase)
		if err != nil {
			t.Fatal(err)
		}
		out[phase] = int(histogramCount(t, h))
	}
	return out
}

// A settle whose connection is lost (here: its backend terminated while
// the settle waits) rolls back as a whole, but the answers it was to
// record are not lost with it: they are settled again, one call at a time,
// and every event is charged with one provider request, none asked twice.
func TestHandle_ASettleThatLosesItsConnectionIsSettledAgainWithItsAnswers(t *testing.T) {
	f := newFixture(t, fakepsp.Options{})
	for _, q := range []string{
		`CREATE TABLE settle_gate (once boolean)`,
		`INSERT INTO settle_gate VALUES (true)`,
		// The first settle waits, the test kills its backend meanwhile.
		`CREATE FUNCTION slow_settle() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
		   IF (SELECT once FROM settle_gate) THEN PERFORM pg_sleep(30); END IF; RETURN NEW; END $$`,
		`CREATE TRIGGER slow_settle BEFORE UPDATE ON charge FOR EACH ROW EXECUTE FUNCTION slow_settle()`,
	} {
		if _, err := f.db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	var values [][]byte
	for i := range 10 {
		_, v := newEvent(t, int64(300+i), time.Now())
		values = append(values, v)
	}
	results := make(chan []billing.Result, 1)
	go func() { res, _ := f.proc.Process(context.Background(), messages(values...)); results <- res }()
	wait.For(t, 10*time.Second, "a settle waiting", func() bool {
		return f.count(t, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%UPDATE charge AS c SET%' AND state = 'active' AND pid <> pg_backend_pid()`) > 0
	})
	if _, err := f.db.Exec(`UPDATE settle_gate SET once = false`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%UPDATE charge AS c SET%' AND pid <> pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
	for i, r := range <-results {
		if r.Outcome != billing.Charged {
			t.Errorf("event %d: %v, want charged", i, r.Outcome)
		}
	}
	if got := f.count(t, `SELECT count(*) FROM charge WHERE status = 'pending'`); got != 0 {
		t.Errorf("%d attempts still pending, want 0", got)
	}
	if st := f.psp.Stats(); int(st.Requests) != len(values) || int(st.ChargesCreated) != len(values) || st.Replays != 0 {
		t.Errorf("provider stats %+v, want %d requests and charges, no replay", st, len(values))
	}
	if got := counterValue(t, f.m.Retries.WithLabelValues("database")); got == 0 {
		t.Error("the failed settle was not counted as a database retry")
	}
}

// Stopping the processor with work queued and in flight loses nothing:
// every event is answered (decided, or pending with ErrStopped), and a
// new processor finishes the pending ones, each charged once.
func TestRun_StoppingWithAFullQueueAnswersEveryEvent(t *testing.T) {
	f := newFixture(t, fakepsp.Options{Latency: 30 * time.Millisecond})
	proc, ctx, stop := f.stoppable(t)
	const events = 300
	var values [][]byte
	for i := range events {
		_, v := newEvent(t, int64(2000+i), time.Now())
		values = append(values, v)
	}
	var mu sync.Mutex
	answered := map[int]billing.Result{}
	var stopped int
	var wg sync.WaitGroup
	for i, v := range values {
		wg.Go(func() {
			r, err := proc.Handle(ctx, messages(v)[0])
			mu.Lock()
			defer mu.Unlock()
			answered[i] = r
			if errors.Is(err, billing.ErrStopped) || errors.Is(err, context.Canceled) {
				stopped++
			}
		})
	}
	time.Sleep(150 * time.Millisecond)
	stop()
	returned := make(chan struct{})
	go func() { wg.Wait(); close(returned) }()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("events still unanswered 10s after the processor stopped")
	}
	if len(answered) != events {
		t.Fatalf("%d of %d events answered", len(answered), events)
	}
	t.Logf("%d events left pending by the stop", stopped)
	next, _ := f.restart(t)
	for i, r := range settle(t, next, values...) {
		if r.Outcome != billing.Charged && r.Outcome != billing.Duplicate {
			t.Errorf("event %d after the restart: %v", i, r.Outcome)
		}
	}
	if st := f.psp.Stats(); st.ChargesCreated != events || st.OrdersChargedTwice != 0 {
		t.Errorf("provider stats %+v, want %d charges", st, events)
	}
}

// histogramCount is how many observations h holds.
func histogramCount(t *testing.T, h prometheus.Observer) uint64 {
	t.Helper()
	var m dto.Metric
	if err := h.(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// A charge is sent only while a waiting event's caller still wants it: not
// once the event's fence no longer holds (the consumer's partition may be
// another's: revoked, draining, a membership that lapsed) or its context
// ended, even when it was only waiting for a provider slot; its attempt
// stays pending for whoever completes it, under the same key. A request
// already sent is not cut short: it is answered and settled.
func TestHandle_NoChargeIsSentOnceItsFenceOrContextEnds(t *testing.T) {
	for _, end := range []string{"fence", "context"} {
		t.Run(end, func(t *testing.T) {
			f := newFixture(t, fakepsp.Options{})
			release := make(chan struct{})
			var sent atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				sent.Add(1)
				<-release
				f.psp.ServeHTTP(w, r)
			}))
			t.Cleanup(srv.Close)
			proc := f.processorWithSlots(t, srv.URL, 1) // one request in flight at a time

			_, first := newEvent(t, 1, time.Now())
			_, second := newEvent(t, 2, time.Now())
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			fence := &testFence{}
			fence.holds.Store(true)
			type answer struct {
				r   billing.Result
				err error
			}
			answers := make([]chan answer, 2)
			for i, v := range [][]byte{first, second} {
				answers[i] = make(chan answer, 1)
				m := messages(v)[0]
				m.Fence = fence
				go func() {
					r, err := proc.Handle(ctx, m)
					answers[i] <- answer{r, err}
				}()
			}
			wait.For(t, 10*time.Second, "one request sent, the other waiting for the slot", func() bool {
				return sent.Load() == 1 && f.count(t, `SELECT count(*) FROM charge WHERE status = 'pending'`) == 2
			})
			if end == "fence" {
				fence.holds.Store(false) // the membership lapsed, or the partition drains
			} else {
				cancel()
			}
			close(release)
			got := map[billing.Outcome]int{}
			for i := range answers {
				select {
				case a := <-answers[i]:
					got[a.r.Outcome]++
					if a.r.Outcome == billing.Pending && a.err == nil {
						t.Error("no reason for a pending event")
					}
				case <-time.After(10 * time.Second):
					t.Fatal("an event was not answered")
				}
			}
			if got[billing.Charged] != 1 || got[billing.Pending] != 1 {
				t.Errorf("outcomes %v, want the one sent charged and the other pending", got)
			}
			if n := sent.Load(); n != 1 {
				t.Errorf("%d requests sent, want 1: the waiting one must not be sent once its %s ended", n, end)
			}
			if n := f.count(t, `SELECT count(*) FROM charge WHERE status = 'pending'`); n != 1 {
				t.Errorf("%d pending attempts, want 1 (left for whoever completes it)", n)
			}
		})
	}
}

// A charge that a pause of charging holds has not left: a copy of the event
// whose context ends meanwhile returns Pending at once, although another
// copy still wants the request, and the request goes once after the resume.
func TestHandle_ACallerGivesUpAChargeThePauseHolds(t *testing.T) {
	f := newFixture(t, fakepsp.Options{})
	srv := httptest.NewServer(f.psp)
	t.Cleanup(srv.Close)
	payer, proc := f.payingProcessor(t, srv.URL, 4)
	payer.SetPaused(true)

	_, value := newEvent(t, 1, time.Now())
	msg := messages(value)[0]
	stays := make(chan billing.Result, 1)
	go func() { r, _ := proc.Handle(context.Background(), msg); stays <- r }()
	wait.For(t, 10*time.Second, "the first copy's attempt recorded", func() bool {
		return f.count(t, `SELECT count(*) FROM charge WHERE status = 'pending'`) == 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond) // the pause asks whether it is wanted every second
	defer cancel()
	type answer struct {
		r   billing.Result
		err error
	}
	gaveUp := make(chan answer, 1)
	go func() { r, err := proc.Handle(ctx, msg); gaveUp <- answer{r, err} }()
	select {
	case a := <-gaveUp:
		if a.r.Outcome != billing.Pending || a.err == nil {
			t.Fatalf("the copy whose context ended: %v, %v; want pending with a reason", a.r.Outcome, a.err)
		}
	case <-time.After(3 * time.Second):
		payer.SetPaused(false) // let it go, so that the test ends
		t.Fatal("the copy whose context ended still waits for the charge the pause holds")
	}
	if n := f.psp.Stats().Requests; n != 0 {
		t.Fatalf("%d requests sent while paused", n)
	}
	payer.SetPaused(false)
	select {
	case r := <-stays:
		if r.Outcome != billing.Charged {
			t.Errorf("the copy that stayed: %v, want charged", r.Outcome)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the copy that stayed was not answered after the resume")
	}
	if n := f.psp.Stats().Requests; n != 1 {
		t.Errorf("%d requests, want 1", n)
	}
}

// testFence is a billing.Fence the test holds or lifts.
type testFence struct{ holds atomic.Bool }

func (f *testFence) Holds() bool { return f.holds.Load() }

// counterValue is c's value.
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// However many events wait for the provider, at most the payment client's
// slots (PAYMENT_MAX_CONCURRENCY) of their requests are in flight at once,
// and every one is sent in turn: an event's goroutine waits for a slot, it
// does not start a request of its own.
func TestHandle_RequestsStayWithinThePaymentClientsSlots(t *testing.T) {
	f := newFixture(t, fakepsp.Options{})
	const slots, events = 3, 40
	var inFlight, most atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(20 * time.Millisecond)
		f.psp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	proc := f.processorWithSlots(t, srv.URL, slots)
	var values [][]byte
	for i := range events {
		_, v := newEvent(t, int64(500+i), time.Now())
		values = append(values, v)
	}
	for i, r := range handled(t, proc, values...)() {
		if r.Outcome != billing.Charged {
			t.Errorf("event %d: %v, want charged", i, r.Outcome)
		}
	}
	if got := most.Load(); got != slots {
		t.Errorf("at most %d requests in flight at once, want %d (the payment client's slots)", got, slots)
	}
	if st := f.psp.Stats(); st.Requests != events || st.ChargesCreated != events {
		t.Errorf("provider stats %+v, want %d requests and charges", st, events)
	}
}
