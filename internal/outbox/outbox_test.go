package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"example.com/billing/internal/config"
	"example.com/billing/internal/dev/embeddedkafka"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/order"
	"example.com/billing/internal/outbox"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/testenv/dbtest"
	"example.com/billing/internal/testenv/kafkatest"
	"example.com/billing/internal/testenv/pgbouncer"
)

// TestMain stops what the tests shared, if they started it: the Apache
// Kafka cluster (see kafkatest.Start) and the PostgreSQL server (when none
// answered, see dbtest).
func TestMain(m *testing.M) { kafkatest.Main(dbtest.WithServer(m)) }

func TestEvent_MarshalJSON(t *testing.T) {
	id := uuid.Must(uuid.FromString("01938d2e-7c4a-7b1e-9f00-000000000001"))
	cause := uuid.Must(uuid.FromString("01938d2e-7c4a-7b1e-9f00-000000000002"))
	at := time.Date(2026, 12, 3, 10, 0, 0, 123000000, time.UTC)
	base := outbox.Event{EventID: id, OccurredAt: at, CausationID: cause, OrderID: 42, CustomerID: 7}
	tests := []struct {
		name string
		o    outbox.Event
		want string
	}{
		{"OK_SucceededEUR", with(base, func(o *outbox.Event) {
			o.Type, o.Amount, o.ProviderChargeID = outbox.Succeeded, order.Money{Minor: 1010, Currency: "EUR"}, "ch_1"
		}), `"eventType":"payment.succeeded.v1","occurredAt":"2026-12-03T10:00:00.123Z","causationId":"01938d2e-7c4a-7b1e-9f00-000000000002","orderId":42,"customerId":7,"totalAmount":10.10,"currency":"EUR","providerChargeId":"ch_1"}`},
		{"OK_DeclinedJPYWithCode", with(base, func(o *outbox.Event) {
			o.Type, o.Amount, o.DeclineCode = outbox.Declined, order.Money{Minor: 1500, Currency: "JPY"}, "insufficient_funds"
		}), `"totalAmount":1500,"currency":"JPY","declineCode":"insufficient_funds"}`},
		{"OK_DeclinedWithoutCode", with(base, func(o *outbox.Event) {
			o.Type, o.Amount = outbox.Declined, order.Money{Minor: 5, Currency: "EUR"}
		}), `"totalAmount":0.05,"currency":"EUR"}`},
		{"OK_FailedKWD", with(base, func(o *outbox.Event) {
			o.Type, o.Amount, o.Reason = outbox.Failed, order.Money{Minor: 12345, Currency: "KWD"}, "stale-event"
		}), `"totalAmount":12.345,"currency":"KWD","reason":"stale-event"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := tt.o.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(string(b), `{"eventId":"01938d2e-7c4a-7b1e-9f00-000000000001",`) || !strings.HasSuffix(string(b), tt.want) {
				t.Errorf("got  %s\nwant ...%s", b, tt.want)
			}
			var v map[string]any
			if err := json.Unmarshal(b, &v); err != nil {
				t.Errorf("not JSON: %v", err)
			}
		})
	}
}

// An outcome's id is derived from the facts it announces: the same order
// event, type and reason give the same UUID v7 (with the order event's
// time), whenever and however often it is recorded; any other fact gives
// another id.
func TestOutcomeID(t *testing.T) {
	cause := uuid.Must(uuid.NewV7AtTime(time.Date(2026, 12, 3, 10, 0, 0, 123000000, time.UTC)))
	other := uuid.Must(uuid.NewV7AtTime(time.Date(2026, 12, 3, 10, 0, 0, 123000000, time.UTC)))
	id := outbox.OutcomeID(cause, outbox.Succeeded, "")
	if id.Version() != uuid.V7 || id.Variant() != uuid.VariantRFC9562 {
		t.Errorf("%s: version %d variant %d, want a UUID v7", id, id.Version(), id.Variant())
	}
	if got, _ := uuid.TimestampFromV7(id); got != mustTime(uuid.TimestampFromV7(cause)) {
		t.Errorf("%s carries time %v, want the order event's", id, got)
	}
	if again := outbox.NewEvent(outbox.Succeeded, order.Event{ID: cause}, "", time.Now().Add(time.Hour)).EventID; again != id {
		t.Errorf("recorded again an hour later: %s, want %s", again, id)
	}
	for _, tt := range []struct {
		name        string
		cause       uuid.UUID
		typ, reason string
	}{
		{"OtherType", cause, outbox.Declined, ""},
		{"OtherReason", cause, outbox.Failed, "stale-event"},
		{"OtherReasonOfTheSameType", cause, outbox.Failed, "payload-mismatch"},
		{"OtherOrderEventOfTheSameMillisecond", other, outbox.Succeeded, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := outbox.OutcomeID(tt.cause, tt.typ, tt.reason); got == id {
				t.Errorf("%s %s %q has the id of %s succeeded: %s", tt.cause, tt.typ, tt.reason, cause, got)
			}
		})
	}
}

func mustTime(ts uuid.Timestamp, err error) uuid.Timestamp {
	if err != nil {
		panic(err)
	}
	return ts
}

func with(o outbox.Event, f func(*outbox.Event)) outbox.Event { f(&o); return o }

// world is a migrated database and a broker with the outcome topic.
type world struct {
	t      *testing.T
	db     *sqlx.DB
	broker *kafkatest.Broker
	client sarama.Client
	m      *metrics.Metrics
	seq    int
	sends  *sends
	// relaysStarted numbers the relays.
	relaysStarted int
}

func newWorld(t *testing.T) *world {
	t.Helper()
	return newWorldVia(t, pgbouncer.Routes()[0])
}

// newWorldVia is a world whose relays reach the database by route.
func newWorldVia(t *testing.T, route pgbouncer.Route) *world {
	t.Helper()
	_, dsn := dbtest.New(t)
	db := dbtest.Open(t, route.Via(t, dsn), 20)
	b := kafkatest.Start(t, 3)
	return &world{t: t, db: db, broker: b, client: kafkatest.Client(t, b.Addr()), m: metrics.New(prometheus.NewRegistry()), sends: &sends{}}
}

// sends records when each relay's sends to the broker began and ended.
type sends struct {
	mu  sync.Mutex
	all []send
}

type send struct {
	relay      int
	began, end time.Time
}

// recording is a relay's producer that records its sends.
type recording struct {
	sarama.SyncProducer
	relay int
	log   *sends
	// gate, when set, is asked before each send: it returns once the send
	// may go.
	gate func()
}

func (p recording) SendMessages(msgs []*sarama.ProducerMessage) error {
	if p.gate != nil {
		p.gate()
	}
	began := time.Now()
	err := p.SyncProducer.SendMessages(msgs)
	p.log.mu.Lock()
	p.log.all = append(p.log.all, send{relay: p.relay, began: began, end: time.Now()})
	p.log.mu.Unlock()
	return err
}

// overlaps returns the pairs of sends of two different relays that were
// under way at the same time.
func (s *sends) overlaps() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for i, a := range s.all {
		for _, b := range s.all[i+1:] {
			if a.relay != b.relay && a.began.Before(b.end) && b.began.Before(a.end) {
				out = append(out, fmt.Sprintf("relay %d %s–%s and relay %d %s–%s", a.relay, a.began.Format(time.StampMicro), a.end.Format(time.StampMicro),
					b.relay, b.began.Format(time.StampMicro), b.end.Format(time.StampMicro)))
			}
		}
	}
	return out
}

// relays returns the relays that sent something.
func (s *sends) relays() map[int]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int]int{}
	for _, x := range s.all {
		out[x.relay]++
	}
	return out
}

// record writes one outcome of order in a transaction of its own.
func (w *world) record(orderID int64, typ string) outbox.Event {
	w.t.Helper()
	w.seq++
	ev := order.Event{ID: uuid.Must(uuid.NewV7()), OrderID: orderID, CustomerID: 9, Amount: order.Money{Minor: int64(100 + w.seq), Currency: "EUR"}}
	o := outbox.NewEvent(typ, ev, "", time.Now())
	w.insert(o)
	return o
}

// insert records o in a transaction of its own.
func (w *world) insert(o outbox.Event) {
	w.t.Helper()
	if err := postgres.InTx(context.Background(), w.db, func(tx *sqlx.Tx) error {
		return outbox.Record(context.Background(), tx, []outbox.Event{o})
	}); err != nil {
		w.t.Fatal(err)
	}
}

// relay starts a relay and returns the function that stops it.
func (w *world) relay() (stop func()) {
	w.t.Helper()
	_, stop = w.relayGated(nil)
	return stop
}

// relayGated starts a relay whose sends each wait for gate (nil: none),
// and returns the function that cancels its context (the stop's signal)
// and the one that stops it and waits until it has.
func (w *world) relayGated(gate func()) (cancel, stop func()) {
	w.t.Helper()
	env := map[string]string{"KAFKA_BROKERS": w.broker.Addr()}
	var k config.Kafka
	if err := config.Load(env, &k); err != nil {
		w.t.Fatal(err)
	}
	cfg, err := kafka.ProducerConfig(k)
	if err != nil {
		w.t.Fatal(err)
	}
	producer, err := sarama.NewSyncProducer(w.broker.Addrs, cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	w.relaysStarted++
	r := outbox.NewRelay(w.db, recording{producer, w.relaysStarted, w.sends, gate}, w.broker.OutcomeTopic, w.m, slog.New(slog.NewTextHandler(io.Discard, nil)))
	r.MaxBytes = 4096
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
			producer.Close()
		})
	}
	w.t.Cleanup(stop)
	return cancel, stop
}

// published waits until n records are on the outcome topic and returns
// the outcome eventIds by order key, in topic order.
func (w *world) published(n int) map[string][]string {
	w.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		msgs := w.read()
		if len(msgs) >= n {
			out := map[string][]string{}
			for _, m := range msgs {
				var v struct {
					EventID string `json:"eventId"`
				}
				if err := json.Unmarshal(m.Value, &v); err != nil {
					w.t.Fatalf("published value %q: %v", m.Value, err)
				}
				out[string(m.Key)] = append(out[string(m.Key)], v.EventID)
			}
			if len(msgs) > n {
				w.t.Fatalf("%d records published, want %d", len(msgs), n)
			}
			return out
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%d of %d outcome events published after 30s", len(msgs), n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// publishedAtLeast waits until the outbox is empty and at least n
// records are on the outcome topic, and returns the outcome eventIds by
// order key, in topic order: a relay that stopped between a send and its
// mark has its rows published again (the same eventIds).
func (w *world) publishedAtLeast(n int) map[string][]string {
	w.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for w.unpublished() > 0 {
		if time.Now().After(deadline) {
			w.t.Fatalf("%d outcome events unpublished after 60s", w.unpublished())
		}
		time.Sleep(100 * time.Millisecond)
	}
	msgs := w.read()
	if len(msgs) < n {
		w.t.Fatalf("%d records published, want at least %d", len(msgs), n)
	}
	out := map[string][]string{}
	for _, m := range msgs {
		var v struct {
			EventID string `json:"eventId"`
		}
		if err := json.Unmarshal(m.Value, &v); err != nil {
			w.t.Fatalf("published value %q: %v", m.Value, err)
		}
		out[string(m.Key)] = append(out[string(m.Key)], v.EventID)
	}
	return out
}

// read returns the outcome topic's records. A topic just created may
// answer that its leader moved (NOT_LEADER_OR_FOLLOWER while the broker's
// metadata settles): it is read again, for up to 10 s.
func (w *world) read() []*sarama.ConsumerMessage {
	w.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		msgs, err := embeddedkafka.ReadTopic(ctx, w.client, w.broker.OutcomeTopic)
		cancel()
		if err == nil {
			return msgs
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("read %s: %v", w.broker.OutcomeTopic, err)
		}
		time.Sleep(100 * time.Millisecond)
		_ = w.client.RefreshMetadata(w.broker.OutcomeTopic)
	}
}

func (w *world) unpublished() int {
	w.t.Helper()
	var n int
	if err := w.db.Get(&n, `SELECT count(*) FROM outbox WHERE published_at IS NULL`); err != nil {
		w.t.Fatal(err)
	}
	return n
}

// Rows recorded while no relay runs (a crash between the commit and the
// publication) are published once one starts, with the eventIds they were
// recorded with, in commit order per order, also when two replicas relay at
// once and the relaying one stops half way.
func TestRelay_PublishesEveryRowOnceInOrderPerOrder(t *testing.T) {
	for _, route := range pgbouncer.Routes() {
		t.Run(route.Name, func(t *testing.T) { testRelayPublishesEveryRowOnceInOrderPerOrder(t, route) })
	}
}

func testRelayPublishesEveryRowOnceInOrderPerOrder(t *testing.T, route pgbouncer.Route) {
	w := newWorldVia(t, route)
	want := map[string][]string{}
	recordRound := func(orders int) {
		for round := range 3 {
			for o := range int64(orders) {
				typ := outbox.Declined
				if round == 2 {
					typ = outbox.Succeeded
				}
				rec := w.record(100+o, typ)
				want[strconv.FormatInt(100+o, 10)] = append(want[strconv.FormatInt(100+o, 10)], rec.EventID.String())
			}
		}
	}
	recordRound(20)

	stopFirst := w.relay()
	w.relay()
	got := w.published(60)
	for key, ids := range want {
		if fmt.Sprint(got[key]) != fmt.Sprint(ids) {
			t.Errorf("order %s: published %v, recorded %v", key, got[key], ids)
		}
	}
	// The relaying replica stops; the other takes over.
	stopFirst()
	for o := range int64(20) {
		rec := w.record(100+o, outbox.Succeeded)
		want[strconv.FormatInt(100+o, 10)] = append(want[strconv.FormatInt(100+o, 10)], rec.EventID.String())
	}
	got = w.published(80)
	for key, ids := range want {
		if fmt.Sprint(got[key]) != fmt.Sprint(ids) {
			t.Errorf("after the take-over, order %s: published %v, recorded %v", key, got[key], ids)
		}
	}
	if n := w.unpublished(); n != 0 {
		t.Errorf("%d rows not marked published", n)
	}
	if got := testutil.ToFloat64(w.m.OutboxPublished.WithLabelValues(outbox.Succeeded)); got != 40 {
		t.Errorf("billing_outbox_published_total{event_type=succeeded} = %v, want 40", got)
	}
	if o := w.sends.overlaps(); len(o) > 0 {
		t.Errorf("two relays sent at once: %s", strings.Join(o, "; "))
	}
}

// Relays started and stopped while outcomes are recorded, three at a time:
// one sends at a time, every outcome is published, each order's in the
// order they were recorded, and nothing is held once they stopped.
func TestRelay_OneRelayAtATime(t *testing.T) {
	for _, route := range pgbouncer.Routes() {
		t.Run(route.Name, func(t *testing.T) {
			t.Parallel()
			w := newWorldVia(t, route)
			want := map[string][]string{}
			const orders, rounds = 30, 8
			stops := []func(){w.relay(), w.relay(), w.relay()}
			for round := range rounds {
				for o := range int64(orders) {
					rec := w.record(1000+o, outbox.Declined)
					key := strconv.FormatInt(1000+o, 10)
					want[key] = append(want[key], rec.EventID.String())
				}
				// The relays come and go: the oldest stops (it may be the
				// one relaying), a new one starts.
				if round%2 == 1 {
					stops[0]()
					stops = append(stops[1:], w.relay())
				}
				time.Sleep(100 * time.Millisecond)
			}
			got := w.publishedAtLeast(orders * rounds)
			for key, ids := range want {
				if fmt.Sprint(dedup(got[key])) != fmt.Sprint(ids) {
					t.Errorf("order %s: published %v, recorded %v", key, got[key], ids)
				}
			}
			for _, stop := range stops {
				stop()
			}
			if o := w.sends.overlaps(); len(o) > 0 {
				t.Errorf("two relays sent at once: %s", strings.Join(o, "; "))
			}
			t.Logf("sends per relay: %v", w.sends.relays())
			var held, locks int
			if err := w.db.Get(&held, `SELECT count(*) FROM billing_lease WHERE expires_at > now()`); err != nil {
				t.Fatal(err)
			}
			if err := w.db.Get(&locks, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`); err != nil {
				t.Fatal(err)
			}
			if held != 0 || locks != 0 {
				t.Errorf("after every relay stopped: %d leases and %d advisory locks held", held, locks)
			}
		})
	}
}

