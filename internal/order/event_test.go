package order_test

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"example.com/billing/internal/order"
)

// testID is the UUID v7 example from RFC 9562, appendix A.6, created at
// 2022-02-22T19:22:22Z.
const testID = "017f22e2-79b0-7cc3-98c4-dc0c0c07398f"

// field is one top-level field of a test event, with its value as raw JSON.
type field struct{ name, raw string }

// validFields returns the fields of a valid event, in wire order.
func validFields() []field {
	return []field{
		{"eventId", `"` + testID + `"`},
		{"eventType", `"order.confirmed.v1"`},
		{"occurredAt", `"2024-03-01T12:00:00Z"`},
		{"aggregateType", `"Order"`},
		{"orderId", `42`},
		{"customerId", `7`},
		{"totalAmount", `19.99`},
		{"currency", `"EUR"`},
	}
}

func render(fields []field) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, f := range fields {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"` + f.name + `":` + f.raw)
	}
	b.WriteByte('}')
	return b.String()
}

// validEvent is the JSON of the valid test event.
func validEvent() string { return render(validFields()) }

// with returns the valid event with the value of field name replaced by raw.
func with(name, raw string) string {
	fields := validFields()
	for i := range fields {
		if fields[i].name == name {
			fields[i].raw = raw
		}
	}
	return render(fields)
}

// without returns the valid event without field name.
func without(name string) string {
	var fields []field
	for _, f := range validFields() {
		if f.name != name {
			fields = append(fields, f)
		}
	}
	return render(fields)
}

// plus returns the valid event with extra fields appended after the others.
func plus(extra ...field) string {
	return render(append(validFields(), extra...))
}

// renamed returns the valid event with field name renamed to newName.
func renamed(name, newName string) string {
	fields := validFields()
	for i := range fields {
		if fields[i].name == name {
			fields[i].name = newName
		}
	}
	return render(fields)
}

// wantEvent is the Event that validEvent decodes to.
func wantEvent() order.Event {
	return order.Event{
		ID:         uuid.Must(uuid.FromString(testID)),
		OccurredAt: time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC),
		OrderID:    42,
		CustomerID: 7,
		Amount:     order.Money{Minor: 1999, Currency: "EUR"},
	}
}

func TestParseValid(t *testing.T) {
	tests := []struct {
		name  string
		input string
		want  func(*order.Event) // how the result differs from wantEvent
	}{
		{name: "OK_Valid", input: validEvent()},
		{name: "OK_AggregateTypeAbsent", input: without("aggregateType")},
		{name: "OK_UpperCaseUUID", input: with("eventId", `"`+strings.ToUpper(testID)+`"`)},
		{name: "OK_Indented", input: "\n\t{ \"eventId\" :\r\n \"" + testID + `" , "eventType":"order.confirmed.v1","occurredAt":"2024-03-01T12:00:00Z",` +
			`"orderId":42,"customerId":7,"totalAmount":19.99,"currency":"EUR"  }` + " \n"},
		{name: "OK_ReversedFieldOrder", input: `{"currency":"EUR","totalAmount":19.99,"customerId":7,"orderId":42,` +
			`"aggregateType":"Order","occurredAt":"2024-03-01T12:00:00Z","eventType":"order.confirmed.v1","eventId":"` + testID + `"}`},
		{name: "OK_UnknownFieldsIgnored", input: plus(
			field{"schemaVersion", `1`},
			field{"meta", `{"eventId":"nested","a":[1,{"b":null}],"s":"}]\"{["}`},
			field{"tags", `["x",{"y":[[]]},true,false,null,-1.5e3]`},
			field{"note", `"\"quoted\" \\ \u00e9"`},
			field{"flag", `false`},
			field{"nothing", `null`},
		)},
		{name: "OK_CaseDifferentUnknownField", input: plus(field{"EVENTID", `"not an id"`}, field{"OrderId", `"x"`})},
		{name: "OK_EscapedFieldName", input: renamed("eventId", `event\u0049d`)},
		{name: "OK_EscapedValues", input: with("eventType", `"order\u002econfirmed.v1"`)},
		{name: "OK_OffsetNormalizedToUTC", input: with("occurredAt", `"2024-03-01T14:00:00+02:00"`)},
		{name: "OK_NegativeOffset", input: with("occurredAt", `"2024-03-01T07:30:00-04:30"`)},
		{name: "OK_Nanoseconds", input: with("occurredAt", `"2024-03-01T12:00:00.123456789Z"`),
			want: func(e *order.Event) { e.OccurredAt = e.OccurredAt.Add(123456789) }},
		{name: "OK_TrailingZeros", input: with("totalAmount", `19.990`)},
		{name: "OK_Exponent", input: with("totalAmount", `1999e-2`)},
		{name: "OK_MaxIDs", input: with("orderId", `9223372036854775807`),
			want: func(e *order.Event) { e.OrderID = math.MaxInt64 }},
		{name: "OK_JPY", input: plus2("totalAmount", `1000`, "currency", `"JPY"`),
			want: func(e *order.Event) { e.Amount = order.Money{Minor: 1000, Currency: "JPY"} }},
		{name: "OK_KWD", input: plus2("totalAmount", `0.005`, "currency", `"KWD"`),
			want: func(e *order.Event) { e.Amount = order.Money{Minor: 5, Currency: "KWD"} }},
		{name: "OK_ExactlyMaxSize", input: padTo(validEvent(), order.MaxSize)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := order.Parse([]byte(tt.input))
			if err != nil {
				t.Fatalf("Parse(%s) error: %v", tt.input, err)
			}
			want := wantEvent()
			if tt.want != nil {
				tt.want(&want)
			}
			if got != want {
				t.Errorf("Parse(%s)\n got %+v\nwant %+v", tt.input, got, want)
			}
		})
	}
}

