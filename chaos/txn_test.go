//go:build chaos

package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kgo"

	"example.com/billing/internal/config"
	"example.com/billing/internal/dev/embeddedkafka"
	"example.com/billing/internal/dev/loadgen"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/order"
	"example.com/billing/internal/testenv/apachekafka"
)

// An order service that publishes orders.confirmed in Kafka transactions
// (issue 28): the stream's messages go out in transactions of txnSize, and
// between them come aborted transactions of phantom events, valid events of
// orders nothing else confirms, which billing must never charge, record,
// park or announce.

// txnSize is how many of the stream's messages one transaction carries:
// a transaction takes a few hundred milliseconds to commit on the suite's
// cluster, and the order service writes one after the other.
const txnSize = 20

// phantomsPerTxn is how many phantom events an aborted transaction
// carries.
const phantomsPerTxn = 5

// abortChance is the chance that a committed transaction is followed by an
// aborted one: a quarter of all transactions are aborted.
const abortChance = 1.0 / 3

// phantomOrders is the first order id of phantom events.
const phantomOrders = 1_000_000_000

// txnStream is what a transactional stream wrote besides its committed
// messages (stream.acked).
type txnStream struct {
	id string // the order service's transactional.id

	committed, aborted int // transactions
	// uncertain counts commits whose answer was lost: the log told
	// whether they had happened.
	uncertain int
	// abortedAt are the records written in aborted transactions (phantoms,
	// and the stream's messages of a transaction whose commit failed).
	abortedAt []position
	// phantoms are the phantom events, by event id.
	phantoms map[string]loadgen.Event
}

// phantom makes a new phantom event, on the partition partitionOf gives its
// key.
func (s *stream) phantom(partitionOf func([]byte) int32) (*sent, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.txn.phantoms)
	ev, err := order.New(phantomOrders+int64(n), 1+int64(n), order.Money{Minor: 1000 + int64(n), Currency: "EUR"}, time.Now())
	if err != nil {
		return nil, err
	}
	value, err := ev.MarshalJSON()
	if err != nil {
		return nil, err
	}
	s.txn.phantoms[ev.ID.String()] = loadgen.Event{ID: ev.ID, OrderID: ev.OrderID, CustomerID: ev.CustomerID, Amount: ev.Amount}
	key := []byte(strconv.FormatInt(ev.OrderID, 10))
	return &sent{kind: loadgen.Valid, orderID: ev.OrderID, key: key, value: value, partition: partitionOf(key)}, nil
}