// dedup keeps the first of each eventId: consumers deduplicate so.
func dedup(ids []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

// A row that can never be published (its value is not JSON, or too large
// for the topic) is marked dead and passed over; the rows behind it go out.
func TestRelay_ARowItCannotPublishDoesNotStopIt(t *testing.T) {
	w := newWorld(t)
	before := w.record(1, outbox.Succeeded)
	for _, payload := range [][]byte{[]byte("not json"), []byte(`{"eventId":"` + strings.Repeat("x", 5000) + `"}`)} {
		if _, err := w.db.Exec(`INSERT INTO outbox (event_id, order_id, event_type, causation_id, payload) VALUES ($1, 2, 'payment.succeeded.v1', $2, $3)`,
			uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), payload); err != nil {
			t.Fatal(err)
		}
	}
	after := w.record(3, outbox.Declined)
	w.relay()
	got := w.published(2)
	if got["1"][0] != before.EventID.String() || got["3"][0] != after.EventID.String() {
		t.Errorf("published %v, want the two valid rows", got)
	}
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(w.m.OutboxDead) != 2 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	var dead int
	if err := w.db.Get(&dead, `SELECT count(*) FROM outbox_dead WHERE last_error <> '' AND event_id NOT IN (SELECT event_id FROM outbox)`); err != nil || dead != 2 {
		t.Errorf("dead rows with their reason = %d (%v), want 2", dead, err)
	}
}

