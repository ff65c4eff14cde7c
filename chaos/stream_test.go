//go:build chaos

package chaos_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/config"
	"example.com/billing/internal/dev/loadgen"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/order"
)

// sent is one message the broker acknowledged, and what it is.
type sent struct {
	kind      loadgen.Kind
	cross     bool // a same-bytes copy of a valid event sent to another partition
	second    bool // a second, different event confirming an order, on another partition
	orderID   int64
	defect    string
	key       []byte
	value     []byte
	partition int32
	offset    int64
}

// stream publishes loadgen's mix (valid events, byte-for-byte duplicates,
// invalid values) and, on top of it, copies of some valid events to a
// partition other than the one their key hashes to, right behind the
// original, so that two consumers race on the same event id: half of them
// under another key (a producer that keyed them differently), half under
// the same key to an explicit partition (a replay tool that got the
// partition wrong).
type stream struct {
	topic      string
	partitions int32
	count      int
	rate       float64 // messages per second
	crossRate  float64 // share of valid events that also get a copy on another partition
	// seconds: every valid event gets a second, different event confirming
	// the same order (a new eventId, the same payload) on another partition,
	// right behind it: the two race to charge one order.
	seconds bool
	rng     *rand.Rand
	gen     *loadgen.Generator
	// txn, when set, publishes in transactions (txn_test.go), and holds
	// what the transactions wrote besides acked.
	txn *txnStream

	mu       sync.Mutex
	acked    []*sent
	expected loadgen.Expected
	// secondEvents are the second events, by id.
	secondEvents map[string]loadgen.Event
}

// newStream returns the stream of count messages at rate, its valid events
// dated between past[0] and past[1] ago when past[1] is set (a backlog).
func newStream(topic string, partitions int32, count int, rate float64, seed int64, past [2]time.Duration) (*stream, error) {
	gen, err := loadgen.New(loadgen.Options{Count: count, Duplicates: 0.10, Invalid: 0.03, Seed: seed, Past: past})
	if err != nil {
		return nil, err
	}
	return &stream{
		topic: topic, partitions: partitions, count: count, rate: rate, crossRate: 0.04,
		rng: rand.New(rand.NewPCG(uint64(seed), 0x63726f7373)), // "cross"
		gen: gen,
	}, nil
}

// duration is how long publishing takes at the stream's rate.
func (s *stream) duration() time.Duration {
	return time.Duration(float64(s.count) / s.rate * float64(time.Second))
}

