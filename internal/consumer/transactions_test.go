package consumer_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"example.com/billing/internal/kafka"
	"example.com/billing/internal/testenv/apachekafka"
	"example.com/billing/internal/testenv/kafkatest"
	"example.com/billing/internal/testenv/wait"
)

// Order services that publish through a Kafka transactional producer: their
// records reach the log before the transaction commits or aborts, and every
// transaction ends with a marker that takes an offset no consumer is
// handed.

// txnProducer is an order service writing the order topic in transactions.
type txnProducer interface {
	begin(t *testing.T)
	send(t *testing.T, partition int32, name string)
	commit(t *testing.T)
	abort(t *testing.T)
}

// transactionalProducers are the clients the tests write transactions
// with: Apache Kafka's own Java client, and franz-go.
var transactionalProducers = []struct {
	name  string
	start func(t *testing.T, b *kafkatest.Broker) txnProducer
}{
	{"java", startJavaTxn},
	{"franz-go", startFranzTxn},
}

// franzTxn writes through franz-go's transactional producer.
type franzTxn struct {
	cl    *kgo.Client
	topic string
}

func startFranzTxn(t *testing.T, b *kafkatest.Broker) txnProducer {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs...), kgo.TransactionalID("orders-"+t.Name()),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &franzTxn{cl: cl, topic: b.Topic}
}

func (f *franzTxn) begin(t *testing.T) {
	t.Helper()
	if err := f.cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
}