// plus2 returns the valid event with two field values replaced.
func plus2(name1, raw1, name2, raw2 string) string {
	fields := validFields()
	for i := range fields {
		switch fields[i].name {
		case name1:
			fields[i].raw = raw1
		case name2:
			fields[i].raw = raw2
		}
	}
	return render(fields)
}

// padTo pads the JSON text s with trailing spaces to n bytes.
func padTo(s string, n int) string {
	return s + strings.Repeat(" ", n-len(s))
}

func TestParseInvalid(t *testing.T) {
	tests := []struct {
		name      string
		input     []byte
		wantField string
		wantMsg   string // whole error text, when it matters
	}{
		{name: "ErrTombstoneNil", input: nil, wantField: ""},
		{name: "ErrTombstoneEmpty", input: []byte{}, wantField: ""},
		{name: "ErrOversize", input: []byte(padTo(validEvent(), order.MaxSize+1)), wantField: "",
			wantMsg: "value is 65537 bytes, limit 65536"},
		{name: "ErrOnlySpace", input: []byte("  "), wantField: ""},
		{name: "ErrBadJSON", input: []byte(`{"eventId":`), wantField: ""},
		{name: "ErrBadJSONTrailingComma", input: []byte(strings.TrimSuffix(validEvent(), "}") + ",}"), wantField: ""},
		{name: "ErrSingleQuotes", input: []byte(`{'eventId':1}`), wantField: ""},
		{name: "ErrArray", input: []byte(`[` + validEvent() + `]`), wantField: "",
			wantMsg: "value is a JSON array, want an object"},
		{name: "ErrString", input: []byte(`"order"`), wantField: ""},
		{name: "ErrNull", input: []byte(`null`), wantField: ""},
		{name: "ErrNumber", input: []byte(`42`), wantField: ""},
		{name: "ErrTrailingObject", input: []byte(validEvent() + `{}`), wantField: ""},
		{name: "ErrTrailingGarbage", input: []byte(validEvent() + `x`), wantField: "",
			wantMsg: fmt.Sprintf("invalid JSON at byte %d: invalid character 'x' after top-level value", len(validEvent())+1)},
		{name: "ErrTwoEvents", input: []byte(validEvent() + "\n" + validEvent()), wantField: ""},
		{name: "ErrInvalidUTF8", input: []byte(plus(field{"note", "\"\xff\""})), wantField: ""},
		{name: "ErrByteOrderMark", input: []byte("\ufeff" + validEvent()), wantField: ""},
		{name: "ErrEmptyObject", input: []byte(`{}`), wantField: "eventId"},

		{name: "ErrMissingEventID", input: []byte(without("eventId")), wantField: "eventId", wantMsg: "eventId: missing"},
		{name: "ErrMissingEventType", input: []byte(without("eventType")), wantField: "eventType"},
		{name: "ErrMissingOccurredAt", input: []byte(without("occurredAt")), wantField: "occurredAt"},
		{name: "ErrMissingOrderID", input: []byte(without("orderId")), wantField: "orderId"},
		{name: "ErrMissingCustomerID", input: []byte(without("customerId")), wantField: "customerId"},
		{name: "ErrMissingTotalAmount", input: []byte(without("totalAmount")), wantField: "totalAmount"},
		{name: "ErrMissingCurrency", input: []byte(without("currency")), wantField: "currency"},
		{name: "ErrCaseDifferentName", input: []byte(renamed("eventId", "EVENTID")), wantField: "eventId"},
		{name: "ErrCaseDifferentNameOrderID", input: []byte(renamed("orderId", "orderID")), wantField: "orderId"},

		{name: "ErrDuplicateEventID", input: []byte(plus(field{"eventId", `"` + testID + `"`})), wantField: "eventId",
			wantMsg: "eventId: duplicate field"},
		{name: "ErrDuplicateTotalAmount", input: []byte(plus(field{"totalAmount", `0.01`})), wantField: "totalAmount"},
		{name: "ErrDuplicateAggregateType", input: []byte(plus(field{"aggregateType", `"Order"`})), wantField: "aggregateType"},
		{name: "ErrDuplicateViaEscape", input: []byte(plus(field{`order\u0049d`, `42`})), wantField: "orderId"},
		{name: "ErrDuplicateUnknown", input: []byte(plus(field{"x", `1`}, field{"x", `1`})), wantField: "",
			wantMsg: `duplicate field "x"`},
		{name: "ErrDuplicateUnknownViaEscape", input: []byte(plus(field{"x", `1`}, field{`\u0078`, `2`})), wantField: ""},

		{name: "ErrEventIDVersion4", input: []byte(with("eventId", `"5b3c6a9e-8f1d-4c2b-9a7e-3d4f5a6b7c8d"`)), wantField: "eventId",
			wantMsg: "eventId: UUID version 4, want 7"},
		{name: "ErrEventIDVersion6", input: []byte(with("eventId", `"1ec9414c-232a-6b00-b3c8-9e6bdeced846"`)), wantField: "eventId"},
		{name: "ErrEventIDNil", input: []byte(with("eventId", `"00000000-0000-0000-0000-000000000000"`)), wantField: "eventId"},
		{name: "ErrEventIDMax", input: []byte(with("eventId", `"ffffffff-ffff-ffff-ffff-ffffffffffff"`)), wantField: "eventId"},
		{name: "ErrEventIDVariant", input: []byte(with("eventId", `"017f22e2-79b0-7cc3-c8c4-dc0c0c07398f"`)), wantField: "eventId"},
		{name: "ErrEventIDBraces", input: []byte(with("eventId", `"{`+testID+`}"`)), wantField: "eventId"},
		{name: "ErrEventIDURN", input: []byte(with("eventId", `"urn:uuid:`+testID+`"`)), wantField: "eventId"},
		{name: "ErrEventIDNoHyphens", input: []byte(with("eventId", `"`+strings.ReplaceAll(testID, "-", "")+`"`)), wantField: "eventId"},
		{name: "ErrEventIDMisplacedHyphen", input: []byte(with("eventId", `"017f22e-279b0-7cc3-98c4-dc0c0c07398f"`)), wantField: "eventId"},
		{name: "ErrEventIDNotHex", input: []byte(with("eventId", `"017f22e2-79b0-7cc3-98c4-dc0c0c07398g"`)), wantField: "eventId"},
		{name: "ErrEventIDSpaces", input: []byte(with("eventId", `" `+testID+`"`)), wantField: "eventId"},
		{name: "ErrEventIDEmpty", input: []byte(with("eventId", `""`)), wantField: "eventId"},
		{name: "ErrEventIDNumber", input: []byte(with("eventId", `1`)), wantField: "eventId"},
		{name: "ErrEventIDNull", input: []byte(with("eventId", `null`)), wantField: "eventId"},

		{name: "ErrEventTypeOther", input: []byte(with("eventType", `"order.created.v1"`)), wantField: "eventType",
			wantMsg: `eventType: got "order.created.v1", want "order.confirmed.v1"`},
		{name: "ErrEventTypeCase", input: []byte(with("eventType", `"Order.Confirmed.V1"`)), wantField: "eventType"},
		{name: "ErrEventTypeVersion", input: []byte(with("eventType", `"order.confirmed.v2"`)), wantField: "eventType"},
		{name: "ErrEventTypeArray", input: []byte(with("eventType", `["order.confirmed.v1"]`)), wantField: "eventType",
			wantMsg: "eventType: want a JSON string, got array"},

		{name: "ErrOccurredAtNoOffset", input: []byte(with("occurredAt", `"2024-03-01T12:00:00"`)), wantField: "occurredAt"},
		{name: "ErrOccurredAtDateOnly", input: []byte(with("occurredAt", `"2024-03-01"`)), wantField: "occurredAt"},
		{name: "ErrOccurredAtSpace", input: []byte(with("occurredAt", `"2024-03-01 12:00:00Z"`)), wantField: "occurredAt"},
		{name: "ErrOccurredAtUnixNumber", input: []byte(with("occurredAt", `1709294400`)), wantField: "occurredAt"},
		{name: "ErrOccurredAtInvalidDate", input: []byte(with("occurredAt", `"2024-02-30T12:00:00Z"`)), wantField: "occurredAt"},
		{name: "ErrOccurredAtBeforeYear0UTC", input: []byte(with("occurredAt", `"0000-01-01T00:00:00+01:00"`)), wantField: "occurredAt"},
		{name: "ErrOccurredAtAfterYear9999UTC", input: []byte(with("occurredAt", `"9999-12-31T23:59:59-01:00"`)), wantField: "occurredAt"},

		{name: "ErrAggregateTypeOther", input: []byte(with("aggregateType", `"Customer"`)), wantField: "aggregateType"},
		{name: "ErrAggregateTypeLowerCase", input: []byte(with("aggregateType", `"order"`)), wantField: "aggregateType"},
		{name: "ErrAggregateTypeNull", input: []byte(with("aggregateType", `null`)), wantField: "aggregateType",
			wantMsg: "aggregateType: want a JSON string, got null"},

		{name: "ErrOrderIDFraction", input: []byte(with("orderId", `1.0`)), wantField: "orderId",
			wantMsg: "orderId: 1.0 is not an integer"},
		{name: "ErrOrderIDExponent", input: []byte(with("orderId", `1e2`)), wantField: "orderId"},
		{name: "ErrOrderIDString", input: []byte(with("orderId", `"1"`)), wantField: "orderId",
			wantMsg: "orderId: want a JSON number, got string"},
		{name: "ErrOrderIDZero", input: []byte(with("orderId", `0`)), wantField: "orderId"},
		{name: "ErrOrderIDNegativeZero", input: []byte(with("orderId", `-0`)), wantField: "orderId"},
		{name: "ErrOrderIDNegative", input: []byte(with("orderId", `-5`)), wantField: "orderId",
			wantMsg: "orderId: -5 is out of range 1..9223372036854775807"},
		{name: "ErrOrderIDTwoTo63", input: []byte(with("orderId", `9223372036854775808`)), wantField: "orderId"},
		{name: "ErrOrderIDHuge", input: []byte(with("orderId", strings.Repeat("9", 100))), wantField: "orderId"},
		{name: "ErrOrderIDBool", input: []byte(with("orderId", `true`)), wantField: "orderId"},
		{name: "ErrOrderIDNull", input: []byte(with("orderId", `null`)), wantField: "orderId"},
		{name: "ErrCustomerIDZero", input: []byte(with("customerId", `0`)), wantField: "customerId"},
		{name: "ErrCustomerIDFraction", input: []byte(with("customerId", `7.5`)), wantField: "customerId"},
		{name: "ErrCustomerIDString", input: []byte(with("customerId", `"7"`)), wantField: "customerId"},
		{name: "ErrCustomerIDTwoTo63", input: []byte(with("customerId", `9223372036854775808`)), wantField: "customerId"},
		{name: "ErrCustomerIDObject", input: []byte(with("customerId", `{"id":7}`)), wantField: "customerId"},

		{name: "ErrTotalAmountString", input: []byte(with("totalAmount", `"19.99"`)), wantField: "totalAmount",
			wantMsg: "totalAmount: want a JSON number, got string"},
		{name: "ErrTooManyDecimals", input: []byte(with("totalAmount", `10.001`)), wantField: "totalAmount",
			wantMsg: "totalAmount: 10.001 has more decimal places than EUR allows (2)"},
		{name: "ErrTotalAmountNotRounded", input: []byte(with("totalAmount", `19.999`)), wantField: "totalAmount"},
		{name: "ErrTotalAmountZero", input: []byte(with("totalAmount", `0`)), wantField: "totalAmount"},
		{name: "ErrTotalAmountNegative", input: []byte(with("totalAmount", `-19.99`)), wantField: "totalAmount"},
		{name: "ErrTotalAmountOverflow", input: []byte(with("totalAmount", `92233720368547758.08`)), wantField: "totalAmount"},
		{name: "ErrTotalAmountHugeExponent", input: []byte(with("totalAmount", `1e999999999`)), wantField: "totalAmount"},
		{name: "ErrTotalAmountTooLong", input: []byte(with("totalAmount", "1."+strings.Repeat("0", 1000))), wantField: "totalAmount"},
		{name: "ErrTotalAmountNull", input: []byte(with("totalAmount", `null`)), wantField: "totalAmount"},
		{name: "ErrTotalAmountObject", input: []byte(with("totalAmount", `{"amount":19.99}`)), wantField: "totalAmount"},
		{name: "ErrJPYFraction", input: []byte(plus2("totalAmount", `1000.5`, "currency", `"JPY"`)), wantField: "totalAmount"},

		{name: "ErrCurrencyUnknown", input: []byte(with("currency", `"ZZZ"`)), wantField: "currency"},
		{name: "ErrCurrencyLowerCase", input: []byte(with("currency", `"eur"`)), wantField: "currency"},
		{name: "ErrCurrencyTooLong", input: []byte(with("currency", `"EURO"`)), wantField: "currency"},
		{name: "ErrCurrencyEmpty", input: []byte(with("currency", `""`)), wantField: "currency"},
		{name: "ErrCurrencyNumericCode", input: []byte(with("currency", `978`)), wantField: "currency"},
		{name: "ErrCurrencyNull", input: []byte(with("currency", `null`)), wantField: "currency"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := order.Parse(tt.input)
			requireValidationError(t, err, tt.wantField)
			if tt.wantMsg != "" && err.Error() != tt.wantMsg {
				t.Errorf("error = %q, want %q", err, tt.wantMsg)
			}
			if got != (order.Event{}) {
				t.Errorf("Parse returned %+v along with an error", got)
			}
		})
	}
}