// A row published whose publication was not recorded (the relay stopped
// between the broker's acknowledgement and the mark) is published again
// with the same eventId: at least once, deduplicated by the consumer.
func TestRelay_RepublishesWithTheSameEventID(t *testing.T) {
	w := newWorld(t)
	rec := w.record(7, outbox.Succeeded)
	stop := w.relay()
	w.published(1)
	stop()
	w.insert(rec) // the same row again: as if its deletion had not committed
	w.relay()
	got := w.published(2)
	if fmt.Sprint(got["7"]) != fmt.Sprint([]string{rec.EventID.String(), rec.EventID.String()}) {
		t.Errorf("published %v, want the same eventId twice", got["7"])
	}
}

// A relay stopped (SIGTERM) while the broker takes its batch records
// what it published before it stops: the next relay does not publish it
// again.
func TestRelay_StoppedMidSendRecordsWhatItSent(t *testing.T) {
	w := newWorld(t)
	for o := range int64(5) {
		w.record(200+o, outbox.Succeeded)
	}
	sending, stopped := make(chan struct{}), make(chan struct{})
	var once sync.Once
	cancel, stop := w.relayGated(func() {
		once.Do(func() {
			close(sending)
			<-stopped // the stop comes while the batch is on its way
		})
	})
	<-sending
	cancel()
	close(stopped)
	stop()
	if n := w.unpublished(); n != 0 {
		t.Fatalf("%d rows the stopped relay sent are not marked published: the next relay publishes them again", n)
	}
	w.relay()
	time.Sleep(time.Second) // a round of the second relay
	if got := w.published(5); len(got) != 5 {
		t.Errorf("published the outcomes of %d orders, want 5", len(got))
	}
}

