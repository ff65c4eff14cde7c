// Package order defines the order.confirmed.v1 event, which the billing
// service consumes from Kafka to charge each order exactly once.
//
// Parse is the strict decoder for untrusted Kafka values: it never panics,
// its work and allocation are bounded by MaxSize, and it reports every
// rejected value as a *ValidationError suitable as a dead-letter reason.
// Amounts are exact integers of minor units; no floating point is involved.
// New and Event.MarshalJSON build the same wire format for producers and
// tests, and New → MarshalJSON → Parse gives back an equal Event.
package order

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/gofrs/uuid/v5"
)

// EventType is the value of the eventType field.
const EventType = "order.confirmed.v1"

// MaxSize is the largest Kafka value Parse accepts, in bytes. A real event
// is a few hundred bytes; the limit bounds the work done on hostile input.
const MaxSize = 64 << 10

// aggregateType is the only value the optional aggregateType field may have.
const aggregateType = "Order"

// Event is a decoded, validated order.confirmed.v1 event.
//
// Events from Parse and New have OccurredAt in UTC and carry no monotonic
// clock reading, so two events describing the same thing compare equal
// with ==.
type Event struct {
	ID         uuid.UUID // github.com/gofrs/uuid/v5, version 7
	OccurredAt time.Time
	OrderID    int64
	CustomerID int64
	Amount     Money
}

// Bits for the fields Parse has seen, to detect missing and duplicate fields
// without allocating.
const (
	seenEventID = 1 << iota
	seenEventType
	seenOccurredAt
	seenAggregateType
	seenOrderID
	seenCustomerID
	seenTotalAmount
	seenCurrency
)

// required lists the required fields in the order in which a missing one is
// reported.
var required = [...]struct {
	bit  uint
	name string
}{
	{seenEventID, "eventId"},
	{seenEventType, "eventType"},
	{seenOccurredAt, "occurredAt"},
	{seenOrderID, "orderId"},
	{seenCustomerID, "customerId"},
	{seenTotalAmount, "totalAmount"},
	{seenCurrency, "currency"},
}

// Parse decodes and validates one order.confirmed.v1 Kafka value. Every
// error it returns is a *ValidationError.
//
// Beyond the per-field rules, Parse insists on exactly one JSON object in
// valid UTF-8 with no repeated field names. Field names are matched
// case-sensitively (unlike json.Unmarshal), and unknown fields are ignored
// so that producers can add fields first.
func Parse(data []byte) (Event, error) {
	switch {
	case len(data) == 0:
		return Event{}, &ValidationError{Rule: "empty value (tombstone)"}
	case len(data) > MaxSize:
		return Event{}, invalid("", "value is %d bytes, limit %d", len(data), MaxSize)
	case !utf8.Valid(data):
		// RFC 8259 requires UTF-8; encoding/json would silently turn
		// invalid bytes into U+FFFD instead.
		return Event{}, &ValidationError{Rule: "value is not valid UTF-8"}
	case !json.Valid(data):
		return Event{}, syntaxError(data)
	}
	var d decoder
	if err := d.decode(data); err != nil {
		return Event{}, err
	}
	return d.event()
}

// syntaxError describes why data, which json.Valid rejected, is not JSON.
// Only this failure path pays for running encoding/json's scanner again to
// get the reason.
func syntaxError(data []byte) *ValidationError {
	var v struct{}
	err := json.Unmarshal(data, &v)
	var serr *json.SyntaxError
	if errors.As(err, &serr) {
		// Offset counts the bytes read up to and including the bad one, so
		// it is the bad byte's 1-based position.
		return invalid("", "invalid JSON at byte %d: %v", serr.Offset, serr)
	}
	return &ValidationError{Rule: "invalid JSON"}
}

// decoder collects the fields of one top-level object.
type decoder struct {
	ev       Event
	seen     uint
	amount   []byte // the totalAmount literal; converted once currency is known
	currency string
	// unknown holds the names of unknown fields, to reject duplicates among
	// them too once all are read. Names without escapes point into the
	// input, so collecting them copies nothing, and for the usual event
	// with no unknown fields the slice stays nil.
	unknown [][]byte
}