// publishTxn publishes the stream in transactions through franz-go's
// transactional producer, at the stream's rate: txnSize messages a
// transaction, committed, and after a third of them (at random, from the
// seed) an aborted transaction of phantom events.
func (s *stream) publishTxn(ctx context.Context, brokers string) error {
	addrs := strings.Split(brokers, ",")
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ClientID("chaos-order-service"),
		kgo.TransactionalID(s.txn.id), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		// As patient as a Java service (delivery.timeout.ms 2 min): a
		// killed leader or coordinator delays the stream, it does not end
		// it.
		kgo.TransactionTimeout(time.Minute), kgo.RecordDeliveryTimeout(2*time.Minute), kgo.RetryTimeout(2*time.Minute),
		// The next transaction's first write is refused (concurrent
		// transactions) until the broker wrote the last one's markers, a
		// few milliseconds. franz-go then backs off up to a second and
		// waits for a metadata refresh, at most one per MetadataMinAge (5
		// s by default): every transaction took 5 s on Kafka 4. The Java
		// client retries that one after 20 ms.
		kgo.RetryBackoffFn(func(int) time.Duration { return 20 * time.Millisecond }), kgo.MetadataMinAge(50*time.Millisecond))
	if err != nil {
		return fmt.Errorf("transactional producer: %w", err)
	}
	defer cl.Close()
	var k config.Kafka
	if err := config.Load(map[string]string{"KAFKA_BROKERS": brokers, "KAFKA_CLIENT_ID": "chaos-txn-reader"}, &k); err != nil {
		return err
	}
	cfg, err := kafka.NewConfig(k) // read_committed, as billing
	if err != nil {
		return err
	}
	reader, err := sarama.NewClient(addrs, cfg)
	if err != nil {
		return err
	}
	defer reader.Close()
	hash := sarama.NewHashPartitioner(s.topic)
	partitionOf := func(key []byte) int32 {
		p, err := hash.Partition(&sarama.ProducerMessage{Key: sarama.ByteEncoder(key)}, s.partitions)
		if err != nil {
			panic(err) // the hash partitioner does not fail on a key
		}
		return p
	}

	start := time.Now()
	n := 0
	for done := false; !done; {
		var batch []*sent
		for len(batch) < txnSize {
			due := start.Add(time.Duration(float64(n) / s.rate * float64(time.Second)))
			select {
			case <-time.After(time.Until(due)):
			case <-ctx.Done():
				return ctx.Err()
			}
			msg, ok, err := s.gen.Next()
			if err != nil {
				return err
			}
			if !ok {
				done = true
				break
			}
			n++
			batch = append(batch, &sent{kind: msg.Kind, orderID: msg.OrderID, defect: msg.Defect, key: msg.Key, value: msg.Value, partition: partitionOf(msg.Key)})
		}
		if len(batch) == 0 {
			break
		}
		if err := s.commitTxn(ctx, cl, reader, batch); err != nil {
			return err
		}
		if s.rng.Float64() >= abortChance {
			continue
		}
		var phantoms []*sent
		for range phantomsPerTxn {
			p, err := s.phantom(partitionOf)
			if err != nil {
				return err
			}
			phantoms = append(phantoms, p)
		}
		if err := s.abortTxn(ctx, cl, phantoms); err != nil {
			return err
		}
	}
	s.mu.Lock()
	s.expected = s.gen.Expected()
	s.mu.Unlock()
	return nil
}

// errUnconfirmed: a commit whose answer was lost; it may or may not have
// happened.
var errUnconfirmed = errors.New("the transaction's commit was not confirmed")

// writeTxn writes recs in one transaction and commits or aborts it. When
// the records cannot be written the transaction is aborted; a commit that
// fails is aborted (franz-go's documented recovery), and errUnconfirmed
// says that the commit may have happened all the same.
func (s *stream) writeTxn(ctx context.Context, cl *kgo.Client, recs []*sent, commit bool) error {
	if err := cl.BeginTransaction(); err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	krs := make([]*kgo.Record, len(recs))
	of := make(map[*kgo.Record]*sent, len(recs))
	for i, m := range recs {
		m.offset = -1 // until written
		krs[i] = &kgo.Record{Topic: s.topic, Partition: m.partition, Key: m.key, Value: m.value}
		of[krs[i]] = m
	}
	res := cl.ProduceSync(ctx, krs...) // the results come in the order written, not given
	for _, r := range res {
		if r.Err == nil {
			of[r.Record].offset = r.Record.Offset
		}
	}
	if err := res.FirstErr(); err != nil {
		if aerr := cl.EndTransaction(ctx, kgo.TryAbort); aerr != nil {
			return fmt.Errorf("abort after %w: %w", err, aerr)
		}
		return fmt.Errorf("%w: %w", errWritten, err)
	}
	if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		if !commit {
			return fmt.Errorf("abort transaction: %w", err)
		}
		if aerr := cl.EndTransaction(ctx, kgo.TryAbort); aerr != nil {
			return fmt.Errorf("commit: %w; then abort: %w", err, aerr)
		}
		return fmt.Errorf("%w: %w", errUnconfirmed, err)
	}
	return nil
}

// errWritten: records could not be written; the transaction was aborted.
var errWritten = errors.New("the transaction's records could not be written")