// publish sends the whole stream to brokers (comma-separated, as
// KAFKA_BROKERS) and waits for every acknowledgement.
func (s *stream) publish(ctx context.Context, brokers string) error {
	if s.txn != nil {
		return s.publishTxn(ctx, brokers)
	}
	var k config.Kafka
	if err := config.Load(map[string]string{"KAFKA_BROKERS": brokers, "KAFKA_CLIENT_ID": "chaos-producer"}, &k); err != nil {
		return err
	}
	cfg, err := kafka.ProducerConfig(k)
	if err != nil {
		return err
	}
	// Partitions are chosen here: by the key's hash like billing's own
	// producers, or explicitly for the cross-partition copies.
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	// The order service's producer keeps retrying a message for as long as
	// a Java producer would (delivery.timeout.ms, 2 minutes), not billing's
	// 2.5 s: a partition leader killed while its leadership has not moved
	// yet delays the stream; it does not end the scenario (combined once
	// ended at +30 s with "connection refused" and nothing checked).
	cfg.Producer.Retry.Max = 480
	producer, err := sarama.NewAsyncProducer(k.Brokers, cfg)
	if err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	defer producer.Close()
	hash := sarama.NewHashPartitioner(s.topic)
	partitionOf := func(key []byte) int32 {
		p, err := hash.Partition(&sarama.ProducerMessage{Key: sarama.ByteEncoder(key)}, s.partitions)
		if err != nil {
			panic(err) // the hash partitioner does not fail on a key
		}
		return p
	}

	var inFlight int
	var firstErr error
	settle := func(pm *sarama.ProducerMessage, err error) {
		inFlight--
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			return
		}
		m := pm.Metadata.(*sent)
		m.partition, m.offset = pm.Partition, pm.Offset
		s.mu.Lock()
		s.acked = append(s.acked, m)
		s.mu.Unlock()
	}
	send := func(m *sent) error {
		pm := &sarama.ProducerMessage{Topic: s.topic, Partition: m.partition, Key: sarama.ByteEncoder(m.key), Metadata: m}
		if m.value != nil {
			pm.Value = sarama.ByteEncoder(m.value)
		}
		for {
			select {
			case producer.Input() <- pm:
				inFlight++
				return nil
			case ok := <-producer.Successes():
				settle(ok, nil)
			case perr := <-producer.Errors():
				settle(perr.Msg, perr.Err)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}

	start := time.Now()
	n := 0
	for firstErr == nil {
		due := start.Add(time.Duration(float64(n) / s.rate * float64(time.Second)))
		for wait := time.Until(due); wait > 0; wait = time.Until(due) {
			select {
			case ok := <-producer.Successes():
				settle(ok, nil)
			case perr := <-producer.Errors():
				settle(perr.Msg, perr.Err)
			case <-time.After(wait):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		msg, ok, err := s.gen.Next()
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		n++
		m := &sent{kind: msg.Kind, orderID: msg.OrderID, defect: msg.Defect, key: msg.Key, value: msg.Value}
		m.partition = partitionOf(m.key)
		if err := send(m); err != nil {
			return err
		}
		if msg.Kind == loadgen.Valid && s.seconds {
			if err := s.sendSecond(m, send); err != nil {
				return err
			}
		}
		if msg.Kind != loadgen.Valid || s.rng.Float64() >= s.crossRate {
			continue
		}
		cp := &sent{kind: loadgen.Duplicate, cross: true, orderID: msg.OrderID, key: msg.Key, value: msg.Value}
		if s.rng.IntN(2) == 0 {
			// Another key that hashes to another partition.
			for i := 0; ; i++ {
				cp.key = []byte(strconv.FormatInt(msg.OrderID, 10) + "-copy" + strconv.Itoa(i))
				if cp.partition = partitionOf(cp.key); cp.partition != m.partition {
					break
				}
			}
		} else {
			cp.partition = (m.partition + 1 + s.rng.Int32N(s.partitions-1)) % s.partitions
		}
		if err := send(cp); err != nil {
			return err
		}
	}
	for inFlight > 0 {
		select {
		case ok := <-producer.Successes():
			settle(ok, nil)
		case perr := <-producer.Errors():
			settle(perr.Msg, perr.Err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.mu.Lock()
	s.expected = s.gen.Expected()
	s.mu.Unlock()
	if firstErr != nil {
		return fmt.Errorf("publish: %w", firstErr)
	}
	return nil
}

// sendSecond sends a second event confirming first's order: a new eventId,
// the same order, customer and amount, to another partition under the same
// key (a producer that partitioned by something else).
func (s *stream) sendSecond(first *sent, send func(*sent) error) error {
	ev, err := order.Parse(first.value)
	if err != nil {
		return err
	}
	second, err := order.New(ev.OrderID, ev.CustomerID, ev.Amount, time.Now())
	if err != nil {
		return err
	}
	value, err := second.MarshalJSON()
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.secondEvents == nil {
		s.secondEvents = map[string]loadgen.Event{}
	}
	s.secondEvents[second.ID.String()] = loadgen.Event{ID: second.ID, OrderID: second.OrderID, CustomerID: second.CustomerID, Amount: second.Amount}
	s.mu.Unlock()
	return send(&sent{kind: loadgen.Valid, second: true, orderID: ev.OrderID, key: first.key, value: value,
		partition: (first.partition + 1 + s.rng.Int32N(s.partitions-1)) % s.partitions})
}

// messages returns the acknowledged messages.
func (s *stream) messages() []*sent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*sent(nil), s.acked...)
}
