package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/cenkalti/backoff/v5"
	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"example.com/billing/internal/kafkaacl"
	"example.com/billing/internal/lease"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/schema"
)

// Relay publishes the outbox's rows to the outcome topic.
//
// One replica at a time relays: the holder of the relay's lease
// (lease.OutboxRelay), so that the relay's progress depends on the
// database, not on which partitions of the order topic a replica was
// assigned, and so that it works through a transaction pooler. It
// publishes the oldest unpublished rows first, never two rows of one order
// in one batch, with an idempotent producer that waits for all in-sync
// replicas, and deletes them once the broker acknowledged them (the topic
// is their record; a second version of every row, marked published, was a
// third of the WAL an event cost): a row is published twice only when the
// relay stopped between the two. A row that can never be published (its
// value is not a JSON object, or the topic refuses its size) is moved to
// outbox_dead, for a human, rather than stop the relay.
//
// Each batch's writes check the lease's fencing token in their statement,
// so a relay that lost its lease (paused past its expiry, cut off from the
// database) changes nothing: it stops, and the rows it sent are published
// again by the new holder (consumers deduplicate by eventId). It sends a
// batch only with sendMargin of its tenure left, so that its sends are
// over before another relay's can begin.
type Relay struct {
	db       *sqlx.DB
	producer sarama.SyncProducer
	topic    string
	metrics  *metrics.Metrics
	log      *slog.Logger
	lease    *lease.Lease
	// sent is when the relay's last send to the broker ended: a tenure's
	// publishing ends there (its stop line says when).
	sent time.Time

	// Poll is how long the relay waits when the outbox is empty.
	Poll time.Duration
	// Batch bounds the rows one round publishes.
	Batch int
	// MaxBytes bounds a value; a larger one is dead (the topic's
	// max.message.bytes, less room for the record's overhead).
	MaxBytes int
}

// relayLease is the relay lease's duration: a relay killed with -9 (its
// lease not given back) is replaced within it, and one cut off from the
// database stops within it.
const relayLease = 10 * time.Second

// markTimeout bounds the statements that record what a send did, which
// outlive the relay's stop (publish says why).
const markTimeout = 5 * time.Second

// sendMargin is the least time left of its tenure with which the relay
// sends a batch: a send takes milliseconds. Normally more than two thirds
// are left (the lease is renewed every third); less than this, the
// renewals failed twice (the database is away) and the relay waits for the
// next one.
const sendMargin = relayLease / 4

// standbyPoll bounds how long a replica that does not relay waits before
// it asks for the lease again.
const standbyPoll = 2 * time.Second

// NewRelay returns a relay publishing db's outbox to topic through
// producer, which must be idempotent with acks=all and a hash partitioner.
func NewRelay(db *sqlx.DB, producer sarama.SyncProducer, topic string, m *metrics.Metrics, log *slog.Logger) *Relay {
	return &Relay{db: db, producer: producer, topic: topic, metrics: m, log: log, lease: lease.New(db, lease.OutboxRelay, relayLease),
		Poll: 50 * time.Millisecond, Batch: 500, MaxBytes: 1 << 20}
}

