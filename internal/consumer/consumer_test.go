package consumer_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/trace/noop"

	"example.com/billing/internal/billing"
	"example.com/billing/internal/config"
	"example.com/billing/internal/consumer"
	"example.com/billing/internal/dev/embeddedkafka"
	"example.com/billing/internal/dlq"
	"example.com/billing/internal/dlq/reason"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/order"
	"example.com/billing/internal/testenv/kafkatest"
	"example.com/billing/internal/testenv/wait"
)

// These tests exercise the consumer's offset and per-key logic against a real
// broker over TCP. The processor is a recorder standing in for billing: the
// database and the provider are not what is under test here.

// testEvents names the events of these tests. Every message billing sees
// is a valid order.confirmed.v1 event (the consumer decodes before handing
// anything over, and parks what does not decode), so each test message is
// one, known to the recorder by the name it was made for.
var (
	testEvents sync.Map // event id → name
	testOrders atomic.Int64
)

// event returns the value of a fresh valid event named name.
func event(name string) []byte {
	ev, err := order.New(testOrders.Add(1), 7, order.Money{Minor: 1999, Currency: "EUR"}, time.Now())
	if err != nil {
		panic(err)
	}
	testEvents.Store(ev.ID, name)
	b, err := ev.MarshalJSON()
	if err != nil {
		panic(err)
	}
	return b
}

// nameOf is the name ev was made for.
func nameOf(ev order.Event) string {
	name, _ := testEvents.Load(ev.ID)
	return name.(string)
}

// recorder is a consumer.Processor that records what it saw, and can hold or
// fail chosen events, by name.
type recorder struct {
	mu        sync.Mutex
	seen      []string // values in processing order
	finished  map[string]int
	inFlight  atomic.Int32
	maxFlight atomic.Int32

	delay    atomic.Int64             // time.Duration per value
	hold     map[string]chan struct{} // value → released when closed
	fail     func(value string) bool
	failures atomic.Int32 // tries fail failed
}

func newRecorder() *recorder {
	return &recorder{finished: map[string]int{}, hold: map[string]chan struct{}{}}
}

// Handle is what billing would take a while to do with m.
func (r *recorder) Handle(ctx context.Context, m billing.Message) (billing.Result, error) {
	n := r.inFlight.Add(1)
	defer r.inFlight.Add(-1)
	for {
		m := r.maxFlight.Load()
		if n <= m || r.maxFlight.CompareAndSwap(m, n) {
			break
		}
	}
	s := nameOf(m.Event)
	if ch, ok := r.holdOf(s); ok {
		select {
		case <-ch:
		case <-ctx.Done():
			return billing.Result{}, ctx.Err() // Pending
		}
	}
	if r.fail != nil && r.fail(s) {
		r.failures.Add(1)
		return billing.Result{}, fmt.Errorf("outage for %s", s) // Pending
	}
	if d := time.Duration(r.delay.Load()); d > 0 {
		time.Sleep(d)
	}
	r.mu.Lock()
	r.seen = append(r.seen, s)
	r.finished[s]++
	r.mu.Unlock()
	return billing.Result{Outcome: billing.Charged}, nil
}

// failingRecorder is a recorder that fails the values starting with prefix
// while outage is true, as it is at first.
func failingRecorder(prefix string) (rec *recorder, outage *atomic.Bool) {
	rec, outage = newRecorder(), new(atomic.Bool)
	outage.Store(true)
	rec.fail = func(v string) bool { return outage.Load() && strings.HasPrefix(v, prefix) }
	return rec, outage
}

func (r *recorder) holdOf(v string) (chan struct{}, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch, ok := r.hold[v]
	return ch, ok
}

func (r *recorder) finishedCount(v string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.finished[v]
}

func (r *recorder) order() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.seen...)
}

type member struct {
	consumer *consumer.Consumer
	metrics  *metrics.Metrics
	cancel   context.CancelFunc
	done     chan error
}

func kafkaConfig(b *kafkatest.Broker, instance string) config.Kafka {
	return config.Kafka{
		Brokers: b.Addrs, Topic: b.Topic, GroupID: b.Group,
		DLQTopic: b.DLQTopic, ClientID: "test", Version: "3.6.0", InstanceID: instance,
	}
}

// startMember joins the group with proc and opts, parking in b's
// dead-letter topic.
func startMember(t *testing.T, b *kafkatest.Broker, proc consumer.Processor, opts consumer.Options, instance string) *member {
	t.Helper()
	return startMemberWith(t, b, proc, nil, opts, instance, nil)
}