// TestParseErrorTextIsShort checks that an error quoting a huge or
// unprintable value stays one short line.
func TestParseErrorTextIsShort(t *testing.T) {
	tests := []struct {
		name  string
		input string
	}{
		{name: "ErrLongEventType", input: with("eventType", `"`+strings.Repeat("x", 10000)+`"`)},
		{name: "ErrLongOrderID", input: with("orderId", strings.Repeat("1", 10000)+".5")},
		{name: "ErrLongDuplicateName", input: plus(field{strings.Repeat("k", 10000), "1"}, field{strings.Repeat("k", 10000), "1"})},
		{name: "ErrControlCharacters", input: with("currency", `"\n\u0000\t"`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := order.Parse([]byte(tt.input))
			if err == nil {
				t.Fatal("Parse succeeded, want an error")
			}
			if msg := err.Error(); len(msg) > 120 || strings.ContainsAny(msg, "\n\x00\t") {
				t.Errorf("error text is not one short line: %q", msg)
			}
		})
	}
}

func TestEventIDTime(t *testing.T) {
	e := wantEvent()
	if got, want := e.IDTime(), time.Date(2022, 2, 22, 19, 22, 22, 0, time.UTC); !got.Equal(want) || got.Location() != time.UTC {
		t.Errorf("IDTime() = %v, want %v", got, want)
	}

	e.ID = uuid.Must(uuid.NewV4())
	if got := e.IDTime(); !got.IsZero() {
		t.Errorf("IDTime() of a v4 ID = %v, want the zero Time", got)
	}
}