// commitTxn writes batch in a transaction and commits it, as an order
// service does until it succeeds: a transaction that failed is written
// again, once the log says that it did not commit.
func (s *stream) commitTxn(ctx context.Context, cl *kgo.Client, reader sarama.Client, batch []*sent) error {
	for tries := 1; ; tries++ {
		err := s.writeTxn(ctx, cl, batch, true)
		committed := err == nil
		if errors.Is(err, errUnconfirmed) {
			s.mu.Lock()
			s.txn.uncertain++
			s.mu.Unlock()
			var verr error
			if committed, verr = s.visible(ctx, reader, batch); verr != nil {
				return verr
			}
		} else if err != nil && !errors.Is(err, errWritten) {
			return err
		}
		s.ended(batch, committed)
		if committed {
			return nil
		}
		if tries == 5 {
			return fmt.Errorf("a transaction failed 5 times; the last: %w", err)
		}
		for i, m := range batch {
			cp := *m
			batch[i] = &cp
		}
	}
}

// abortTxn writes recs in a transaction and aborts it.
func (s *stream) abortTxn(ctx context.Context, cl *kgo.Client, recs []*sent) error {
	if err := s.writeTxn(ctx, cl, recs, false); err != nil && !errors.Is(err, errWritten) {
		return err
	}
	s.ended(recs, false)
	return nil
}

// ended records a transaction of recs that committed, or aborted.
func (s *stream) ended(recs []*sent, committed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if committed {
		s.txn.committed++
		s.acked = append(s.acked, recs...)
		return
	}
	s.txn.aborted++
	for _, m := range recs {
		if m.offset >= 0 { // written, then aborted
			s.txn.abortedAt = append(s.txn.abortedAt, position{m.partition, m.offset})
		}
	}
}

