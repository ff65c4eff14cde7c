package consumer_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"example.com/billing/internal/consumer"
	"example.com/billing/internal/dedup"
	"example.com/billing/internal/testenv/dbtest"
	"example.com/billing/internal/testenv/kafkatest"
	"example.com/billing/internal/testenv/wait"
)

// After a PostgreSQL failover to an asynchronous standby, the database
// lacks the last commits billing saw acknowledged (claims, charges,
// outcome events) while Kafka keeps the offsets committed after them: the
// messages in between would never come again. The consumer saves each
// partition's position in the database before Kafka may commit it, so a
// database position below what it saved tells the loss: it consumes the
// partition again from there. Messages older than the provider's
// idempotency window (by their timestamp) are not: the provider may have
// forgotten their keys, and asking again could charge twice.
func TestConsumer_APartitionWhoseDatabaseLostCommitsIsConsumedAgain(t *testing.T) {
	db, _ := dbtest.New(t)
	b := kafkatest.Start(t, 1)
	client := kafkatest.Client(t, b.Addr())
	const old, recent = 5, 15
	var msgs []kafkatest.Message
	for i := range old + recent {
		m := kafkatest.Message{Key: []byte(strconv.Itoa(i)), Value: event("v" + strconv.Itoa(i))}
		if i < old {
			m.Timestamp = time.Now().Add(-48 * time.Hour)
		}
		msgs = append(msgs, m)
	}
	kafkatest.Produce(t, client, b.Topic, msgs...)

	rec := newRecorder()
	opts := options()
	opts.Commit, opts.ReplayWindow = consumer.SavePositions(dedup.NewPositions(db, b.Group)), 24*time.Hour
	m := startMember(t, b, rec, opts, "")
	kafkatest.WaitCaughtUp(t, client, b.Group, b.Topic, 30*time.Second)
	position := func() int64 {
		var at int64
		if err := db.Get(&at, `SELECT coalesce(max(next_offset), -1) FROM consumer_position WHERE consumer_group = $1 AND topic = $2`, b.Group, b.Topic); err != nil {
			t.Fatal(err)
		}
		return at
	}
	if at := position(); at != old+recent {
		t.Fatalf("the database holds position %d once everything is committed, want %d (saved before committed)", at, old+recent)
	}

	// The failover: the database comes back without its last commits.
	if _, err := db.Exec(`UPDATE consumer_position SET next_offset = 0`); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 30*time.Second, "the lost messages consumed again", func() bool {
		for i := old; i < old+recent; i++ {
			if rec.finishedCount("v"+strconv.Itoa(i)) < 2 {
				return false
			}
		}
		return true
	})
	kafkatest.WaitCaughtUp(t, client, b.Group, b.Topic, 30*time.Second)
	for i := range old {
		if n := rec.finishedCount("v" + strconv.Itoa(i)); n != 1 {
			t.Errorf("v%d, older than the provider's window, was processed %d times, want once (reported, not consumed again)", i, n)
		}
	}
	if got := testutil.ToFloat64(m.metrics.Rewinds); got != 1 {
		t.Errorf("billing_consumer_rewinds_total = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.metrics.RewoundMessages); got != recent {
		t.Errorf("billing_consumer_rewound_messages_total = %v, want %d", got, recent)
	}
	wait.For(t, 10*time.Second, "the database's position back at the end", func() bool { return position() == old+recent })
}

// A partition whose messages are all finished is committed at once, not at
// the next of sarama's periodic commits: its lag reads 0, and a crash or a
// rebalance then redelivers nothing. Here sarama's periodic commit is
// turned off (an hour), so only the consumer's own commit of an idle
// partition can move the group's offsets while the member runs.
func TestConsumer_AnIdlePartitionIsCommittedAtOnce(t *testing.T) {
	db, _ := dbtest.New(t)
	b := kafkatest.Start(t, 1)
	client := kafkatest.Client(t, b.Addr())
	const n = 20
	var msgs []kafkatest.Message
	for i := range n {
		msgs = append(msgs, kafkatest.Message{Key: []byte(strconv.Itoa(i)), Value: event("idle" + strconv.Itoa(i))})
	}
	kafkatest.Produce(t, client, b.Topic, msgs...)

	opts := options()
	opts.Commit = consumer.SavePositions(dedup.NewPositions(db, b.Group))
	startMemberWith(t, b, newRecorder(), nil, opts, "", func(cfg *sarama.Config) {
		cfg.Consumer.Offsets.AutoCommit.Interval = time.Hour
	})
	kafkatest.WaitCaughtUp(t, client, b.Group, b.Topic, 30*time.Second)
}
