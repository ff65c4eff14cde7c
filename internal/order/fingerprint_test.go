package order_test

import (
	"crypto/sha256"
	"encoding/binary"
	"testing"
	"time"

	"example.com/billing/internal/order"
)

func mustParse(t *testing.T, input string) order.Event {
	t.Helper()
	e, err := order.Parse([]byte(input))
	if err != nil {
		t.Fatalf("Parse(%s): %v", input, err)
	}
	return e
}

func TestFingerprintEqual(t *testing.T) {
	tests := []struct {
		name  string
		input string
	}{
		{name: "OK_Identical", input: validEvent()},
		{name: "OK_Whitespace", input: " {\n" + validEvent()[1:] + "\n"},
		{name: "OK_FieldOrder", input: `{"currency":"EUR","totalAmount":19.99,"customerId":7,"orderId":42,` +
			`"occurredAt":"2024-03-01T12:00:00Z","eventType":"order.confirmed.v1","eventId":"` + testID + `"}`},
		{name: "OK_UnknownFields", input: plus(field{"source", `"checkout"`}, field{"meta", `{"retry":3}`})},
		{name: "OK_AggregateTypeAbsent", input: without("aggregateType")},
		{name: "OK_OffsetOfSameInstant", input: with("occurredAt", `"2024-03-01T21:00:00+09:00"`)},
		{name: "OK_FractionalZeros", input: with("occurredAt", `"2024-03-01T12:00:00.000Z"`)},
		{name: "OK_AmountSpelling", input: with("totalAmount", `1999E-2`)},
		{name: "OK_UpperCaseUUID", input: with("eventId", `"017F22E2-79B0-7CC3-98C4-DC0C0C07398F"`)},
		// The ID is not part of the fingerprint: a re-sent confirmation
		// with a new ID is the same confirmation.
		{name: "OK_OtherEventID", input: with("eventId", `"01890a5d-ac96-774b-bcce-b302099a8057"`)},
	}
	want := mustParse(t, validEvent()).Fingerprint()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := mustParse(t, tt.input).Fingerprint(); got != want {
				t.Errorf("Fingerprint(%s) = %x, want %x", tt.input, got, want)
			}
		})
	}
}

func TestFingerprintDifferent(t *testing.T) {
	tests := []struct {
		name  string
		input string
	}{
		{name: "OK_OccurredAtOneNanosecondLater", input: with("occurredAt", `"2024-03-01T12:00:00.000000001Z"`)},
		{name: "OK_OccurredAtSameWallClockOtherOffset", input: with("occurredAt", `"2024-03-01T12:00:00+01:00"`)},
		{name: "OK_OrderID", input: with("orderId", `43`)},
		{name: "OK_CustomerID", input: with("customerId", `8`)},
		{name: "OK_OrderAndCustomerSwapped", input: plus2("orderId", `7`, "customerId", `42`)},
		{name: "OK_Amount", input: with("totalAmount", `19.98`)},
		{name: "OK_CurrencySameMinorUnits", input: with("currency", `"USD"`)},
		{name: "OK_CurrencySameMajorUnits", input: plus2("totalAmount", `19.99`, "currency", `"KWD"`)},
	}
	base := mustParse(t, validEvent()).Fingerprint()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := mustParse(t, tt.input).Fingerprint(); got == base {
				t.Errorf("Fingerprint(%s) equals that of the base event", tt.input)
			}
		})
	}
}

// TestFingerprintEncoding pins the documented encoding: fingerprints are
// stored, so it must never change by accident.
func TestFingerprintEncoding(t *testing.T) {
	e := wantEvent()
	e.OccurredAt = time.Date(2024, 3, 1, 12, 0, 0, 500_000_000, time.UTC)

	var b []byte
	str := func(s string) {
		b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	str("order.confirmed.v1")
	str("2024-03-01T12:00:00.5Z")
	b = binary.BigEndian.AppendUint64(b, 42)
	b = binary.BigEndian.AppendUint64(b, 7)
	b = binary.BigEndian.AppendUint64(b, 1999)
	str("EUR")

	if got, want := e.Fingerprint(), sha256.Sum256(b); got != want {
		t.Errorf("Fingerprint() = %x, want %x", got, want)
	}
}