// visible reports whether batch's records are in the log for a
// read_committed reader, once the transaction is over (the last stable
// offset of their partitions has passed them).
func (s *stream) visible(ctx context.Context, reader sarama.Client, batch []*sent) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	m := batch[0]
	for {
		ends, err := kafka.PartitionEnds(reader, s.topic, []int32{m.partition})
		if err == nil && ends[m.partition].Stable > m.offset {
			break
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("the unconfirmed transaction at %d/%d did not end: %w", m.partition, m.offset, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	msgs, err := embeddedkafka.ReadPartition(ctx, reader, s.topic, m.partition, m.offset, m.offset+1)
	if err != nil {
		return false, err
	}
	return len(msgs) == 1, nil
}

// checkTxnLog checks the order topic of a transactional stream, once the
// group caught up: a read_committed reader gets exactly the committed
// messages and none of the aborted ones, no transaction is left open (the
// last stable offset is the high-water mark), and the group's committed
// offsets stand at that end: past the last markers.
func (r *run) checkTxnLog() {
	t := r.t
	msgs, err := r.readTopic(r.topic)
	if err != nil {
		t.Errorf("read the order topic: %v", err)
		return
	}
	got := map[position]bool{}
	for _, m := range msgs {
		got[position{m.Partition, m.Offset}] = true
	}
	want := map[position]bool{}
	for _, m := range r.stream.messages() {
		want[position{m.partition, m.offset}] = true
	}
	if !maps.Equal(got, want) {
		t.Errorf("a read_committed reader gets %d records of the order topic, the stream committed %d", len(got), len(want))
	}
	for _, p := range r.stream.txn.abortedAt {
		if got[p] {
			t.Errorf("a record of an aborted transaction, at %d/%d, is handed to read_committed readers", p.partition, p.offset)
		}
	}
	parts := make([]int32, partitions)
	for i := range parts {
		parts[i] = int32(i)
	}
	ends, err := kafka.PartitionEnds(r.probe, r.topic, parts)
	if err != nil {
		t.Errorf("end offsets: %v", err)
		return
	}
	committed, err := committedOffsets(r.probe, r.group, r.topic)
	if err != nil {
		t.Errorf("committed offsets: %v", err)
		return
	}
	atEnd := 0
	for _, p := range parts {
		e := ends[p]
		if e.Stable != e.High {
			t.Errorf("partition %d: last stable offset %d, high-water mark %d: a transaction is still open", p, e.Stable, e.High)
		}
		if committed[p] == e.High {
			atEnd++
		}
	}
	lag, err := r.metricSum("billing_consumer_lag")
	if err != nil {
		t.Errorf("lag: %v", err)
	}
	tx := r.stream.txn
	r.figure("%d transactions committed, %d aborted (%d records; %d phantom events), %d commits unconfirmed", tx.committed, tx.aborted, len(tx.abortedAt), len(tx.phantoms), tx.uncertain)
	r.figure("committed offset at the high-water mark on %d/%d partitions, billing_consumer_lag %.0f", atEnd, partitions, lag)
}

// phantomsFound counts the phantom events found anywhere billing records
// or announces an event: at the provider, in processed_event, charge, the
// outbox and the dead-letter topic (by the phantom's key).
func phantomsFound(phantoms map[string]loadgen.Event, providerKeys, processed, charged, announced []string) int {
	n := 0
	for _, ids := range [][]string{providerKeys, processed, charged, announced} {
		for _, id := range ids {
			if _, ok := phantoms[id]; ok {
				n++
			}
		}
	}
	return n
}

// --- the scenarios' faults ---

// Billing's replicas replaced one at a time while the order service writes
// and aborts transactions, as a Deployment's rolling update does.
func injectBillingRollingRestart(r *run) {
	rng := r.rng("billing-rolling")
	r.sleepUntil(between(rng, 3*time.Second, 4*time.Second))
	for _, c := range r.running() {
		slot := r.slotOf(c)
		r.stop(c, "sigterm")
		if n := r.startInSlot(slot); n != nil {
			if err := n.waitReady(time.Minute); err != nil {
				r.t.Errorf("%s after the rolling restart: %v", n.name, err)
			}
		}
		r.faultOver()
	}
}

// kill -9 of the order service's transaction coordinator mid-stream: its
// transactions' commits and aborts wait until another broker takes the
// transactional id over.
func injectTxnCoordinatorKill(r *run) {
	rng := r.rng("txn-coordinator-kill")
	r.sleepUntil(between(rng, 4*time.Second, 6*time.Second))
	coord, err := r.txnCoordinator()
	if err != nil {
		r.t.Errorf("txn-coordinator-kill-9: %v", err)
		return
	}
	r.killBroker("broker-kill-9", coord, "transaction coordinator of the order service",
		between(rng, 12*time.Second, 15*time.Second), func() (bool, string) {
			id, err := r.txnCoordinator()
			if err != nil || id == coord {
				return false, ""
			}
			return true, fmt.Sprintf("transaction coordinator is broker %d", id)
		})
}

// txnCoordinator returns the broker id of the order service's transaction
// coordinator, asked afresh.
func (r *run) txnCoordinator() (int32, error) {
	id := r.stream.txn.id
	if err := r.probe.RefreshTransactionCoordinator(id); err != nil {
		return 0, fmt.Errorf("find the transaction coordinator of %s: %w", id, err)
	}
	b, err := r.probe.TransactionCoordinator(id)
	if err != nil {
		return 0, fmt.Errorf("find the transaction coordinator of %s: %w", id, err)
	}
	return b.ID(), nil
}

// hangingTimeout is the transaction.timeout.ms of the producer that dies
// mid-transaction: the broker aborts its transaction that long after it
// began (within its abort check interval, 1 s on the suite's cluster).
const hangingTimeout = 10 * time.Second

// A second order service, Apache Kafka's Java producer in a JVM of its own,
// begins a transaction, writes a phantom event to every partition and is
// killed with kill -9: every partition is held until the broker aborts the
// transaction at its transaction.timeout.ms. billing must charge nothing of
// it, say within seconds that the partitions are held, and go on by itself
// once the broker aborted it.
func injectHangingTxn(r *run) {
	rng := r.rng("txn-hanging")
	r.sleepUntil(between(rng, 3*time.Second, 4*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := apachekafka.StartTxnProducer(ctx, r.brokers, "chaos-hanging-"+randomHex(3), hangingTimeout, filepath.Join(r.dir, "txn-producer.log"))
	if err != nil {
		r.t.Errorf("txn-hanging: %v", err)
		return
	}
	defer p.Close()
	if err := p.Begin(); err != nil {
		r.t.Errorf("txn-hanging: %v", err)
		return
	}
	var hung []*sent
	for part := range int32(partitions) {
		m, err := r.stream.phantom(func([]byte) int32 { return part })
		if err != nil {
			r.t.Errorf("txn-hanging: %v", err)
			return
		}
		hung = append(hung, m)
	}
	for _, m := range hung {
		if err := p.Send(r.topic, m.partition, m.key, m.value); err != nil {
			r.t.Errorf("txn-hanging: %v", err)
			return
		}
	}
	offsets, err := p.Flush()
	if err != nil || len(offsets) != len(hung) {
		r.t.Errorf("txn-hanging: flush: %v (%d offsets)", err, len(offsets))
		return
	}
	for i, m := range hung {
		m.offset = offsets[i]
	}
	r.stream.ended(hung, false) // once the broker aborts it
	r.fault("txn-producer-kill-9", "the Java transactional producer (pid %d) killed mid-transaction, its records at %d/%d..%d/%d; transaction.timeout.ms %s",
		p.Pid(), hung[0].partition, hung[0].offset, hung[len(hung)-1].partition, hung[len(hung)-1].offset, hangingTimeout)
	killed := time.Now()
	p.Kill()

	// Reported: the held gauge of some replica above 0.
	var reported, aborted, resumed time.Duration
	for reported == 0 && time.Since(killed) < hangingTimeout+30*time.Second {
		if held, err := r.metricSum("billing_consumer_stable_offset_held_seconds"); err == nil && held > 0 {
			reported = time.Since(killed)
		}
		time.Sleep(250 * time.Millisecond)
	}
	// Aborted by the broker: every partition's last stable offset past the
	// hung record. Resumed: billing committed past it on every partition.
	parts := make([]int32, partitions)
	for i := range parts {
		parts[i] = int32(i)
	}
	for resumed == 0 && time.Since(killed) < hangingTimeout+time.Minute {
		if aborted == 0 {
			if ends, err := kafka.PartitionEnds(r.probe, r.topic, parts); err == nil && allPast(hung, func(p int32) int64 { return ends[p].Stable }) {
				aborted = time.Since(killed)
				r.faultOver()
			}
		}
		if aborted > 0 {
			if c, err := committedOffsets(r.probe, r.group, r.topic); err == nil && allPast(hung, func(p int32) int64 { return c[p] }) {
				resumed = time.Since(killed)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	switch {
	case reported == 0:
		r.t.Errorf("txn-hanging: no replica reported the held partitions within %s of the kill", hangingTimeout+30*time.Second)
	case aborted == 0:
		r.t.Errorf("txn-hanging: the broker did not abort the transaction within %s of the kill", hangingTimeout+time.Minute)
	case resumed == 0:
		r.t.Errorf("txn-hanging: billing did not commit past the aborted transaction within a minute of the broker's abort")
	}
	if reported > 0 && aborted > 0 && resumed > 0 {
		r.figure("held partitions reported %.1f s after the kill; the broker aborted the transaction %.1f s after it; billing committed past it on every partition %.1f s after the abort",
			reported.Seconds(), aborted.Seconds(), (resumed - aborted).Seconds())
	}
}

// allPast reports whether offset(p) has passed each record of hung, on its
// partition.
func allPast(hung []*sent, offset func(p int32) int64) bool {
	return !slices.ContainsFunc(hung, func(m *sent) bool { return offset(m.partition) <= m.offset })
}