func TestNewIDAt(t *testing.T) {
	tests := []struct {
		name    string
		at      time.Time
		wantErr bool
	}{
		{name: "OK_Past", at: time.Date(2001, 9, 9, 1, 46, 40, 123456789, time.UTC)},
		{name: "OK_Future", at: time.Date(2999, 1, 1, 0, 0, 0, 999_999_999, time.FixedZone("X", 3600))},
		{name: "OK_UnixEpoch", at: time.Unix(0, 0)},
		{name: "ErrBefore1970", at: time.Date(1969, 12, 31, 23, 59, 59, 0, time.UTC), wantErr: true},
		{name: "ErrAfterYear10889", at: time.Date(10890, 1, 1, 0, 0, 0, 0, time.UTC), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := order.NewIDAt(tt.at)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("NewIDAt(%v) = %v, want an error", tt.at, id)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if id.Version() != uuid.V7 || id.Variant() != uuid.VariantRFC9562 {
				t.Fatalf("NewIDAt made %v, version %d variant %d", id, id.Version(), id.Variant())
			}
			want := tt.at.Truncate(time.Millisecond).UTC()
			if got := (order.Event{ID: id}).IDTime(); !got.Equal(want) {
				t.Errorf("IDTime() = %v, want %v", got, want)
			}
		})
	}
}

