// Package outbox tells the rest of the system what billing charged: one
// payment outcome event per settled order event, published to
// KAFKA_OUTCOME_TOPIC (payments.settled) through a transactional outbox.
//
// An outcome is recorded as a row of the outbox table in the same
// transaction as the outcome itself (Record, called by billing's settle and
// by the parking of a decoded event), so that it is announced if and only if
// it happened: publishing after the commit could lose it in a crash,
// publishing before could announce a charge that rolled back. The Relay
// publishes the rows afterwards with an idempotent producer, at least once,
// in commit order per order; consumers deduplicate by the outcome's eventId,
// which is derived from the outcome itself (OutcomeID), so that it is the
// same on re-publication and also when billing records an outcome a second
// time because a database failover lost the first record.
package outbox

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strconv"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"example.com/billing/internal/daytable"
	"example.com/billing/internal/order"
)

// Event types of payment outcome events.
const (
	Succeeded = "payment.succeeded.v1"
	Declined  = "payment.declined.v1"
	// Failed: billing decoded the order event but parked it
	// (provider-rejected, stale-event, payload-mismatch), so that the order
	// service does not wait for it for ever. Reason holds the DLQ code.
	Failed = "payment.failed.v1"
)

// Table is the outbox table, partitioned by the day of the outcome's id.
const Table = daytable.Table("outbox")

// Event is one payment outcome event (payment.succeeded.v1,
// payment.declined.v1, payment.failed.v1), as recorded and published. Not
// to be confused with billing.Outcome, what became of a consumed message.
type Event struct {
	// EventID is the outcome event's own id, a UUID v7 derived from the
	// outcome (OutcomeID); NewEvent sets it.
	EventID uuid.UUID
	Type    string
	// OccurredAt is when the outcome was recorded.
	OccurredAt time.Time
	// CausationID is the order.confirmed.v1 event's id.
	CausationID      uuid.UUID
	OrderID          int64
	CustomerID       int64
	Amount           order.Money
	ProviderChargeID string // Succeeded
	DeclineCode      string // Declined, when the provider gave one
	Reason           string // Failed: the DLQ reason code
	// Traceparent continues the order event's trace ("" when it had none).
	Traceparent string
}

// NewEvent returns the outcome event of type typ (with reason, the DLQ reason
// code, for Failed) of the order event ev, recorded now.
func NewEvent(typ string, ev order.Event, reason string, now time.Time) Event {
	return Event{EventID: OutcomeID(ev.ID, typ, reason), Type: typ, OccurredAt: now.UTC(), CausationID: ev.ID,
		OrderID: ev.OrderID, CustomerID: ev.CustomerID, Amount: ev.Amount, Reason: reason}
}

// OutcomeID is the eventId of the outcome of type typ (and reason) of the
// order event cause: a UUID v7 whose time is the order event's (its id's
// first 48 bits) and whose other bits are a hash of the three.
//
// It is derived, not drawn, because an outcome can be recorded twice: after
// a PostgreSQL failover that lost the last acknowledged commits, billing
// consumes the lost events again and the provider answers their charges
// again (same Idempotency-Key), and the outcome recorded then must carry the
// id under which consumers may already have seen it, or they would count
// one payment twice. The same facts give the same id; a different outcome
// of the same order event (declined, then charged after a replay) gives
// another.
func OutcomeID(cause uuid.UUID, typ, reason string) uuid.UUID {
	h := sha256.New()
	h.Write([]byte("payments.settled outcome\x00"))
	h.Write(cause[:])
	h.Write([]byte(typ + "\x00" + reason))
	var id uuid.UUID
	copy(id[:6], cause[:6])
	copy(id[6:], h.Sum(nil))
	id.SetVersion(uuid.V7)
	id.SetVariant(uuid.VariantRFC9562)
	return id
}

// MarshalJSON encodes o as the payments.settled value: totalAmount a JSON
// number with exactly the currency's minor-unit digits (never a float),
// occurredAt in RFC 3339, and providerChargeId, declineCode and reason only
// when set.
func (o Event) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 320)
	b = append(b, `{"eventId":"`...)
	b = append(b, o.EventID.String()...)
	b = append(b, `","eventType":`...)
	b = strconv.AppendQuote(b, o.Type)
	b = append(b, `,"occurredAt":"`...)
	b = o.OccurredAt.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","causationId":"`...)
	b = append(b, o.CausationID.String()...)
	b = append(b, `","orderId":`...)
	b = strconv.AppendInt(b, o.OrderID, 10)
	b = append(b, `,"customerId":`...)
	b = strconv.AppendInt(b, o.CustomerID, 10)
	b = append(b, `,"totalAmount":`...)
	b = append(b, o.Amount.Decimal()...)
	b = append(b, `,"currency":`...)
	b = strconv.AppendQuote(b, o.Amount.Currency)
	for _, f := range []struct{ name, value string }{
		{"providerChargeId", o.ProviderChargeID}, {"declineCode", o.DeclineCode}, {"reason", o.Reason},
	} {
		if f.value != "" {
			b = append(b, `,"`+f.name+`":`...)
			b = strconv.AppendQuote(b, f.value)
		}
	}
	return append(b, '}'), nil
}

// Record inserts outcomes into the outbox inside tx: they are published if
// and only if tx commits. An outcome whose day has no partition lands in the
// default partition (see Retention). An outcome already recorded (the same id: a
// parked message delivered again announces its failure once; a refused
// request refused again is the same fact) is not recorded twice.
func Record(ctx context.Context, tx *sqlx.Tx, outcomes []Event) error {
	if len(outcomes) == 0 {
		return nil
	}
	const q = `
INSERT INTO outbox (event_id, order_id, event_type, causation_id, reason, payload, traceparent)
SELECT id, o, t, c, NULLIF(r, ''), p, NULLIF(tp, '')
FROM unnest($1::uuid[], $2::int8[], $3::text[], $4::uuid[], $5::text[], $6::bytea[], $7::text[]) AS u(id, o, t, c, r, p, tp)
ON CONFLICT (event_id) DO NOTHING`
	var ids, types, causes, reasons, traces pq.StringArray
	var orders pq.Int64Array
	var payloads pq.ByteaArray
	for _, o := range outcomes {
		payload, err := o.MarshalJSON()
		if err != nil {
			return err
		}
		ids = append(ids, o.EventID.String())
		orders = append(orders, o.OrderID)
		types = append(types, o.Type)
		causes = append(causes, o.CausationID.String())
		reasons = append(reasons, o.Reason)
		payloads = append(payloads, payload)
		traces = append(traces, o.Traceparent)
	}
	if _, err := tx.ExecContext(ctx, q, ids, orders, types, causes, reasons, payloads, traces); err != nil {
		return fmt.Errorf("insert outbox: %w", err)
	}
	return nil
}
