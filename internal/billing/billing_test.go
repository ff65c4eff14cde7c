package billing_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/trace/noop"

	"example.com/billing/internal/billing"
	"example.com/billing/internal/daytable"
	"example.com/billing/internal/dedup"
	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/dlq/reason"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/order"
	"example.com/billing/internal/payment"
	"example.com/billing/internal/payment/contract"
	"example.com/billing/internal/testenv/dbtest"
)

// fixture is a Processor on a real database of its own and a fake provider
// reached over HTTP.
type fixture struct {
	db   *sqlx.DB
	psp  *fakepsp.Server
	proc *billing.Processor
	m    *metrics.Metrics
}

func newFixture(t *testing.T, opts fakepsp.Options) *fixture {
	t.Helper()
	db, _ := dbtest.New(t)
	psp := fakepsp.New(opts)
	srv := httptest.NewServer(psp)
	t.Cleanup(srv.Close)
	m := metrics.New(prometheus.NewRegistry())
	payer := payment.New(contract.New(srv.URL, ""), payment.Config{Timeout: 5 * time.Second, MaxConcurrency: 64}, m)
	t.Cleanup(payer.Close)
	horizon := billing.Horizon{Retention: 7 * 24 * time.Hour, MaxFutureSkew: time.Hour, ProviderWindow: 24 * time.Hour}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	return &fixture{db: db, psp: psp, m: m, proc: running(t, billing.NewProcessor(db, dedup.NewStore("test-group"), payer, horizon, m, noop.NewTracerProvider(), log))}
}