// decode walks the top-level object of data. json.Valid has accepted data, so
// it holds exactly one JSON value, possibly surrounded by whitespace.
func (d *decoder) decode(data []byte) error {
	s := scanner{data: data}
	s.skipSpace()
	if s.peek() != '{' {
		top, ok := s.value()
		if !ok {
			return malformed()
		}
		return invalid("", "value is a JSON %s, want an object", top.kind)
	}
	s.pos++
	s.skipSpace()
	if s.consume('}') {
		return nil
	}
	for {
		s.skipSpace()
		key, ok := s.value()
		if !ok || key.kind != kindString {
			return malformed()
		}
		name, err := key.text()
		if err != nil {
			return err
		}
		s.skipSpace()
		if !s.consume(':') {
			return malformed()
		}
		s.skipSpace()
		v, ok := s.value()
		if !ok {
			return malformed()
		}
		if err := d.field(name, v); err != nil {
			return err
		}
		s.skipSpace()
		switch {
		case s.consume(','):
		case s.consume('}'):
			return d.checkUnknownNames()
		default:
			return malformed()
		}
	}
}

// field records one top-level field.
func (d *decoder) field(name []byte, v value) error {
	var err error
	switch string(name) {
	case "eventId":
		if err = d.once(seenEventID, "eventId"); err == nil {
			d.ev.ID, err = parseEventID(v)
		}
	case "eventType":
		if err = d.once(seenEventType, "eventType"); err == nil {
			err = checkString(v, "eventType", EventType)
		}
	case "occurredAt":
		if err = d.once(seenOccurredAt, "occurredAt"); err == nil {
			d.ev.OccurredAt, err = parseOccurredAt(v)
		}
	case "aggregateType":
		if err = d.once(seenAggregateType, "aggregateType"); err == nil {
			err = checkString(v, "aggregateType", aggregateType)
		}
	case "orderId":
		if err = d.once(seenOrderID, "orderId"); err == nil {
			d.ev.OrderID, err = parseIntID(v, "orderId")
		}
	case "customerId":
		if err = d.once(seenCustomerID, "customerId"); err == nil {
			d.ev.CustomerID, err = parseIntID(v, "customerId")
		}
	case "totalAmount":
		if err = d.once(seenTotalAmount, "totalAmount"); err == nil {
			if v.kind == kindNumber {
				d.amount = v.raw
			} else {
				err = wrongType("totalAmount", kindNumber, v.kind)
			}
		}
	case "currency":
		if err = d.once(seenCurrency, "currency"); err == nil {
			var code []byte
			if code, err = stringValue(v, "currency"); err == nil {
				d.currency = string(code)
			}
		}
	default:
		d.unknown = append(d.unknown, name)
	}
	return err
}

// once marks a known field as seen, rejecting a second occurrence: two JSON
// parsers can disagree on which of two values counts, so for a field that
// decides what gets charged, neither may.
func (d *decoder) once(bit uint, name string) error {
	if d.seen&bit != 0 {
		return &ValidationError{Field: name, Rule: "duplicate field"}
	}
	d.seen |= bit
	return nil
}

// checkUnknownNames rejects a repeated name among the fields Parse does not
// know: their values are ignored here, but another consumer of the same
// event may read them. Sorting finds repeats without copying any name.
func (d *decoder) checkUnknownNames() error {
	slices.SortFunc(d.unknown, bytes.Compare)
	for i := 1; i < len(d.unknown); i++ {
		if bytes.Equal(d.unknown[i-1], d.unknown[i]) {
			return invalid("", "duplicate field %s", clip(d.unknown[i]))
		}
	}
	return nil
}

// event checks the collected fields for completeness and converts the amount,
// which needs the currency.
func (d *decoder) event() (Event, error) {
	for _, f := range required {
		if d.seen&f.bit == 0 {
			return Event{}, &ValidationError{Field: f.name, Rule: "missing"}
		}
	}
	amount, err := ParseMoney(string(d.amount), d.currency)
	if err != nil {
		return Event{}, err
	}
	d.ev.Amount = amount
	return d.ev, nil
}

