package order_test

import (
	"testing"

	"example.com/billing/internal/order"
)

func BenchmarkParse(b *testing.B) {
	data := []byte(validEvent())
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := order.Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseWithUnknownFields(b *testing.B) {
	data := []byte(plus(
		field{"source", `"checkout"`},
		field{"meta", `{"traceId":"4bf92f3577b34da6a3ce929d0e0e4736","attempt":1,"tags":["a","b"]}`},
	))
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := order.Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFingerprint(b *testing.B) {
	e := wantEvent()
	b.ReportAllocs()
	for b.Loop() {
		e.Fingerprint()
	}
}
