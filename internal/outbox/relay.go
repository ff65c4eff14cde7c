package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/IBM/sarama"
	"github.com/cenkalti/backoff/v5"
	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"example.com/billing/internal/kafkaacl"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/postgres"
)

// Relay publishes the outbox's rows to the outcome topic.
//
// One replica at a time relays: the one holding a PostgreSQL session lock,
// so that the relay's progress depends on the database, not on which
// partitions of the order topic a replica was assigned. It publishes the
// oldest unpublished rows first, never two rows of one order in one batch,
// with an idempotent producer that waits for all in-sync replicas, and
// deletes them once the broker acknowledged them (the topic is their
// record; a second version of every row, marked published, was a third of
// the WAL an event cost): a row is published twice only when the relay
// stopped between the two. A row that can never be published (its value is
// not a JSON object, or the topic refuses its size) is moved to
// outbox_dead, for a human, rather than stop the relay.
type Relay struct {
	db       *sqlx.DB
	producer sarama.SyncProducer
	topic    string
	metrics  *metrics.Metrics
	log      *slog.Logger

	// Poll is how long the relay waits when the outbox is empty.
	Poll time.Duration
	// Batch bounds the rows one round publishes.
	Batch int
	// MaxBytes bounds a value; a larger one is dead (the topic's
	// max.message.bytes, less room for the record's overhead).
	MaxBytes int
}

// NewRelay returns a relay publishing db's outbox to topic through
// producer, which must be idempotent with acks=all and a hash partitioner.
func NewRelay(db *sqlx.DB, producer sarama.SyncProducer, topic string, m *metrics.Metrics, log *slog.Logger) *Relay {
	return &Relay{db: db, producer: producer, topic: topic, metrics: m, log: log,
		Poll: 50 * time.Millisecond, Batch: 500, MaxBytes: 1 << 20}
}

// Run relays until ctx is done: it waits to become the relay (the holder
// of postgres.LockOutboxRelay), then publishes until it loses the lock or
// ctx ends.
func (r *Relay) Run(ctx context.Context) {
	retry := backoff.NewExponentialBackOff()
	retry.InitialInterval = 500 * time.Millisecond
	retry.MaxInterval = 5 * time.Second
	for ctx.Err() == nil {
		_, err := postgres.WithSessionLock(ctx, r.db, postgres.LockOutboxRelay, func(conn *sqlx.Conn) error {
			retry.Reset()
			r.log.Info("relaying payment outcome events", "topic", r.topic)
			return r.relay(ctx, conn)
		})
		if ctx.Err() != nil {
			return
		}
		wait := 2 * time.Second // another replica relays: look again later
		if err != nil {
			wait = retry.NextBackOff()
			r.log.Warn("outbox relay failed; trying again", "err", err, "retry_in", wait)
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// row is an unpublished outbox row.
type row struct {
	EventID     uuid.UUID `db:"event_id"`
	OrderID     int64     `db:"order_id"`
	EventType   string    `db:"event_type"`
	Payload     []byte    `db:"payload"`
	Traceparent *string   `db:"traceparent"`
}

// relay publishes on conn, which holds the relay lock, until ctx ends or a
// statement fails.
func (r *Relay) relay(ctx context.Context, conn *sqlx.Conn) error {
	const next = `
SELECT event_id, order_id, event_type, payload, traceparent FROM outbox
WHERE published_at IS NULL AND NOT dead
ORDER BY seq LIMIT $1`
	stats := time.NewTicker(5 * time.Second)
	defer stats.Stop()
	if err := r.report(ctx, conn); err != nil {
		return err
	}
	retry := backoff.NewExponentialBackOff()
	retry.MaxInterval = 5 * time.Second
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-stats.C:
			if err := r.report(ctx, conn); err != nil {
				return err
			}
		default:
		}
		var rows []row
		if err := conn.SelectContext(ctx, &rows, next, r.Batch); err != nil {
			return fmt.Errorf("read outbox: %w", err)
		}
		if len(rows) == 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(r.Poll):
			}
			continue
		}
		// A database that takes no writes (a standby after a failover) could
		// not mark what was sent: sending would repeat the same rows round
		// after round. Wait for it instead.
		if err := postgres.CheckWritable(ctx, conn); err != nil {
			return err
		}
		failed, err := r.publish(ctx, conn, firstPerOrder(rows))
		if err != nil {
			return err
		}
		if failed > 0 {
			wait := retry.NextBackOff()
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
			continue
		}
		retry.Reset()
	}
}

// firstPerOrder keeps, of rows in seq order, the first of each order: a
// later outcome of the order waits for the next round, after the broker
// acknowledged this one, so that they cannot overtake each other.
func firstPerOrder(rows []row) []row {
	seen := make(map[int64]bool, len(rows))
	out := rows[:0]
	for _, rw := range rows {
		if !seen[rw.OrderID] {
			seen[rw.OrderID] = true
			out = append(out, rw)
		}
	}
	return out
}