func wrongType(field string, want, got kind) *ValidationError {
	return invalid(field, "want a JSON %s, got %s", want, got)
}

// stringValue returns the contents of v, which must be a JSON string.
func stringValue(v value, field string) ([]byte, error) {
	if v.kind != kindString {
		return nil, wrongType(field, kindString, v.kind)
	}
	return v.text()
}

// checkString requires v to be the JSON string want.
func checkString(v value, field, want string) error {
	got, err := stringValue(v, field)
	if err != nil {
		return err
	}
	if string(got) != want {
		return invalid(field, "got %s, want %q", clip(got), want)
	}
	return nil
}

func parseEventID(v value) (uuid.UUID, error) {
	text, err := stringValue(v, "eventId")
	if err != nil {
		return uuid.Nil, err
	}
	// gofrs/uuid also accepts the braced, URN and unhyphenated forms, but
	// only the canonical form is 36 bytes long.
	var id uuid.UUID
	if len(text) != 36 || id.UnmarshalText(text) != nil {
		return uuid.Nil, invalid("eventId", "%s is not a canonical UUID", clip(text))
	}
	return id, checkEventID(id)
}

func checkEventID(id uuid.UUID) error {
	if id.Version() != uuid.V7 {
		return invalid("eventId", "UUID version %d, want %d", id.Version(), uuid.V7)
	}
	if id.Variant() != uuid.VariantRFC9562 {
		return &ValidationError{Field: "eventId", Rule: "UUID variant is not RFC 9562"}
	}
	return nil
}

func parseOccurredAt(v value) (time.Time, error) {
	text, err := stringValue(v, "occurredAt")
	if err != nil {
		return time.Time{}, err
	}
	t, err := time.Parse(time.RFC3339Nano, string(text))
	if err != nil {
		return time.Time{}, invalid("occurredAt", "%s is not an RFC 3339 timestamp with offset", clip(text))
	}
	return normalizeTime(t)
}

// normalizeTime returns t in UTC without a monotonic clock reading, so that
// the same instant always compares equal and formats the same. RFC 3339 has
// four-digit years, and an offset can push an instant across the edge of that
// range (0000-01-01T00:00:00+01:00 is in year -1 UTC); such a time could not
// be written back out, so it is rejected.
func normalizeTime(t time.Time) (time.Time, error) {
	utc := t.UTC()
	if y := utc.Year(); y < 0 || y > 9999 {
		return time.Time{}, invalid("occurredAt", "%s is outside years 0000-9999 in UTC", t.Format(time.RFC3339Nano))
	}
	return utc, nil
}

// parseIntID parses an orderId or customerId: a JSON number in integer form.
func parseIntID(v value, field string) (int64, error) {
	if v.kind != kindNumber {
		return 0, wrongType(field, kindNumber, v.kind)
	}
	b := v.raw
	neg := len(b) > 0 && b[0] == '-'
	digits := b
	if neg {
		digits = b[1:]
	}
	if len(digits) == 0 {
		return 0, malformed()
	}
	for _, c := range digits {
		if !isDigit(c) {
			return 0, invalid(field, "%s is not an integer", clipNumber(b))
		}
	}
	// Valid JSON integers have no leading zeros, so more digits than
	// MaxInt64 has means a larger magnitude.
	if neg || len(digits) > maxInt64Digits {
		return 0, outOfRange(field, clipNumber(b))
	}
	var n uint64
	for _, c := range digits {
		n = n*10 + uint64(c-'0')
	}
	if n == 0 || n > math.MaxInt64 {
		return 0, outOfRange(field, clipNumber(b))
	}
	return int64(n), nil
}

func outOfRange(field, n string) *ValidationError {
	return invalid(field, "%s is out of range 1..%d", n, int64(math.MaxInt64))
}

// checkIntID applies parseIntID's range rule to an int64 from Go code.
func checkIntID(n int64, field string) error {
	if n < 1 {
		return outOfRange(field, fmt.Sprint(n))
	}
	return nil
}