// TestNewIDAtLeavesNewAlone guards against ids from NewIDAt sharing a
// generator with New: a future id would then pin the timestamps of all later
// New ids to that future time.
func TestNewIDAtLeavesNewAlone(t *testing.T) {
	if _, err := order.NewIDAt(time.Now().AddDate(100, 0, 0)); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	e, err := order.New(1, 2, order.Money{Minor: 100, Currency: "EUR"}, before)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.IDTime(); got.Before(before.Add(-time.Second)) || got.After(time.Now().Add(time.Second)) {
		t.Errorf("New after NewIDAt(future) made an id from %v, want about %v", got, before)
	}
}

func TestNew(t *testing.T) {
	at := time.Date(2024, 3, 1, 14, 0, 0, 5, time.FixedZone("CEST", 2*3600))
	e, err := order.New(42, 7, order.Money{Minor: 1999, Currency: "EUR"}, at)
	if err != nil {
		t.Fatal(err)
	}
	if e.ID.Version() != uuid.V7 {
		t.Errorf("ID %v has version %d, want 7", e.ID, e.ID.Version())
	}
	if d := time.Since(e.IDTime()); d < -time.Second || d > time.Minute {
		t.Errorf("IDTime() = %v, want about now", e.IDTime())
	}
	if !e.OccurredAt.Equal(at) || e.OccurredAt.Location() != time.UTC {
		t.Errorf("OccurredAt = %v, want %v in UTC", e.OccurredAt, at)
	}
	if e.OrderID != 42 || e.CustomerID != 7 || e.Amount != (order.Money{Minor: 1999, Currency: "EUR"}) {
		t.Errorf("New made %+v", e)
	}

	// The monotonic clock reading of time.Now must not survive, or the
	// event would not compare equal to its parsed copy.
	now, err := order.New(1, 1, order.Money{Minor: 1, Currency: "JPY"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if now.OccurredAt != now.OccurredAt.Round(0) {
		t.Error("OccurredAt kept its monotonic clock reading")
	}
}

func TestNewInvalid(t *testing.T) {
	eur := order.Money{Minor: 1999, Currency: "EUR"}
	at := time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name       string
		orderID    int64
		customerID int64
		amount     order.Money
		at         time.Time
		wantField  string
	}{
		{name: "ErrOrderIDZero", orderID: 0, customerID: 7, amount: eur, at: at, wantField: "orderId"},
		{name: "ErrOrderIDNegative", orderID: math.MinInt64, customerID: 7, amount: eur, at: at, wantField: "orderId"},
		{name: "ErrCustomerIDNegative", orderID: 42, customerID: -1, amount: eur, at: at, wantField: "customerId"},
		{name: "ErrAmountZero", orderID: 42, customerID: 7, amount: order.Money{Currency: "EUR"}, at: at, wantField: "totalAmount"},
		{name: "ErrAmountNegative", orderID: 42, customerID: 7, amount: order.Money{Minor: -1, Currency: "EUR"}, at: at, wantField: "totalAmount"},
		{name: "ErrCurrencyUnknown", orderID: 42, customerID: 7, amount: order.Money{Minor: 1, Currency: "ZZZ"}, at: at, wantField: "currency"},
		{name: "ErrCurrencyEmpty", orderID: 42, customerID: 7, amount: order.Money{Minor: 1}, at: at, wantField: "currency"},
		{name: "ErrOccurredAtYear10000", orderID: 42, customerID: 7, amount: eur, at: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), wantField: "occurredAt"},
		{name: "ErrOccurredAtNegativeYear", orderID: 42, customerID: 7, amount: eur, at: time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC), wantField: "occurredAt"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := order.New(tt.orderID, tt.customerID, tt.amount, tt.at)
			requireValidationError(t, err, tt.wantField)
			if e != (order.Event{}) {
				t.Errorf("New returned %+v along with an error", e)
			}
		})
	}
}