// An outcome recorded again is announced under the same eventId: when the
// row is still there (a parked message delivered twice) nothing new is
// recorded, and when a database failover lost it after it was published,
// the consumer, deduplicating by eventId as docs/events.md tells it to,
// sees the payment's outcome once.
func TestRecord_AnOutcomeRecordedAgainKeepsItsEventID(t *testing.T) {
	w := newWorld(t)
	first := w.record(7, outbox.Succeeded)
	again := first
	again.OccurredAt = first.OccurredAt.Add(time.Minute)
	w.insert(again) // still there: nothing happens
	var rows int
	if err := w.db.Get(&rows, `SELECT count(*) FROM outbox`); err != nil {
		t.Fatal(err)
	}
	if rows != 1 {
		t.Fatalf("%d outbox rows after recording one outcome twice, want 1", rows)
	}
	stop := w.relay()
	w.published(1)
	stop()

	// The failover: the row is gone, the event is consumed again, the
	// provider answers the same, and the outcome is recorded again.
	if _, err := w.db.Exec(`DELETE FROM outbox`); err != nil {
		t.Fatal(err)
	}
	ev := order.Event{ID: first.CausationID, OrderID: first.OrderID, CustomerID: first.CustomerID, Amount: first.Amount}
	w.insert(outbox.NewEvent(outbox.Succeeded, ev, "", time.Now()))
	w.relay()
	got := w.published(2)
	if fmt.Sprint(got["7"]) != fmt.Sprint([]string{first.EventID.String(), first.EventID.String()}) {
		t.Errorf("published %v, want %s twice (one outcome for the consumer)", got["7"], first.EventID)
	}
}