// startMemberWith is startMember parking through parker (nil: b's
// dead-letter topic), with the consumer client's configuration changed by
// edit.
func startMemberWith(t *testing.T, b *kafkatest.Broker, proc consumer.Processor, parker consumer.Parker, opts consumer.Options, instance string, edit func(*sarama.Config)) *member {
	t.Helper()
	k := kafkaConfig(b, instance)
	cfg, err := kafka.ConsumerConfig(k)
	if err != nil {
		t.Fatal(err)
	}
	// Rebalances in these tests should take a second, not a heartbeat
	// interval of the production settings.
	cfg.Consumer.Group.Heartbeat.Interval = 200 * time.Millisecond
	if edit != nil {
		edit(cfg)
	}
	client, err := sarama.NewClient(k.Brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	pcfg, err := kafka.ProducerConfig(k)
	if err != nil {
		t.Fatal(err)
	}
	producer, err := sarama.NewSyncProducer(k.Brokers, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	opts.Topic, opts.Group = b.Topic, b.Group
	m := metrics.New(prometheus.NewRegistry())
	if parker == nil {
		parker = dlq.NewWriter(producer, b.DLQTopic, b.Group, 0, m)
	}
	c, err := consumer.NewConsumer(client, proc, parker, opts, m,
		noop.NewTracerProvider(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	mb := &member{consumer: c, metrics: m, cancel: cancel, done: make(chan error, 1)}
	go func() {
		mb.done <- c.Run(ctx)
		producer.Close()
		client.Close()
	}()
	t.Cleanup(func() { mb.stop(t) })
	return mb
}

func (m *member) stop(t *testing.T) {
	t.Helper()
	if m.cancel == nil {
		return
	}
	m.cancel()
	m.cancel = nil
	select {
	case <-m.done:
	case <-time.After(30 * time.Second):
		t.Errorf("consumer did not stop")
	}
}

func options() consumer.Options {
	return consumer.Options{MaxInFlight: 64, DrainTimeout: 5 * time.Second}
}

func TestConsumer_KeysRunConcurrentlyEachInOffsetOrder(t *testing.T) {
	b := kafkatest.Start(t, 2)
	client := kafkatest.Client(t, b.Addr())
	rec := newRecorder()
	rec.delay.Store(int64(2 * time.Millisecond))

	const keys, perKey = 20, 15
	for p := range int32(2) {
		var msgs []kafkatest.Message
		for i := range perKey { // interleaved: k0#0 k1#0 ... k0#1 ...
			for k := range keys {
				key := fmt.Sprintf("p%d-k%d", p, k)
				msgs = append(msgs, kafkatest.Message{Partition: p, Key: []byte(key), Value: event(key + "#" + strconv.Itoa(i))})
			}
		}
		kafkatest.Produce(t, client, b.Topic, msgs...)
	}
	startMember(t, b, rec, options(), "")
	kafkatest.WaitCaughtUp(t, client, b.Group, b.Topic, 30*time.Second)

	next := map[string]int{}
	for _, v := range rec.order() {
		key, seq, _ := strings.Cut(v, "#")
		n, _ := strconv.Atoi(seq)
		if n != next[key] {
			t.Fatalf("key %s: event %d processed when %d was due", key, n, next[key])
		}
		next[key]++
	}
	if len(next) != 2*keys {
		t.Errorf("%d keys processed, want %d", len(next), 2*keys)
	}
	if rec.maxFlight.Load() < 4 {
		t.Errorf("at most %d messages ran at once: keys are not concurrent", rec.maxFlight.Load())
	}
}

func TestConsumer_CommittedOffsetNeverPassesAnUnfinishedMessage(t *testing.T) {
	b := kafkatest.Start(t, 1)
	client := kafkatest.Client(t, b.Addr())
	rec := newRecorder()
	release := make(chan struct{})
	rec.hold["held"] = release

	// Offsets 0..4 finish, 5 is held, 6..19 (other keys) finish.
	var msgs []kafkatest.Message
	for i := range 20 {
		v := "v" + strconv.Itoa(i)
		if i == 5 {
			v = "held"
		}
		msgs = append(msgs, kafkatest.Message{Key: []byte("k" + strconv.Itoa(i)), Value: event(v)})
	}
	kafkatest.Produce(t, client, b.Topic, msgs...)
	startMember(t, b, rec, options(), "")

	deadline := time.Now().Add(10 * time.Second)
	for rec.finishedCount("v19") == 0 || rec.finishedCount("v4") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("messages after the held one were not processed: one key blocks the partition")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Several auto-commit intervals pass: the commit stays at the held message.
	time.Sleep(2500 * time.Millisecond)
	if got := kafkatest.Committed(t, client, b.Group, b.Topic)[0]; got != 5 {
		t.Fatalf("committed offset %d while offset 5 is unfinished, want 5", got)
	}
	close(release)
	kafkatest.WaitCaughtUp(t, client, b.Group, b.Topic, 10*time.Second)
}

func TestConsumer_AFailingKeyHoldsOnlyItsOwnMessages(t *testing.T) {
	b := kafkatest.Start(t, 1)
	client := kafkatest.Client(t, b.Addr())
	rec, outage := failingRecorder("bad")

	// bad-0 fails until the outage ends; "later", a later message of its
	// key, must wait for it; every other key goes on.
	var msgs []kafkatest.Message
	msgs = append(msgs, kafkatest.Message{Key: []byte("bad-key"), Value: event("bad-0")})
	for i := range 30 {
		msgs = append(msgs, kafkatest.Message{Key: []byte("good-" + strconv.Itoa(i)), Value: event("good-" + strconv.Itoa(i))})
		if i == 15 {
			msgs = append(msgs, kafkatest.Message{Key: []byte("bad-key"), Value: event("later")})
		}
	}
	kafkatest.Produce(t, client, b.Topic, msgs...)
	mb := startMember(t, b, rec, options(), "")

	wait.For(t, 10*time.Second, "every good message processed while one key fails", func() bool {
		for i := range 30 {
			if rec.finishedCount("good-"+strconv.Itoa(i)) == 0 {
				return false
			}
		}
		return true
	})
	if rec.finishedCount("later") != 0 {
		t.Fatal("a later message of the failing key was processed before the failing one")
	}
	if got := kafkatest.Committed(t, client, b.Group, b.Topic)[0]; got > 0 {
		t.Fatalf("committed offset %d passed the failing message at 0", got)
	}
	wait.For(t, 5*time.Second, "the failing key retried", func() bool { return rec.failures.Load() > 1 })
	if got := testutil.ToFloat64(mb.metrics.Retrying); got != 2 {
		t.Errorf("billing_messages_retrying = %v, want 2 (the failing message and the one of its key behind it)", got)
	}
	outage.Store(false)
	kafkatest.WaitCaughtUp(t, client, b.Group, b.Topic, 15*time.Second)
	if rec.finishedCount("bad-0") != 1 || rec.finishedCount("later") != 1 {
		t.Errorf("after the outage bad-0 finished %d times and later %d, want 1 each", rec.finishedCount("bad-0"), rec.finishedCount("later"))
	}
	order := strings.Join(rec.order(), " ")
	if strings.Index(order, "later") < strings.Index(order, "bad-0") {
		t.Errorf("the failing key's messages were processed out of offset order: %s", order)
	}
	if got := testutil.ToFloat64(mb.metrics.Retrying); got != 0 {
		t.Errorf("billing_messages_retrying = %v after the outage, want 0", got)
	}
}

// A key that fails for a long time must not stop the partition: the
// messages behind it must not fill the in-flight limit and pause fetching
// for every other key.
func TestConsumer_AStuckKeyDoesNotStopThousandsBehindIt(t *testing.T) {
	b := kafkatest.Start(t, 1)
	client := kafkatest.Client(t, b.Addr())
	rec, outage := failingRecorder("stuck")

	const others = 20000
	msgs := []kafkatest.Message{{Key: []byte("stuck"), Value: event("stuck-0")}}
	for i := range others {
		v := "o" + strconv.Itoa(i)
		msgs = append(msgs, kafkatest.Message{Key: []byte(v), Value: event(v)})
		if i%5000 == 4999 {
			msgs = append(msgs, kafkatest.Message{Key: []byte("stuck"), Value: event("stuck-" + strconv.Itoa(i/5000+1))})
		}
	}
	for chunk := range slices.Chunk(msgs, 2000) {
		kafkatest.Produce(t, client, b.Topic, chunk...)
	}
	opts := options()
	mb := startMember(t, b, rec, opts, "")

	wait.For(t, 60*time.Second, "every message of the other keys processed while one key is stuck", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.finished) == others
	})
	if got := kafkatest.Committed(t, client, b.Group, b.Topic)[0]; got > 0 {
		t.Fatalf("committed offset %d passed the stuck message at 0", got)
	}
	// What the consumer holds stays within MaxInFlight whatever the
	// backlog: the stuck key's five messages.
	if got := testutil.ToFloat64(mb.metrics.Retrying); got != 5 {
		t.Errorf("billing_messages_retrying = %v, want 5 (the stuck key's messages)", got)
	}
	if max := rec.maxFlight.Load(); max > int32(opts.MaxInFlight) {
		t.Errorf("%d messages at once, more than MaxInFlight %d", max, opts.MaxInFlight)
	}

	outage.Store(false)
	kafkatest.WaitCaughtUp(t, client, b.Group, b.Topic, 30*time.Second)
	var stuck []string
	for _, v := range rec.order() {
		if strings.HasPrefix(v, "stuck") {
			stuck = append(stuck, v)
		}
	}
	if want := []string{"stuck-0", "stuck-1", "stuck-2", "stuck-3", "stuck-4"}; !slices.Equal(stuck, want) {
		t.Errorf("the stuck key's messages were processed as %v, want %v", stuck, want)
	}
}

func TestConsumer_RevocationMidFlightLosesNothing(t *testing.T) {
	b := kafkatest.Start(t, 4)
	client := kafkatest.Client(t, b.Addr())
	const perPartition = 200
	for p := range int32(4) {
		var msgs []kafkatest.Message
		for i := range perPartition {
			v := fmt.Sprintf("p%d-%d", p, i)
			msgs = append(msgs, kafkatest.Message{Partition: p, Key: []byte(strconv.Itoa(i % 10)), Value: event(v)})
		}
		kafkatest.Produce(t, client, b.Topic, msgs...)
	}
	// Hold every value: the first member's work is in flight, unfinished,
	// when the rebalance revokes its partitions.
	rec := newRecorder()
	gate := make(chan struct{})
	for p := range 4 {
		for i := range perPartition {
			rec.hold[fmt.Sprintf("p%d-%d", p, i)] = gate
		}
	}
	opts := options()
	opts.DrainTimeout = time.Second

	a := startMember(t, b, rec, opts, "")
	wait.For(t, 10*time.Second, "first member busy", func() bool { return a.consumer.Ready() && rec.inFlight.Load() > 0 })
	bm := startMember(t, b, rec, opts, "")
	wait.For(t, 20*time.Second, "second member assigned", func() bool {
		return testutil.ToFloat64(bm.metrics.Rebalances.WithLabelValues("assigned")) >= 1
	})
	if got := testutil.ToFloat64(a.metrics.Rebalances.WithLabelValues("revoked")); got < 1 {
		t.Fatalf("no partition was revoked from the first member")
	}
	close(gate)
	// Then a leaves while it works: its partitions move to the second member.
	a.stop(t)
	kafkatest.WaitCaughtUp(t, client, b.Group, b.Topic, 60*time.Second)

	for p := range 4 {
		for i := range perPartition {
			if v := fmt.Sprintf("p%d-%d", p, i); rec.finishedCount(v) == 0 {
				t.Fatalf("message %s was never processed", v)
			}
		}
	}
	if got := testutil.ToFloat64(bm.metrics.Rebalances.WithLabelValues("assigned")); got < 4 {
		t.Errorf("the second member was assigned %v partitions, want all 4 in the end", got)
	}
}

func TestConsumer_StaticMemberRestartDoesNotRebalanceTheOthers(t *testing.T) {
	b := kafkatest.Start(t, 4)
	rec := newRecorder()
	a := startMember(t, b, rec, options(), "pod-a")
	other := startMember(t, b, rec, options(), "pod-b")
	wait.For(t, 20*time.Second, "both members assigned", func() bool {
		return testutil.ToFloat64(a.metrics.Rebalances.WithLabelValues("assigned")) >= 1 &&
			testutil.ToFloat64(other.metrics.Rebalances.WithLabelValues("assigned")) >= 1 &&
			testutil.ToFloat64(a.metrics.Rebalances.WithLabelValues("assigned"))+testutil.ToFloat64(other.metrics.Rebalances.WithLabelValues("assigned"))-
				testutil.ToFloat64(a.metrics.Rebalances.WithLabelValues("revoked"))-testutil.ToFloat64(other.metrics.Rebalances.WithLabelValues("revoked")) == 4
	})
	assigned := testutil.ToFloat64(other.metrics.Rebalances.WithLabelValues("assigned"))
	revoked := testutil.ToFloat64(other.metrics.Rebalances.WithLabelValues("revoked"))

	// pod-a restarts (a rolling deploy) and comes back with its instance id
	// within the session timeout.
	a.stop(t)
	a2 := startMember(t, b, rec, options(), "pod-a")
	wait.For(t, 20*time.Second, "pod-a back with its partitions", func() bool {
		return a2.consumer.Ready() && testutil.ToFloat64(a2.metrics.Rebalances.WithLabelValues("assigned")) >= 1
	})
	time.Sleep(time.Second)
	if got := testutil.ToFloat64(other.metrics.Rebalances.WithLabelValues("revoked")); got != revoked {
		t.Errorf("pod-b lost %v partitions during pod-a's restart, want none", got-revoked)
	}
	if got := testutil.ToFloat64(other.metrics.Rebalances.WithLabelValues("assigned")); got != assigned {
		t.Errorf("pod-b was assigned %v more partitions during pod-a's restart, want none", got-assigned)
	}
}

// sizer is a dead-letter writer that keeps each message a while and records
// the most value bytes it held at once: large values are no events, so the
// consumer parks them.
type sizer struct{ inFlight, peak atomic.Int64 }

func (s *sizer) Park(m *sarama.ConsumerMessage, why reason.Reason) (reason.Reason, error) {
	n := int64(len(m.Value))
	cur := s.inFlight.Add(n)
	defer s.inFlight.Add(-n)
	for {
		p := s.peak.Load()
		if cur <= p || s.peak.CompareAndSwap(p, cur) {
			break
		}
	}
	time.Sleep(50 * time.Millisecond)
	return why, nil
}

func (s *sizer) Close() error { return nil }

// MaxInFlightBytes bounds what is taken off the partitions in bytes: with
// 64 messages in flight, 200 KB messages would put 12.8 MB in flight; a
// 1 MiB budget lets at most one message more than fits through.
func TestConsumer_InFlightBytesAreBounded(t *testing.T) {
	b := kafkatest.Start(t, 1)
	client := kafkatest.Client(t, b.Addr())
	const size, count, budget = 200_000, 40, 1 << 20
	var msgs []kafkatest.Message
	for i := range count {
		value := []byte(strings.Repeat(strconv.Itoa(i%10), size))
		msgs = append(msgs, kafkatest.Message{Key: []byte("k" + strconv.Itoa(i)), Value: value})
	}
	for _, m := range msgs { // one at a time: a batch of them would exceed the broker's limit
		kafkatest.Produce(t, client, b.Topic, m)
	}
	proc := &sizer{}
	opts := options()
	opts.MaxInFlightBytes = budget
	startMemberWith(t, b, newRecorder(), proc, opts, "", nil)
	kafkatest.WaitCaughtUp(t, client, b.Group, b.Topic, 60*time.Second)
	if got := proc.peak.Load(); got > budget+size {
		t.Errorf("%d bytes of messages were being processed at once, want at most %d (MaxInFlightBytes %d plus one message)", got, budget+size, budget)
	}
	if got := proc.peak.Load(); got < 2*size {
		t.Errorf("at most %d bytes at once: the budget let fewer than two messages through", got)
	}
}

// Finished messages are garbage: nothing of the consumer's keeps them
// alive. sarama slices a message's value out of its whole fetch response,
// so one stale pointer holds a response; reused batch arrays and popped
// queue slots once held dozens (a backlog of 900 KB values peaked at 150
// MiB RSS where it later needed 72, BENCHMARKS.md).
func TestConsumer_FinishedMessagesAreNotKeptInMemory(t *testing.T) {
	b := kafkatest.Start(t, 1)
	client := kafkatest.Client(t, b.Addr())
	const count, size = 48, 900 << 10
	for i := range count {
		v := append([]byte(strconv.Itoa(i)+"-"), make([]byte, size)...)
		kafkatest.Produce(t, client, b.Topic, kafkatest.Message{Key: []byte("k" + strconv.Itoa(i)), Value: v})
	}
	before := heapInUse()
	startMemberWith(t, b, newRecorder(), &sizer{}, options(), "", nil) // keeps nothing of the values
	kafkatest.WaitCaughtUp(t, client, b.Group, b.Topic, 30*time.Second)
	time.Sleep(200 * time.Millisecond) // the last answers are handled
	held := int64(heapInUse()) - int64(before)
	t.Logf("%.1f MiB more in use after the backlog was finished", float64(held)/(1<<20))
	if held > 8<<20 {
		t.Errorf("%.1f MiB more in use after %d messages of %d KB were finished, want under 8 MiB: finished messages are kept alive",
			float64(held)/(1<<20), count, size>>10)
	}
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC() // the second cycle frees what the first one's cleanups released
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// A dead-letter topic that takes no writes (here: it does not exist yet) is
// an outage of the DLQ, not a fault of the message: the message is retried
// (cause dlq) and never marked, the partition's other keys go on, and it is
// parked once the topic takes it.
func TestConsumer_ADeadLetterOutageIsRetriedNotSkipped(t *testing.T) {
	b := kafkatest.Start(t, 1)
	client := kafkatest.Client(t, b.Addr())
	b.DLQTopic += ".later"
	msgs := []kafkatest.Message{{Key: []byte("k-bad"), Value: []byte("bad-0")}}
	for i := range 20 {
		msgs = append(msgs, kafkatest.Message{Key: []byte("k" + strconv.Itoa(i)), Value: event("good-" + strconv.Itoa(i))})
	}
	kafkatest.Produce(t, client, b.Topic, msgs...)
	rec := newRecorder()
	mb := startMember(t, b, rec, options(), "") // bad-0 is no event: parked without reaching it

	wait.For(t, 30*time.Second, "the failed dead-letter write retried", func() bool {
		return testutil.ToFloat64(mb.metrics.Retries.WithLabelValues("dlq")) > 0
	})
	wait.For(t, 10*time.Second, "the other keys charged", func() bool {
		for i := range 20 {
			if rec.finishedCount("good-"+strconv.Itoa(i)) == 0 {
				return false
			}
		}
		return true
	})
	if got := kafkatest.Committed(t, client, b.Group, b.Topic)[0]; got > 0 {
		t.Fatalf("committed offset %d passed the message the DLQ did not take", got)
	}

	b.CreateTopic(t, b.DLQTopic, 1, nil)
	kafkatest.WaitCaughtUp(t, client, b.Group, b.Topic, 30*time.Second)
	parked, err := embeddedkafka.ReadTopic(context.Background(), client, b.DLQTopic)
	if err != nil {
		t.Fatal(err)
	}
	if len(parked) != 1 || string(parked[0].Value) != "bad-0" {
		t.Fatalf("dead-letter topic holds %d messages, want bad-0 once", len(parked))
	}
	// What does not decode is parked by the consumer, billing never sees it.
	if got := dlq.Header(parked[0].Headers, dlq.HeaderReason); !strings.HasPrefix(got, "invalid-event: ") {
		t.Errorf("x-dlq-reason %q, want invalid-event: ...", got)
	}
	if got := testutil.ToFloat64(mb.metrics.Events.WithLabelValues("invalid")); got != 1 {
		t.Errorf("billing_events_total{outcome=invalid} = %v once parked, want 1", got)
	}
}

// A partition released while a key waits for its retry and others are in
// flight gives up every message once: freeing a message's in-flight slot
// twice (or never) leaves the member waiting for ever for a slot, and it
// never stops.
func TestConsumer_ReleaseWhileAKeyIsHeldGivesUpEachMessageOnce(t *testing.T) {
	b := kafkatest.Start(t, 1)
	client := kafkatest.Client(t, b.Addr())
	rec, _ := failingRecorder("bad")
	// A message takes longer than the held key's first backoffs: its retry
	// falls due while others are in flight.
	rec.delay.Store(int64(100 * time.Millisecond))
	msgs := []kafkatest.Message{{Key: []byte("bad"), Value: event("bad-0")}}
	for i := range 2000 {
		msgs = append(msgs, kafkatest.Message{Key: []byte("k" + strconv.Itoa(i)), Value: event("good-" + strconv.Itoa(i))})
	}
	kafkatest.Produce(t, client, b.Topic, msgs...)
	opts := options()
	for round := range 3 {
		mb := startMember(t, b, rec, opts, "")
		before := rec.failures.Load()
		wait.For(t, 20*time.Second, "the failing key retried", func() bool { return rec.failures.Load() >= before+2 })
		stopped := make(chan struct{})
		go func() { mb.stop(t); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: the member did not stop after its partition was released with a key held", round)
		}
		if got := testutil.ToFloat64(mb.metrics.Retrying); got != 0 {
			t.Errorf("round %d: billing_messages_retrying = %v after the release, want 0", round, got)
		}
	}
}

// What is in flight follows the work, not the shape of the partitions: a
// single partition with many keys and a slow provider has every key's
// message with billing at once, up to MaxInFlight. (Lanes × batch capped
// one partition at 256 before, each batch waiting for its slowest answer.)
func TestConsumer_InFlightFollowsTheWorkNotThePartitions(t *testing.T) {
	b := kafkatest.Start(t, 1)
	client := kafkatest.Client(t, b.Addr())
	const keys = 600
	var msgs []kafkatest.Message
	for i := range keys {
		msgs = append(msgs, kafkatest.Message{Key: []byte("k" + strconv.Itoa(i)), Value: event("v" + strconv.Itoa(i))})
	}
	kafkatest.Produce(t, client, b.Topic, msgs...)
	rec := newRecorder()
	rec.delay.Store(int64(500 * time.Millisecond))
	opts := options()
	opts.MaxInFlight = 400
	startMember(t, b, rec, opts, "")
	kafkatest.WaitCaughtUp(t, client, b.Group, b.Topic, 30*time.Second)
	if got := rec.maxFlight.Load(); got < 350 || got > int32(opts.MaxInFlight) {
		t.Errorf("at most %d messages with billing at once, want close to MaxInFlight %d", got, opts.MaxInFlight)
	}
}

// Stopping (SIGTERM) lets the work already handed to billing finish within
// the drain timeout: its messages are finished, not abandoned, and their
// offsets committed before the member leaves; meanwhile the partition's
// fence no longer holds, so that billing sends no new charge for them.
func TestConsumer_StoppingLetsTheWorkInFlightFinish(t *testing.T) {
	b := kafkatest.Start(t, 2)
	client := kafkatest.Client(t, b.Addr())
	const n = 40
	var msgs []kafkatest.Message
	for i := range n {
		msgs = append(msgs, kafkatest.Message{Partition: int32(i % 2), Key: []byte(strconv.Itoa(i)), Value: event("stop-" + strconv.Itoa(i))})
	}
	kafkatest.Produce(t, client, b.Topic, msgs...)
	rec := newRecorder()
	gate := make(chan struct{}) // the provider's answers
	for i := range n {
		rec.hold["stop-"+strconv.Itoa(i)] = gate
	}
	fences := &fenceLog{proc: rec}
	opts := options()
	opts.DrainTimeout = 5 * time.Second
	m := startMember(t, b, fences, opts, "")
	wait.For(t, 20*time.Second, "every message with billing", func() bool { return rec.inFlight.Load() == n })

	stopped := make(chan struct{})
	go func() { m.stop(t); close(stopped) }()
	time.Sleep(500 * time.Millisecond) // the answers come within the drain timeout
	if fences.anyHolds() {
		t.Error("a partition's fence still holds while the member stops: billing could send new charges")
	}
	close(gate)
	<-stopped
	for i := range n {
		if v := "stop-" + strconv.Itoa(i); rec.finishedCount(v) != 1 {
			t.Errorf("%s finished %d times by the stopping member, want 1", v, rec.finishedCount(v))
		}
	}
	end := kafkatest.EndOffsets(t, client, b.Topic)
	got := kafkatest.Committed(t, client, b.Group, b.Topic)
	for p, e := range end {
		if got[p] != e {
			t.Errorf("partition %d: committed %d, end %d: the finished work was not committed before the member left", p, got[p], e)
		}
	}
}

// fenceLog keeps the fences of the messages handed to proc.
type fenceLog struct {
	proc   *recorder
	mu     sync.Mutex
	fences []billing.Fence
}

func (f *fenceLog) Handle(ctx context.Context, m billing.Message) (billing.Result, error) {
	f.mu.Lock()
	f.fences = append(f.fences, m.Fence)
	f.mu.Unlock()
	return f.proc.Handle(ctx, m)
}

// anyHolds reports whether some message's fence holds.
func (f *fenceLog) anyHolds() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.ContainsFunc(f.fences, func(x billing.Fence) bool { return x != nil && x.Holds() })
}