func (f *fixture) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	if err := f.db.Get(&n, q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

func newEvent(t *testing.T, orderID int64, at time.Time) (order.Event, []byte) {
	t.Helper()
	ev, err := order.New(orderID, 7, order.Money{Minor: 1999, Currency: "EUR"}, at)
	if err != nil {
		t.Fatal(err)
	}
	return ev, marshal(t, ev)
}

func marshal(t *testing.T, ev order.Event) []byte {
	t.Helper()
	b, err := ev.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// messages decodes values as the consumer does.
func messages(values ...[]byte) []billing.Message {
	msgs := make([]billing.Message, len(values))
	for i, v := range values {
		ev, err := order.Parse(v)
		if err != nil {
			panic(fmt.Sprintf("test event %q: %v", v, err))
		}
		msgs[i].Event = ev
	}
	return msgs
}

func process(t *testing.T, p *billing.Processor, values ...[]byte) []billing.Result {
	t.Helper()
	res, err := p.Process(context.Background(), messages(values...))
	if err != nil {
		t.Fatalf("Process: %v", err)
	}
	return res
}

// settle processes values until no event is left Pending, as the consumer's
// retries do, and returns the final results.
func settle(t *testing.T, p *billing.Processor, values ...[]byte) []billing.Result {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := p.Process(context.Background(), messages(values...))
		pending := false
		for _, r := range res {
			pending = pending || r.Outcome == billing.Pending
		}
		if !pending {
			return res
		}
		if time.Now().After(deadline) {
			t.Fatalf("events still pending after 30s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestProcess_SameEventRacingFromManyConsumersIsChargedOnce(t *testing.T) {
	f := newFixture(t, fakepsp.Options{Latency: 50 * time.Millisecond})
	ev, value := newEvent(t, 1, time.Now())

	const racers = 12
	outcomes := make([]billing.Outcome, racers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range racers {
		wg.Go(func() {
			<-start
			outcomes[i] = settle(t, f.proc, value)[0].Outcome
		})
	}
	close(start)
	wg.Wait()

	charged := 0
	for _, o := range outcomes {
		switch o {
		case billing.Charged:
			charged++
		case billing.Duplicate:
		default:
			t.Errorf("outcome %v, want charged or duplicate", o)
		}
	}
	if charged != 1 {
		t.Errorf("%d racers charged, want 1", charged)
	}
	if got := f.count(t, `SELECT count(*) FROM charge WHERE event_id = $1`, ev.ID); got != 1 {
		t.Errorf("charge rows = %d, want 1", got)
	}
	// A copy that met the attempt in flight for another racer waited for
	// its answer; one that met it pending between two phases may ask again
	// with the same key, which the provider answers from its store.
	if st := f.psp.Stats(); st.ChargesCreated != 1 || st.OrdersChargedTwice != 0 {
		t.Errorf("provider stats %+v, want one charge", st)
	}
}

func TestProcess_DifferentEventsForOneOrderRacingChargeItOnce(t *testing.T) {
	f := newFixture(t, fakepsp.Options{Latency: 50 * time.Millisecond})
	const racers = 8
	values := make([][]byte, racers)
	for i := range values {
		_, values[i] = newEvent(t, 77, time.Now())
	}
	outcomes := make([]billing.Outcome, racers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range racers {
		wg.Go(func() {
			<-start
			outcomes[i] = settle(t, f.proc, values[i])[0].Outcome
		})
	}
	close(start)
	wg.Wait()

	counts := map[billing.Outcome]int{}
	for _, o := range outcomes {
		counts[o]++
	}
	if counts[billing.Charged] != 1 || counts[billing.AlreadyCharged] != racers-1 {
		t.Errorf("outcomes %v, want 1 charged and %d already_charged", counts, racers-1)
	}
	if st := f.psp.Stats(); st.ChargesCreated != 1 || st.OrdersChargedTwice != 0 {
		t.Errorf("provider stats %+v, want one charge", st)
	}
	if got := f.count(t, `SELECT count(*) FROM processed_event`); got != racers {
		t.Errorf("processed events = %d, want %d (already_charged is recorded as processed)", got, racers)
	}
}

func TestProcess_BatchSettlesEachEventInOrder(t *testing.T) {
	f := newFixture(t, fakepsp.Options{DeclineEvery: 5})
	first, a := newEvent(t, 11, time.Now())
	_, b := newEvent(t, 11, time.Now()) // same order: a business duplicate of a
	_, declined := newEvent(t, 15, time.Now())
	res := process(t, f.proc, a, a, b, declined)

	want := []billing.Outcome{billing.Charged, billing.Duplicate, billing.AlreadyCharged, billing.Declined}
	for i, r := range res {
		if r.Outcome != want[i] {
			t.Errorf("result %d: %v, want %v", i, r.Outcome, want[i])
		}
	}
	if res[0].Event.ID != first.ID {
		t.Errorf("result carries event %s, want %s", res[0].Event.ID, first.ID)
	}
	if got := f.count(t, `SELECT count(*) FROM charge`); got != 2 {
		t.Errorf("charge rows = %d, want 2 (one succeeded, one declined)", got)
	}
}

func TestProcess_ProviderRejectionInABatchParksOnlyThatEvent(t *testing.T) {
	f := newFixture(t, fakepsp.Options{})
	rejected, r := newEvent(t, 1, time.Now())
	_, ok1 := newEvent(t, 2, time.Now())
	_, ok2 := newEvent(t, 3, time.Now())
	// The provider holds rejected's key for another amount: it answers 422.
	other := rejected
	other.Amount.Minor++
	seedProviderKey(t, f, other)

	res := process(t, f.proc, ok1, r, ok2)
	if res[0].Outcome != billing.Charged || res[2].Outcome != billing.Charged {
		t.Errorf("neighbours of a rejected event: %v, %v; want charged", res[0].Outcome, res[2].Outcome)
	}
	if res[1].Outcome != billing.Parked || res[1].Reason.Code != reason.ProviderRejected {
		t.Errorf("rejected event: %v %q, want parked provider-rejected", res[1].Outcome, res[1].Reason.Code)
	}
	// Its first payload is pinned, and the refused attempt recorded: a
	// later copy with another payload is a mismatch, not a new charge.
	if got := f.count(t, `SELECT count(*) FROM processed_event WHERE event_id = $1`, rejected.ID); got != 1 {
		t.Errorf("the rejected event's claim: %d rows, want 1", got)
	}
	if got := f.count(t, `SELECT count(*) FROM charge WHERE event_id = $1 AND status = 'rejected'`, rejected.ID); got != 1 {
		t.Errorf("the refused attempt is not recorded as rejected")
	}
	tampered := rejected
	tampered.Amount.Minor += 2
	if res := process(t, f.proc, marshal(t, tampered)); res[0].Outcome != billing.Parked || res[0].Reason.Code != reason.PayloadMismatch {
		t.Errorf("a tampered copy of the rejected event: %v %q, want parked payload-mismatch", res[0].Outcome, res[0].Reason.Code)
	}
}

func TestProcess_OutageLeavesEventsPendingWithTheirAttemptsRecorded(t *testing.T) {
	f := newFixture(t, fakepsp.Options{FailRate: 1})
	_, a := newEvent(t, 1, time.Now())
	_, b := newEvent(t, 2, time.Now())
	ahead, _ := newEvent(t, 3, time.Now())
	var err error
	if ahead.ID, err = order.NewIDAt(time.Now().Add(3 * time.Hour)); err != nil {
		t.Fatal(err)
	}
	res, err := f.proc.Process(context.Background(), messages(a, marshal(t, ahead), b))
	var te *payment.TransientError
	if !errors.As(err, &te) {
		t.Fatalf("err = %v, want a *payment.TransientError", err)
	}
	if res[0].Outcome != billing.Pending || res[2].Outcome != billing.Pending {
		t.Errorf("outcomes %v %v, want pending", res[0].Outcome, res[2].Outcome)
	}
	if res[1].Outcome != billing.Parked || res[1].Reason.Code != reason.InvalidEvent {
		t.Errorf("an invalid event waits for an outage: %v %q", res[1].Outcome, res[1].Reason)
	}
	// The claims and their attempts committed before the provider was
	// asked: the recovery point the retry resumes from.
	if got := f.count(t, `SELECT count(*) FROM charge WHERE status = 'pending' AND requests = 1 AND last_error IS NOT NULL`); got != 2 {
		t.Errorf("pending attempts with their failed request counted = %d, want 2", got)
	}
	if st := f.psp.Stats(); st.ChargesCreated != 0 {
		t.Errorf("the provider charged during its outage: %+v", st)
	}

	f.psp.SetOptions(fakepsp.Options{})
	res = process(t, f.proc, a, b)
	if res[0].Outcome != billing.Charged || res[1].Outcome != billing.Charged {
		t.Errorf("after the outage: %v %v", res[0].Outcome, res[1].Outcome)
	}
	if got := f.count(t, `SELECT count(*) FROM charge WHERE status = 'succeeded' AND settled_at IS NOT NULL AND requests = 2`); got != 2 {
		t.Errorf("settled attempts = %d, want 2", got)
	}
}

func TestProcess_DatabaseDownIsPendingNotParked(t *testing.T) {
	f := newFixture(t, fakepsp.Options{})
	_, a := newEvent(t, 1, time.Now())
	f.db.Close()
	res, err := f.proc.Process(context.Background(), messages(a))
	if err == nil || res[0].Outcome != billing.Pending {
		t.Fatalf("Process on a closed database = %v, %v; want pending and an error", res[0].Outcome, err)
	}
}

// A database that refuses writes for want of a resource (a full disk:
// SQLSTATE 53100, as PostgreSQL answers when it cannot extend a table's
// file) is an outage, not the event's fault: the event is left pending,
// uncharged and unparked, the refusal is what readiness reports and is
// counted by SQLSTATE, and once the database takes writes again the event
// is charged and readiness is clear.
func TestProcess_ADatabaseThatRefusesWritesIsAnOutage(t *testing.T) {
	f := newFixture(t, fakepsp.Options{})
	for _, q := range []string{
		`CREATE FUNCTION disk_full() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
		 RAISE EXCEPTION 'could not extend file "base/16384/16390": No space left on device' USING ERRCODE = 'disk_full'; END $$`,
		`CREATE TRIGGER disk_full BEFORE INSERT ON processed_event FOR EACH ROW EXECUTE FUNCTION disk_full()`,
	} {
		if _, err := f.db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	_, a := newEvent(t, 1, time.Now())
	res, err := f.proc.Process(context.Background(), messages(a))
	if err == nil || res[0].Outcome != billing.Pending {
		t.Fatalf("Process while the disk is full = %v, %v; want pending and an error", res[0].Outcome, err)
	}
	if got := f.proc.WriteRefusal(); got == nil || !strings.Contains(got.Error(), "No space left on device") || !strings.Contains(got.Error(), "53100") {
		t.Errorf("WriteRefusal() = %v, want the server's words and SQLSTATE 53100", got)
	}
	if got := testutil.ToFloat64(f.m.DBErrors.WithLabelValues("53100")); got < 1 {
		t.Errorf("billing_db_errors_total{sqlstate=\"53100\"} = %v, want ≥ 1", got)
	}
	if got := f.psp.Stats().Requests; got != 0 {
		t.Errorf("%d provider requests while nothing could be recorded, want 0", got)
	}

	if _, err := f.db.Exec(`DROP TRIGGER disk_full ON processed_event`); err != nil {
		t.Fatal(err)
	}
	if res := process(t, f.proc, a); res[0].Outcome != billing.Charged {
		t.Errorf("once the database takes writes again: %v, want charged", res[0].Outcome)
	}
	if got := f.proc.WriteRefusal(); got != nil {
		t.Errorf("WriteRefusal() after a committed write = %v, want nil", got)
	}
}

// An event the database refuses (a constraint the event contract does not
// know, here added by hand) will be refused however often it is retried:
// it is parked with the database's words, uncharged, and its neighbours in
// the transaction are charged, not retried for ever with it.
func TestProcess_AnEventTheDatabaseRefusesIsParkedNotRetried(t *testing.T) {
	f := newFixture(t, fakepsp.Options{})
	if _, err := f.db.Exec(`ALTER TABLE charge ADD CONSTRAINT no_order_13 CHECK (order_id <> 13)`); err != nil {
		t.Fatal(err)
	}
	_, ok1 := newEvent(t, 12, time.Now())
	refused, r := newEvent(t, 13, time.Now())
	_, ok2 := newEvent(t, 14, time.Now())

	res, err := f.proc.Process(context.Background(), messages(ok1, r, ok2))
	if err != nil {
		t.Fatalf("Process: %v", err)
	}
	if res[0].Outcome != billing.Charged || res[2].Outcome != billing.Charged {
		t.Errorf("neighbours of a refused event: %v, %v; want charged", res[0].Outcome, res[2].Outcome)
	}
	if res[1].Outcome != billing.Parked || res[1].Reason.Code != reason.InvalidEvent ||
		!strings.Contains(res[1].Reason.String(), "no_order_13") || !strings.Contains(res[1].Reason.String(), "23514") {
		t.Errorf("refused event: %v %q, want parked invalid-event naming the constraint and SQLSTATE 23514", res[1].Outcome, res[1].Reason.String())
	}
	if got := f.psp.Stats().Requests; got != 2 {
		t.Errorf("%d provider requests, want 2: the refused event must not be charged", got)
	}
	if got := f.count(t, `SELECT count(*) FROM processed_event WHERE event_id = $1`, refused.ID); got != 0 {
		t.Errorf("the refused event's claim left %d rows, want none (rolled back)", got)
	}
}

func TestProcess_EventsOutsideTheDedupHorizonAreParked(t *testing.T) {
	f := newFixture(t, fakepsp.Options{})
	cases := []struct {
		name     string
		at       time.Time
		wantCode reason.Code
	}{
		{"ErrStale_OlderThanRetention", time.Now().Add(-8 * 24 * time.Hour), reason.StaleEvent},
		{"ErrFuture_BeyondSkew", time.Now().Add(3 * time.Hour), reason.InvalidEvent},
		{"OK_JustInsideRetention", time.Now().Add(-6 * 24 * time.Hour), ""},
		{"OK_WithinSkew", time.Now().Add(30 * time.Minute), ""},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id, err := order.NewIDAt(c.at)
			if err != nil {
				t.Fatal(err)
			}
			ev, _ := newEvent(t, int64(100+i), time.Now())
			ev.ID = id
			before := f.psp.Stats().Requests
			res := process(t, f.proc, marshal(t, ev))
			if c.wantCode == "" {
				if res[0].Outcome != billing.Charged {
					t.Fatalf("outcome %v %q, want charged", res[0].Outcome, res[0].Reason.String())
				}
				return
			}
			if res[0].Outcome != billing.Parked || res[0].Reason.Code != c.wantCode {
				t.Fatalf("outcome %v %q, want parked %s", res[0].Outcome, res[0].Reason.Code, c.wantCode)
			}
			if f.psp.Stats().Requests != before {
				t.Errorf("a parked event reached the provider")
			}
		})
	}
}

// A stale event is parked with a payment.failed.v1 outcome that its claim
// records: until that claim commits it is not parked, or the consumer would
// dead-letter it and the order service would never hear of it.
func TestHandle_AStaleEventIsParkedOnlyOnceItsFailureIsRecorded(t *testing.T) {
	f := newFixture(t, fakepsp.Options{})
	id, err := order.NewIDAt(time.Now().Add(-8 * 24 * time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ev, _ := newEvent(t, 77, time.Now())
	ev.ID = id
	msg := messages(marshal(t, ev))[0]

	stopped, ctx, stop := f.stoppable(t)
	stop() // its writers gone: no claim commits
	res, err := stopped.Handle(ctx, msg)
	if res.Outcome != billing.Pending || !errors.Is(err, billing.ErrStopped) {
		t.Fatalf("with no claim recorded: %v (%q), %v; want pending, %v", res.Outcome, res.Reason.String(), err, billing.ErrStopped)
	}

	res, err = f.proc.Handle(context.Background(), msg)
	if err != nil || res.Outcome != billing.Parked || res.Reason.Code != reason.StaleEvent {
		t.Fatalf("once claimed: %v (%q), %v; want parked stale-event", res.Outcome, res.Reason.String(), err)
	}
	if got := f.count(t, `SELECT count(*) FROM outbox WHERE causation_id = $1 AND event_type = 'payment.failed.v1'`, ev.ID); got != 1 {
		t.Errorf("%d payment.failed.v1 outcomes recorded, want 1", got)
	}
}

func TestProcess_SameIDWithAnotherPayloadIsParkedUncharged(t *testing.T) {
	f := newFixture(t, fakepsp.Options{})
	ev, value := newEvent(t, 5, time.Now())
	process(t, f.proc, value)

	tampered := ev
	tampered.Amount.Minor = 1
	before := f.psp.Stats().Requests
	res := process(t, f.proc, marshal(t, tampered))
	if res[0].Outcome != billing.Parked || res[0].Reason.Code != reason.PayloadMismatch {
		t.Fatalf("outcome %v %q, want parked payload-mismatch", res[0].Outcome, res[0].Reason.Code)
	}
	if !strings.Contains(res[0].Reason.Detail, ev.ID.String()) {
		t.Errorf("detail %q does not name the event id", res[0].Reason.Detail)
	}
	if f.psp.Stats().Requests != before {
		t.Errorf("a tampered event reached the provider")
	}
	// The same bytes again are still a plain duplicate.
	if res := process(t, f.proc, value); res[0].Outcome != billing.Duplicate {
		t.Errorf("exact redelivery: %v, want duplicate", res[0].Outcome)
	}
}

func TestProcess_EventOfADayWithoutPartitionIsStillProcessed(t *testing.T) {
	f := newFixture(t, fakepsp.Options{})
	id, err := order.NewIDAt(time.Now().Add(-5 * 24 * time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	day := daytable.Day(id).Format("20060102")
	// As if maintenance had never created that day's partition.
	if _, err := f.db.Exec(`DROP TABLE processed_event_p` + day); err != nil {
		t.Fatal(err)
	}
	ev, _ := newEvent(t, 9, time.Now())
	ev.ID = id
	res := process(t, f.proc, marshal(t, ev))
	if res[0].Outcome != billing.Charged {
		t.Fatalf("outcome %v, want charged after the partition is created", res[0].Outcome)
	}
}

// A backlog of old events, whose days have no partition in processed_event
// (a database restored without them) nor in the outbox (older than its
// retention): many claims and settles meet the missing days at once. Each
// event is charged with one provider request: creating a day races with no
// other creator, an outcome of an old day needs none, and a settle is never
// undone for it.
func TestProcess_ABacklogOfOldEventsAsksTheProviderOncePerEvent(t *testing.T) {
	f := newFixture(t, fakepsp.Options{Latency: 5 * time.Millisecond})
	old := time.Now().Add(-3 * 24 * time.Hour)
	day := old.UTC().Format("20060102")
	for _, table := range []string{"processed_event_p", "outbox_p"} {
		if _, err := f.db.Exec(`DROP TABLE IF EXISTS ` + table + day); err != nil {
			t.Fatal(err)
		}
	}
	const events = 30
	var values [][]byte
	for i := range events {
		ev, _ := newEvent(t, int64(4000+i), old)
		id, err := order.NewIDAt(old.Add(time.Duration(i) * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ev.ID = id
		values = append(values, marshal(t, ev))
	}
	for i, r := range handled(t, f.proc, values...)() {
		if r.Outcome != billing.Charged {
			t.Errorf("event %d: %v, want charged", i, r.Outcome)
		}
	}
	if st := f.psp.Stats(); st.Requests != events || st.Replays != 0 {
		t.Errorf("provider: %d requests, %d replays for %d events: want one request each", st.Requests, st.Replays, events)
	}
	if got := f.count(t, `SELECT count(*) FROM outbox_default`); got != events {
		t.Errorf("%d outcomes in the outbox's default partition, want %d (no expired day re-created)", got, events)
	}
	if got := f.count(t, `SELECT count(*) FROM pg_class WHERE relname = $1`, "outbox_p"+day); got != 0 {
		t.Errorf("the outbox's expired day was created again")
	}
}

func seedProviderKey(t *testing.T, f *fixture, ev order.Event) {
	t.Helper()
	// Charge ev's key at the provider with ev's (altered) body, directly.
	srv := httptest.NewServer(f.psp)
	defer srv.Close()
	c := payment.New(contract.New(srv.URL, ""), payment.Config{Timeout: 5 * time.Second, MaxConcurrency: 1}, metrics.New(prometheus.NewRegistry()))
	defer c.Close()
	if _, err := c.Charge(context.Background(), payment.Request{
		IdempotencyKey: ev.ID.String(), OrderID: ev.OrderID, CustomerID: ev.CustomerID,
		Amount: ev.Amount.Minor, Currency: ev.Amount.Currency,
	}); err != nil {
		t.Fatal(err)
	}
}

func TestProcess_EventOfADroppedDayIsParkedNotChargedAgain(t *testing.T) {
	f := newFixture(t, fakepsp.Options{})
	// Maintenance with a shorter retention than this consumer's dropped the
	// day three days ago: its records are gone.
	id, err := order.NewIDAt(time.Now().Add(-3 * 24 * time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	day := daytable.Day(id)
	if _, err := f.db.Exec(`INSERT INTO processed_event_horizon (dropped_before) VALUES ($1)`, day.AddDate(0, 0, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.Exec(`DROP TABLE processed_event_p` + day.Format("20060102")); err != nil {
		t.Fatal(err)
	}
	ev, _ := newEvent(t, 31, time.Now())
	ev.ID = id
	res := process(t, f.proc, marshal(t, ev))
	if res[0].Outcome != billing.Parked || res[0].Reason.Code != reason.StaleEvent {
		t.Fatalf("outcome %v %q, want parked stale-event", res[0].Outcome, res[0].Reason.Code)
	}
	if f.psp.Stats().Requests != 0 {
		t.Errorf("an event of a dropped day reached the provider")
	}
	var n int
	if err := f.db.Get(&n, `SELECT count(*) FROM pg_class WHERE relname = $1`, "processed_event_p"+day.Format("20060102")); err != nil || n != 0 {
		t.Errorf("the dropped day's partition was recreated (%d, %v)", n, err)
	}
}

func TestProcess_EventSettledUnderAnotherGroupIsNotChargedAgain(t *testing.T) {
	f := newFixture(t, fakepsp.Options{DeclineEvery: 2})
	_, declined := newEvent(t, 2, time.Now())
	_, charged := newEvent(t, 3, time.Now())
	process(t, f.proc, declined, charged)
	before := f.psp.Stats().Requests

	// A second consumer group on the same database (or a group whose
	// offsets were reset) meets the same events as new.
	m := metrics.New(prometheus.NewRegistry())
	srv := httptest.NewServer(f.psp)
	defer srv.Close()
	payer := payment.New(contract.New(srv.URL, ""), payment.Config{Timeout: 5 * time.Second, MaxConcurrency: 4}, m)
	defer payer.Close()
	other := running(t, billing.NewProcessor(f.db, dedup.NewStore("another-group"), payer,
		billing.Horizon{Retention: 7 * 24 * time.Hour, MaxFutureSkew: time.Hour, ProviderWindow: 24 * time.Hour}, m, noop.NewTracerProvider(),
		slog.New(slog.NewTextHandler(io.Discard, nil))))
	res := process(t, other, declined, charged)
	for i, r := range res {
		if r.Outcome != billing.Duplicate {
			t.Errorf("event %d under another group: %v, want duplicate (its charge row exists)", i, r.Outcome)
		}
	}
	if got := f.psp.Stats().Requests; got != before {
		t.Errorf("%d more provider requests for events already settled", got-before)
	}
}

// running starts p's writers until the test ends.
func running(t *testing.T, p *billing.Processor) *billing.Processor {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return p
}

// processorFor returns a running processor on f's database whose provider
// is at url.
func (f *fixture) processorFor(t *testing.T, url string) *billing.Processor {
	t.Helper()
	return f.processorWithSlots(t, url, 64)
}

// processorWithSlots is processorFor with at most slots provider requests
// in flight.
func (f *fixture) processorWithSlots(t *testing.T, url string, slots int) *billing.Processor {
	t.Helper()
	_, p := f.payingProcessor(t, url, slots)
	return p
}

// payingProcessor is processorWithSlots with its payment client, for a
// test that pauses charging.
func (f *fixture) payingProcessor(t *testing.T, url string, slots int) (*payment.Client, *billing.Processor) {
	t.Helper()
	m := metrics.New(prometheus.NewRegistry())
	payer := payment.New(contract.New(url, ""), payment.Config{Timeout: 5 * time.Second, MaxConcurrency: slots}, m)
	t.Cleanup(payer.Close)
	return payer, running(t, billing.NewProcessor(f.db, dedup.NewStore("test-group"), payer, billing.Horizon{Retention: 7 * 24 * time.Hour, MaxFutureSkew: time.Hour, ProviderWindow: 24 * time.Hour},
		m, noop.NewTracerProvider(), slog.New(slog.NewTextHandler(io.Discard, nil))))
}

// stoppable returns a processor on f's database and provider whose writers
// run until stop, the context to submit with, and stop, which returns once
// they have.
func (f *fixture) stoppable(t *testing.T) (*billing.Processor, context.Context, func()) {
	t.Helper()
	srv := httptest.NewServer(f.psp)
	t.Cleanup(srv.Close)
	m := metrics.New(prometheus.NewRegistry())
	payer := payment.New(contract.New(srv.URL, ""), payment.Config{Timeout: 5 * time.Second, MaxConcurrency: 64}, m)
	t.Cleanup(payer.Close)
	p := billing.NewProcessor(f.db, dedup.NewStore("test-group"), payer, billing.Horizon{Retention: 7 * 24 * time.Hour, MaxFutureSkew: time.Hour, ProviderWindow: 24 * time.Hour},
		m, noop.NewTracerProvider(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return p, ctx, stop
}