func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name   string
		amount order.Money
		at     time.Time
	}{
		{name: "OK_EUR", amount: order.Money{Minor: 1999, Currency: "EUR"}, at: time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)},
		{name: "OK_EURWholeEuros", amount: order.Money{Minor: 1000, Currency: "EUR"}, at: time.Now()},
		{name: "OK_JPY", amount: order.Money{Minor: 1000, Currency: "JPY"}, at: time.Date(2024, 3, 1, 14, 0, 0, 1, time.FixedZone("", 7200))},
		{name: "OK_KWD", amount: order.Money{Minor: 5, Currency: "KWD"}, at: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)},
		{name: "OK_MaxAmount", amount: order.Money{Minor: math.MaxInt64, Currency: "CLF"}, at: time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := order.New(math.MaxInt64, 1, tt.amount, tt.at)
			if err != nil {
				t.Fatal(err)
			}
			data, err := e.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			got, err := order.Parse(data)
			if err != nil {
				t.Fatalf("Parse(%s): %v", data, err)
			}
			if got != e {
				t.Errorf("round trip through %s\n got %+v\nwant %+v", data, got, e)
			}
			if got.Fingerprint() != e.Fingerprint() {
				t.Error("fingerprint changed in the round trip")
			}
		})
	}
}

func TestMarshalJSON(t *testing.T) {
	e := wantEvent()
	e.OccurredAt = time.Date(2024, 3, 1, 14, 0, 0, 500_000_000, time.FixedZone("CEST", 2*3600))
	e.Amount = order.Money{Minor: 1990, Currency: "EUR"}
	want := `{"eventId":"` + testID + `","eventType":"order.confirmed.v1","occurredAt":"2024-03-01T12:00:00.5Z",` +
		`"aggregateType":"Order","orderId":42,"customerId":7,"totalAmount":19.90,"currency":"EUR"}`

	got, err := e.MarshalJSON()
	if err != nil || string(got) != want {
		t.Fatalf("MarshalJSON() = %s, %v\nwant %s", got, err, want)
	}
	// encoding/json uses the method and accepts its output.
	got, err = json.Marshal(e)
	if err != nil || string(got) != want {
		t.Fatalf("json.Marshal() = %s, %v\nwant %s", got, err, want)
	}
}