// Run relays until ctx is done: it waits to become the relay (the holder
// of the relay's lease), then publishes until it loses the lease or ctx
// ends.
func (r *Relay) Run(ctx context.Context) {
	// A failure is the database's or the broker's: the relay asks again
	// soon, so that it resumes within seconds of their return.
	retry := backoff.NewExponentialBackOff()
	retry.InitialInterval = 500 * time.Millisecond
	retry.MaxInterval = standbyPoll
	var waitedFor string // the older replicas last logged
	for ctx.Err() == nil {
		wait := standbyPoll
		older, err := r.olderRelays(ctx)
		switch {
		case err != nil:
		case older != "":
			if older != waitedFor {
				r.log.Info("replicas of a release before leases relay with an advisory lock; this replica relays once they are gone", "replicas", older)
			}
		default:
			err = r.lease.Do(ctx, func(ctx context.Context, t lease.Tenure) error {
				retry.Reset()
				return r.tenure(ctx, t)
			})
		}
		waitedFor = older
		var held *lease.HeldError
		switch {
		case ctx.Err() != nil:
			return
		case errors.As(err, &held):
			wait = min(max(held.Left, r.Poll), standbyPoll) // another replica relays: ask again when its lease ends
		case errors.Is(err, lease.ErrLost):
			wait = r.Poll
		case err != nil:
			wait = retry.NextBackOff()
			r.log.Warn("outbox relay failed; trying again", "err", err, "retry_in", wait)
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// tenure relays for one tenure of the lease, and says when it began and
// ended: the relays' logs show one relay at a time.
func (r *Relay) tenure(ctx context.Context, t lease.Tenure) error {
	began := time.Now()
	r.log.Info("relaying payment outcome events", "topic", r.topic, "lease_token", t.Token, "holder", t.Holder)
	r.sent = time.Time{}
	err := r.relay(ctx, t)
	attrs := []any{"topic", r.topic, "lease_token", t.Token, "relayed_for", time.Since(began).Round(time.Millisecond)}
	if !r.sent.IsZero() {
		attrs = append(attrs, "last_send_ended", r.sent)
	}
	switch cause := context.Cause(ctx); {
	case errors.Is(err, lease.ErrLost) || errors.Is(cause, lease.ErrLost):
		r.log.Warn("stopped relaying payment outcome events: the relay's lease was lost; the replica that takes it over publishes what this one could not mark",
			append(attrs, "err", errors.Join(err, cause))...)
		return lease.ErrLost
	case err != nil:
		r.log.Info("stopped relaying payment outcome events", append(attrs, "err", err)...)
	default:
		r.log.Info("stopped relaying payment outcome events", attrs...)
	}
	return err
}

// olderRelays names the replicas alive of a release before leases, which
// relay under a session advisory lock that the lease does not exclude: ""
// when there are none. During a rolling update from such a release, this
// replica leaves the relay to them until they are gone.
func (r *Relay) olderRelays(ctx context.Context) (string, error) {
	alive, err := schema.Alive(ctx, r.db)
	if err != nil {
		return "", err
	}
	var older []string
	for _, rep := range alive {
		if rep.Schema < schema.LeasesVersion {
			older = append(older, fmt.Sprintf("%s on %s (release %s)", rep.Instance, rep.Host, rep.Release))
		}
	}
	return strings.Join(older, ", "), nil
}

// row is an unpublished outbox row.
type row struct {
	EventID     uuid.UUID `db:"event_id"`
	OrderID     int64     `db:"order_id"`
	EventType   string    `db:"event_type"`
	Payload     []byte    `db:"payload"`
	Traceparent *string   `db:"traceparent"`
}

// relay publishes as t's holder until ctx ends, the lease is lost or a
// statement fails.
func (r *Relay) relay(ctx context.Context, t lease.Tenure) error {
	const next = `
SELECT event_id, order_id, event_type, payload, traceparent FROM outbox
WHERE published_at IS NULL AND NOT dead
ORDER BY seq LIMIT $1`
	stats := time.NewTicker(5 * time.Second)
	defer stats.Stop()
	if err := r.report(ctx); err != nil {
		return err
	}
	retry := backoff.NewExponentialBackOff()
	retry.MaxInterval = 5 * time.Second
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-stats.C:
			if err := r.report(ctx); err != nil {
				return err
			}
			// A replica of a release before leases came back (a
			// rollback): it relays under its advisory lock, so this one
			// stops.
			if older, err := r.olderRelays(ctx); err != nil || older != "" {
				return err
			}
		default:
		}
		var rows []row
		if t.Left() >= sendMargin {
			if err := r.db.SelectContext(ctx, &rows, next, r.Batch); err != nil {
				return fmt.Errorf("read outbox: %w", err)
			}
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
		if err := postgres.CheckWritable(ctx, r.db); err != nil {
			return err
		}
		failed, err := r.publish(ctx, t, firstPerOrder(rows))
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
func (r *Relay) publish(ctx context.Context, t lease.Tenure, rows []row) (int, error) {
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
		err := r.producer.SendMessages(msgs)
		r.sent = time.Now()
		if errors.As(err, &perr) {
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
	// Each statement checks the lease first, once (fence, a CTE, runs once
	// per statement), and changes nothing unless t still holds it.
	const markPublished = `
WITH fence AS (SELECT billing_lease_held($2, $3, $4) AS held),
gone AS (DELETE FROM outbox WHERE event_id = ANY($1::uuid[]) AND (SELECT held FROM fence))
SELECT held FROM fence`
	const markFailed = `
WITH fence AS (SELECT billing_lease_held($3, $4, $5) AS held),
marked AS (
  UPDATE outbox AS o SET attempts = attempts + 1, last_error = u.err
  FROM unnest($1::uuid[], $2::text[]) AS u(id, err) WHERE o.event_id = u.id AND (SELECT held FROM fence))
SELECT held FROM fence`
	const markDead = `
WITH fence AS (SELECT billing_lease_held($3, $4, $5) AS held),
gone AS (DELETE FROM outbox WHERE event_id = ANY($1::uuid[]) AND (SELECT held FROM fence) RETURNING *),
moved AS (
  INSERT INTO outbox_dead (event_id, seq, order_id, event_type, causation_id, reason, payload, traceparent, recorded_at, attempts, last_error)
  SELECT g.event_id, g.seq, g.order_id, g.event_type, g.causation_id, g.reason, g.payload, g.traceparent, g.recorded_at, g.attempts + 1, u.err
  FROM gone g JOIN unnest($1::uuid[], $2::text[]) AS u(id, err) ON u.id = g.event_id
  ON CONFLICT (event_id) DO NOTHING)
SELECT held FROM fence`
	// What the broker answered is recorded even when the relay is being
	// stopped meanwhile (a SIGTERM, a lease lost): otherwise the next relay
	// publishes again what this one published. Each statement's fence still
	// refuses a relay whose lease passed on, and markTimeout bounds a stop.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
	defer cancel()
	if len(published) > 0 {
		if err := fenced(ctx, r.db, t, "mark outbox rows published", markPublished, published); err != nil {
			return 0, err
		}
	}
	if len(failed) > 0 {
		r.log.Warn("payment outcome events not published; retrying", "topic", r.topic, "events", len(failed), "err", errs[0])
		if err := fenced(ctx, r.db, t, "record outbox failures", markFailed, failed, errs); err != nil {
			return 0, err
		}
	}
	if len(dead) > 0 {
		ids := make(pq.StringArray, len(dead))
		for i, id := range dead {
			ids[i] = id.String()
			r.log.Error("outbox row cannot be published; skipped (billing_outbox_dead)", "event_id", id.String(), "reason", deadWhy[i])
		}
		if err := fenced(ctx, r.db, t, "mark outbox rows dead", markDead, ids, pq.StringArray(deadWhy)); err != nil {
			return 0, err
		}
	}
	return len(failed), nil
}

// fenced runs stmt, one of the relay's writes, whose arguments are args
// followed by t's lease (billing_lease_held) and which returns whether t
// still held it: ErrLost when it did not, and the statement changed
// nothing.
func fenced(ctx context.Context, db *sqlx.DB, t lease.Tenure, what, stmt string, args ...any) error {
	var held bool
	if err := db.GetContext(ctx, &held, stmt, append(args, t.Args()...)...); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if !held {
		return fmt.Errorf("%s: refused, lease token %d: %w", what, t.Token, lease.ErrLost)
	}
	return nil
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
func (r *Relay) report(ctx context.Context) error {
	const q = `
SELECT count(*), coalesce(extract(epoch FROM now() - min(recorded_at)), 0)::float8, (SELECT count(*) FROM outbox_dead)
FROM outbox WHERE published_at IS NULL AND NOT dead`
	var pending, dead int
	var oldest float64
	if err := r.db.QueryRowxContext(ctx, q).Scan(&pending, &oldest, &dead); err != nil {
		return fmt.Errorf("outbox stats: %w", err)
	}
	r.metrics.OutboxPending.Set(float64(pending))
	r.metrics.OutboxOldestPending.Set(oldest)
	r.metrics.OutboxDead.Set(float64(dead))
	return nil
}