// publish sends rows and records what became of each; it returns how many
// failed for a reason that may pass.
func (r *Relay) publish(ctx context.Context, conn *sqlx.Conn, rows []row) (int, error) {
	var msgs []*sarama.ProducerMessage
	var sent []row
	var dead []uuid.UUID
	var deadWhy []string
	for _, rw := range rows {
		if why := r.unpublishable(rw); why != "" {
			dead, deadWhy = append(dead, rw.EventID), append(deadWhy, why)
			continue
		}
		m := &sarama.ProducerMessage{Topic: r.topic, Key: sarama.StringEncoder(strconv.FormatInt(rw.OrderID, 10)),
			Value: sarama.ByteEncoder(rw.Payload), Metadata: len(sent)}
		if rw.Traceparent != nil {
			m.Headers = []sarama.RecordHeader{{Key: []byte("traceparent"), Value: []byte(*rw.Traceparent)}}
		}
		msgs = append(msgs, m)
		sent = append(sent, rw)
	}
	failedAt := map[int]error{}
	if len(msgs) > 0 {
		var perr sarama.ProducerErrors
		if err := r.producer.SendMessages(msgs); errors.As(err, &perr) {
			for _, pe := range perr {
				failedAt[pe.Msg.Metadata.(int)] = pe.Err
			}
		} else if err != nil {
			for i := range msgs {
				failedAt[i] = err
			}
		}
	}
	var published, failed pq.StringArray
	var errs pq.StringArray
	for i, rw := range sent {
		err, bad := failedAt[i]
		switch {
		case !bad:
			published = append(published, rw.EventID.String())
			r.metrics.OutboxPublished.WithLabelValues(rw.EventType).Inc()
		case errors.Is(err, sarama.ErrMessageSizeTooLarge) || errors.Is(err, sarama.ErrInvalidMessage):
			dead, deadWhy = append(dead, rw.EventID), append(deadWhy, err.Error())
		default:
			failed, errs = append(failed, rw.EventID.String()), append(errs, kafkaacl.NameDenied(err, "Write on Topic "+r.topic, "").Error())
			r.metrics.OutboxErrors.Inc()
		}
	}
	const markPublished = `DELETE FROM outbox WHERE event_id = ANY($1::uuid[])`
	const markFailed = `
UPDATE outbox AS o SET attempts = attempts + 1, last_error = u.err
FROM unnest($1::uuid[], $2::text[]) AS u(id, err) WHERE o.event_id = u.id`
	const markDead = `
WITH gone AS (DELETE FROM outbox WHERE event_id = ANY($1::uuid[]) RETURNING *)
INSERT INTO outbox_dead (event_id, seq, order_id, event_type, causation_id, reason, payload, traceparent, recorded_at, attempts, last_error)
SELECT g.event_id, g.seq, g.order_id, g.event_type, g.causation_id, g.reason, g.payload, g.traceparent, g.recorded_at, g.attempts + 1, u.err
FROM gone g JOIN unnest($1::uuid[], $2::text[]) AS u(id, err) ON u.id = g.event_id
ON CONFLICT (event_id) DO NOTHING`
	if len(published) > 0 {
		if _, err := conn.ExecContext(ctx, markPublished, published); err != nil {
			return 0, fmt.Errorf("mark outbox rows published: %w", err)
		}
	}
	if len(failed) > 0 {
		r.log.Warn("payment outcome events not published; retrying", "topic", r.topic, "events", len(failed), "err", errs[0])
		if _, err := conn.ExecContext(ctx, markFailed, failed, errs); err != nil {
			return 0, fmt.Errorf("record outbox failures: %w", err)
		}
	}
	if len(dead) > 0 {
		ids := make(pq.StringArray, len(dead))
		for i, id := range dead {
			ids[i] = id.String()
			r.log.Error("outbox row cannot be published; skipped (billing_outbox_dead)", "event_id", id.String(), "reason", deadWhy[i])
		}
		if _, err := conn.ExecContext(ctx, markDead, ids, pq.StringArray(deadWhy)); err != nil {
			return 0, fmt.Errorf("mark outbox rows dead: %w", err)
		}
	}
	return len(failed), nil
}

// unpublishable says why a row can never be published as it is, "" when it
// can: its value must be one JSON object of the topic's size.
func (r *Relay) unpublishable(rw row) string {
	if len(rw.Payload) > r.MaxBytes {
		return fmt.Sprintf("value of %d bytes exceeds the %d the outcome topic takes", len(rw.Payload), r.MaxBytes)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(rw.Payload, &obj); err != nil {
		return "value is not a JSON object: " + err.Error()
	}
	var id string
	if json.Unmarshal(obj["eventId"], &id) != nil || id != rw.EventID.String() {
		return "value's eventId does not match the row's"
	}
	return ""
}

// report sets the outbox gauges: rows waiting, the age of the oldest, and
// dead rows. Both come from small sets, read through an index: the rows
// waiting (outbox_unpublished) and outbox_dead, never the outbox's days.
func (r *Relay) report(ctx context.Context, conn *sqlx.Conn) error {
	const q = `
SELECT count(*), coalesce(extract(epoch FROM now() - min(recorded_at)), 0)::float8, (SELECT count(*) FROM outbox_dead)
FROM outbox WHERE published_at IS NULL AND NOT dead`
	var pending, dead int
	var oldest float64
	if err := conn.QueryRowxContext(ctx, q).Scan(&pending, &oldest, &dead); err != nil {
		return fmt.Errorf("outbox stats: %w", err)
	}
	r.metrics.OutboxPending.Set(float64(pending))
	r.metrics.OutboxOldestPending.Set(oldest)
	r.metrics.OutboxDead.Set(float64(dead))
	return nil
}