func (f *franzTxn) send(t *testing.T, partition int32, name string) {
	t.Helper()
	r := &kgo.Record{Topic: f.topic, Partition: partition, Key: []byte(name), Value: event(name)}
	if err := f.cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

func (f *franzTxn) commit(t *testing.T) { f.end(t, kgo.TryCommit) }
func (f *franzTxn) abort(t *testing.T)  { f.end(t, kgo.TryAbort) }

func (f *franzTxn) end(t *testing.T, how kgo.TransactionEndTry) {
	t.Helper()
	if err := f.cl.EndTransaction(context.Background(), how); err != nil {
		t.Fatal(err)
	}
}

// javaTxn writes through kafka-clients' KafkaProducer, in a JVM of its own.
type javaTxn struct {
	p     *apachekafka.TxnProducer
	topic string
}

func startJavaTxn(t *testing.T, b *kafkatest.Broker) txnProducer {
	t.Helper()
	if err := apachekafka.Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true, and the Java producer cannot run here: %v", err)
		}
		t.Skipf("the Java transactional producer needs Java and Maven: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := apachekafka.StartTxnProducer(ctx, b.Addr(), "orders-"+t.Name(), time.Minute, filepath.Join(t.TempDir(), "producer.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return &javaTxn{p: p, topic: b.Topic}
}

func (j *javaTxn) begin(t *testing.T) {
	t.Helper()
	if err := j.p.Begin(); err != nil {
		t.Fatal(err)
	}
}

func (j *javaTxn) send(t *testing.T, partition int32, name string) {
	t.Helper()
	if err := j.p.Send(j.topic, partition, []byte(name), event(name)); err != nil {
		t.Fatal(err)
	}
}

func (j *javaTxn) commit(t *testing.T) {
	t.Helper()
	if _, err := j.p.Commit(); err != nil {
		t.Fatal(err)
	}
}

func (j *javaTxn) abort(t *testing.T) {
	t.Helper()
	if err := j.p.Abort(); err != nil {
		t.Fatal(err)
	}
}

func TestConsumer_TakesOnlyWhatTransactionsCommittedAndReachesTheEnd(t *testing.T) {
	for _, tp := range transactionalProducers {
		t.Run(tp.name, func(t *testing.T) {
			b := kafkatest.Start(t, 2)
			client := kafkatest.Client(t, b.Addr())
			prod := tp.start(t, b)

			// 40 transactions of 5 events over both partitions, every
			// fourth aborted after its records reached the log: the last
			// one too, so that both partitions end in aborted records and
			// an abort marker.
			var committed, aborted []string
			for txn := range 40 {
				prod.begin(t)
				var names []string
				for i := range 5 {
					name := fmt.Sprintf("t%02d-e%d", txn, i)
					prod.send(t, int32(i%2), name)
					names = append(names, name)
				}
				if txn%4 == 3 {
					prod.abort(t)
					aborted = append(aborted, names...)
				} else {
					prod.commit(t)
					committed = append(committed, names...)
				}
			}

			rec := newRecorder()
			m := startMember(t, b, rec, options(), "")
			kafkatest.WaitCaughtUp(t, client, b.Group, b.Topic, 30*time.Second)

			seen := rec.order()
			for _, name := range aborted {
				if slices.Contains(seen, name) {
					t.Errorf("%s, a record of an aborted transaction, reached billing", name)
				}
			}
			for _, name := range committed {
				if n := rec.finishedCount(name); n != 1 {
					t.Errorf("%s, committed, was finished %d times, want 1", name, n)
				}
			}
			if len(seen) != len(committed) {
				t.Errorf("billing took %d records, want the %d committed", len(seen), len(committed))
			}
			// A reader of the whole topic (the demo's, the tests') ends
			// although the last offsets are markers.
			if got := len(kafkatest.ReadAll(t, client, b.Topic)); got != len(committed) {
				t.Errorf("reading the topic gave %d records, want the %d committed", got, len(committed))
			}

			// The committed offsets step over the markers: they reach the
			// high-water mark, and the lag the metric reports is 0.
			ends, err := kafka.PartitionEnds(client, b.Topic, []int32{0, 1})
			if err != nil {
				t.Fatal(err)
			}
			got := kafkatest.Committed(t, client, b.Group, b.Topic)
			for p, e := range ends {
				if got[p] != e.High || e.Stable != e.High {
					t.Errorf("partition %d: committed %d, last stable offset %d, high-water mark %d: want all equal", p, got[p], e.Stable, e.High)
				}
			}
			wait.For(t, 15*time.Second, "billing_consumer_lag 0 on both partitions", func() bool {
				// Counted first: reading a partition's gauge creates it at 0.
				return testutil.CollectAndCount(m.metrics.Lag) == 2 && lagOf(m, "0") == 0 && lagOf(m, "1") == 0
			})
		})
	}
}

func TestConsumer_AHangingTransactionHoldsItsPartitionAndIsReported(t *testing.T) {
	for _, tp := range transactionalProducers {
		t.Run(tp.name, func(t *testing.T) {
			b := kafkatest.Start(t, 1)
			client := kafkatest.Client(t, b.Addr())

			// A committed event, then a transaction left open (its
			// producer died, say), then a plain producer's event behind it.
			prod := tp.start(t, b)
			prod.begin(t)
			prod.send(t, 0, "before")
			prod.commit(t)
			prod.begin(t)
			prod.send(t, 0, "open")
			if j, ok := prod.(*javaTxn); ok { // its sends are not waited for
				if _, err := j.p.Flush(); err != nil {
					t.Fatal(err)
				}
			}
			kafkatest.Produce(t, client, b.Topic, kafkatest.Message{Key: []byte("after"), Value: event("after")})

			rec := newRecorder()
			m := startMember(t, b, rec, options(), "")
			wait.For(t, 20*time.Second, "billing_consumer_stable_offset_held_seconds > 0", func() bool {
				return testutil.ToFloat64(m.metrics.StableOffsetHeld.WithLabelValues("0")) > 0
			})
			if rec.finishedCount("before") != 1 || rec.finishedCount("after") != 0 || rec.finishedCount("open") != 0 {
				t.Fatalf("while the transaction is open: before %d, open %d, after %d; want 1, 0, 0",
					rec.finishedCount("before"), rec.finishedCount("open"), rec.finishedCount("after"))
			}

			// Its end (here an abort; the broker's own at the producer's
			// transaction.timeout.ms is the chaos suite's txn-hanging)
			// releases what waited behind it.
			prod.abort(t)
			// The abort's markers reach the partition after the producer
			// hears its answer: until then the last stable offset stays
			// at "open", where the group's committed offset already is,
			// so being caught up says nothing yet.
			wait.For(t, 30*time.Second, "the event behind the transaction finished", func() bool { return rec.finishedCount("after") == 1 })
			kafkatest.WaitCaughtUp(t, client, b.Group, b.Topic, 30*time.Second)
			if rec.finishedCount("after") != 1 || rec.finishedCount("open") != 0 {
				t.Errorf("after the abort: open %d, after %d; want 0, 1", rec.finishedCount("open"), rec.finishedCount("after"))
			}
			wait.For(t, 15*time.Second, "billing_consumer_stable_offset_held_seconds back to 0", func() bool {
				return testutil.ToFloat64(m.metrics.StableOffsetHeld.WithLabelValues("0")) == 0
			})
		})
	}
}

func lagOf(m *member, partition string) float64 {
	return testutil.ToFloat64(m.metrics.Lag.WithLabelValues(partition))
}