func TestMarshalJSONInvalid(t *testing.T) {
	tests := []struct {
		name      string
		event     func(*order.Event)
		wantField string
	}{
		{name: "ErrZeroEvent", event: func(e *order.Event) { *e = order.Event{} }, wantField: "eventId"},
		{name: "ErrIDVersion4", event: func(e *order.Event) { e.ID = uuid.Must(uuid.NewV4()) }, wantField: "eventId"},
		{name: "ErrOrderIDZero", event: func(e *order.Event) { e.OrderID = 0 }, wantField: "orderId"},
		{name: "ErrCustomerIDZero", event: func(e *order.Event) { e.CustomerID = 0 }, wantField: "customerId"},
		{name: "ErrAmountZero", event: func(e *order.Event) { e.Amount.Minor = 0 }, wantField: "totalAmount"},
		{name: "ErrCurrencyLowerCase", event: func(e *order.Event) { e.Amount.Currency = "eur" }, wantField: "currency"},
		{name: "ErrOccurredAtYear10000", event: func(e *order.Event) { e.OccurredAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }, wantField: "occurredAt"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := wantEvent()
			tt.event(&e)
			data, err := e.MarshalJSON()
			requireValidationError(t, err, tt.wantField)
			if data != nil {
				t.Errorf("MarshalJSON returned %s along with an error", data)
			}
		})
	}
}
