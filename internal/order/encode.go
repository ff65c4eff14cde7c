package order

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strconv"
	"time"

	"github.com/gofrs/uuid/v5"
)

// New returns an event with a fresh UUID v7 as its ID. It rejects inputs that
// Parse would reject, with the same *ValidationError, so that a producer
// cannot publish an event the consumer will dead-letter. occurredAt is
// stored in UTC without its monotonic clock reading.
//
// The only other error is a failure to generate the ID.
func New(orderID, customerID int64, amount Money, occurredAt time.Time) (Event, error) {
	// UTC also drops the monotonic clock reading.
	e := Event{OccurredAt: occurredAt.UTC(), OrderID: orderID, CustomerID: customerID, Amount: amount}
	if err := e.validatePayload(); err != nil {
		return Event{}, err
	}
	id, err := uuid.NewV7()
	if err != nil {
		return Event{}, fmt.Errorf("order: generate event id: %w", err)
	}
	e.ID = id
	return e, nil
}

// idGen is the generator behind NewIDAt. It is kept apart from the default
// generator that New uses because a generator never lets the timestamps of
// its plain NewV7 UUIDs go backwards: after one ID made for a future time on
// the default generator, every later New would carry that future time too.
var idGen = uuid.NewGen()

// maxIDMillis is the largest timestamp a UUID v7 can hold: 48 bits of Unix
// milliseconds, some time in the year 10889.
const maxIDMillis = 1<<48 - 1

// NewIDAt returns a UUID v7 whose timestamp is t, truncated to the
// millisecond, for producers and tests that need ids from another time. It
// fails for a t before 1970 or after the year 10889, which the UUID cannot
// represent.
func NewIDAt(t time.Time) (uuid.UUID, error) {
	if ms := t.UnixMilli(); ms < 0 || ms > maxIDMillis {
		return uuid.Nil, fmt.Errorf("order: %s is outside the UUID v7 time range", t.Format(time.RFC3339Nano))
	}
	id, err := idGen.NewV7AtTime(t)
	if err != nil {
		return uuid.Nil, fmt.Errorf("order: generate event id: %w", err)
	}
	return id, nil
}

// IDTime returns the creation time inside the UUID v7 ID, with millisecond
// precision, in UTC. It returns the zero Time if ID is not a version 7 UUID.
func (e Event) IDTime() time.Time {
	if e.ID.Version() != uuid.V7 {
		return time.Time{}
	}
	// The first 48 bits are the big-endian Unix time in milliseconds.
	ms := binary.BigEndian.Uint64(e.ID[:8]) >> 16
	return time.UnixMilli(int64(ms)).UTC()
}

// MarshalJSON encodes e in the wire format, with aggregateType "Order",
// occurredAt in UTC and totalAmount as the exact decimal JSON number of
// Amount. It refuses, with Parse's *ValidationError, an event that Parse
// would reject, such as the zero Event.
func (e Event) MarshalJSON() ([]byte, error) {
	if err := checkEventID(e.ID); err != nil {
		return nil, err
	}
	if err := e.validatePayload(); err != nil {
		return nil, err
	}
	// Every value written below is either fixed text or validated to need
	// no JSON escaping (hex UUID, RFC 3339 time, digits, A-Z currency).
	b := make([]byte, 0, 256)
	b = append(b, `{"eventId":"`...)
	b = append(b, e.ID.String()...)
	b = append(b, `","eventType":"`+EventType+`","occurredAt":"`...)
	b = e.OccurredAt.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","aggregateType":"`+aggregateType+`","orderId":`...)
	b = strconv.AppendInt(b, e.OrderID, 10)
	b = append(b, `,"customerId":`...)
	b = strconv.AppendInt(b, e.CustomerID, 10)
	b = append(b, `,"totalAmount":`...)
	b = e.Amount.appendDecimal(b)
	b = append(b, `,"currency":"`...)
	b = append(b, e.Amount.Currency...)
	b = append(b, `"}`...)
	return b, nil
}

// validatePayload checks everything about e except its ID, against the rules
// Parse applies.
func (e Event) validatePayload() error {
	if _, err := normalizeTime(e.OccurredAt); err != nil {
		return err
	}
	if err := checkIntID(e.OrderID, "orderId"); err != nil {
		return err
	}
	if err := checkIntID(e.CustomerID, "customerId"); err != nil {
		return err
	}
	return e.Amount.validate()
}

// Fingerprint returns a SHA-256 digest of what the event says happened:
// eventType, occurredAt, orderId, customerId and the amount. The event ID is
// left out on purpose, so that a producer that re-sends the same confirmation
// under a new ID yields the same fingerprint; so is everything about the
// JSON text (formatting, field order, unknown fields, the time zone offset
// used to write occurredAt).
//
// Fingerprints are meant to be stored, so the encoding they hash is fixed:
// each string is prefixed with its length as a 4-byte big-endian integer,
// each integer is 8 bytes big-endian, in this order: eventType, occurredAt
// as UTC RFC 3339 with nanoseconds (time.RFC3339Nano), orderId, customerId,
// Amount.Minor, Amount.Currency. Fixed widths and length prefixes make the
// encoding unambiguous: different values can never produce the same bytes.
// Changing any of this changes every fingerprint.
func (e Event) Fingerprint() [32]byte {
	var buf [128]byte
	var ts [64]byte
	b := appendLenPrefixed(buf[:0], EventType)
	b = appendLenPrefixed(b, e.OccurredAt.UTC().AppendFormat(ts[:0], time.RFC3339Nano))
	b = binary.BigEndian.AppendUint64(b, uint64(e.OrderID))
	b = binary.BigEndian.AppendUint64(b, uint64(e.CustomerID))
	b = binary.BigEndian.AppendUint64(b, uint64(e.Amount.Minor))
	b = appendLenPrefixed(b, e.Amount.Currency)
	return sha256.Sum256(b)
}

func appendLenPrefixed[T ~string | ~[]byte](b []byte, s T) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}
