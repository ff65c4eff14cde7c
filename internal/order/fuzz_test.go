package order_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"example.com/billing/internal/order"
)

func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		validEvent(),
		without("aggregateType"),
		plus2("totalAmount", `1000`, "currency", `"JPY"`),
		plus2("totalAmount", `0.005`, "currency", `"KWD"`),
		with("totalAmount", `1e2`),
		with("totalAmount", `1E-1`),
		with("totalAmount", `10.100`),
		with("occurredAt", `"2024-03-01T14:00:00.123456789+02:00"`),
		with("orderId", `9223372036854775807`),
		renamed("eventId", `event\u0049d`),
		plus(field{"meta", `{"a":[1,{"b":"}\"]"}],"c":null}`}, field{"EVENTID", `true`}),
		"\t" + validEvent() + "\n",

		"",
		"null",
		"[]",
		`"x"`,
		"{}",
		`{"eventId":`,
		validEvent() + "{}",
		validEvent() + "x",
		with("totalAmount", `"19.99"`),
		with("totalAmount", `10.001`),
		with("totalAmount", `19.999`),
		with("totalAmount", `92233720368547758.08`),
		with("totalAmount", `1e999999999`),
		with("totalAmount", `-1`),
		with("orderId", `1.0`),
		with("orderId", `1e2`),
		with("orderId", `"1"`),
		with("orderId", `9223372036854775808`),
		with("eventId", `"5b3c6a9e-8f1d-4c2b-9a7e-3d4f5a6b7c8d"`),
		with("eventId", `"{`+testID+`}"`),
		with("eventType", `"order.created.v1"`),
		with("occurredAt", `"0000-01-01T00:00:00+01:00"`),
		with("aggregateType", `null`),
		with("currency", `"eur"`),
		with("currency", `"ZZZ"`),
		plus(field{"eventId", `"` + testID + `"`}),
		plus(field{"x", `1`}, field{"x", `2`}),
		plus(field{"x", `1`}, field{`\u0078`, `2`}),
		renamed("eventId", "EVENTID"),
		plus(field{"note", "\"\xff\""}),
	} {
		f.Add([]byte(seed))
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := order.Parse(data)
		if err != nil {
			var verr *order.ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("Parse error %v is a %T, want *order.ValidationError", err, err)
			}
			return
		}
		agreesWithEncodingJSON(t, data, e)

		out, err := e.MarshalJSON()
		if err != nil {
			t.Fatalf("MarshalJSON of parsed %+v: %v", e, err)
		}
		back, err := order.Parse(out)
		if err != nil {
			t.Fatalf("Parse(MarshalJSON()) = %v\ninput:  %q\noutput: %s", err, data, out)
		}
		if back != e {
			t.Fatalf("round trip changed the event\n got %+v\nwant %+v", back, e)
		}
		if back.Fingerprint() != e.Fingerprint() {
			t.Fatal("round trip changed the fingerprint")
		}
	})
}

// agreesWithEncodingJSON checks the event Parse accepted against an
// independent reading of data by encoding/json, so that the fuzzer can find
// inputs the hand-written scanner misreads, not just ones that crash it.
func agreesWithEncodingJSON(t *testing.T, data []byte, e order.Event) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	token := func() json.Token {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("Parse accepted %q, encoding/json does not: %v", data, err)
		}
		return tok
	}
	if tok := token(); tok != json.Delim('{') {
		t.Fatalf("Parse accepted %q, which starts with %v", data, tok)
	}
	m := make(map[string]any)
	for dec.More() {
		name := token().(string)
		if _, dup := m[name]; dup {
			t.Fatalf("Parse accepted %q, which repeats the name %q", data, name)
		}
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("Parse accepted %q, encoding/json does not: %v", data, err)
		}
		m[name] = v
	}
	token() // the closing brace
	if _, err := dec.Token(); err != io.EOF {
		t.Fatalf("Parse accepted %q, which has data after the object", data)
	}

	str := func(name string) string {
		s, ok := m[name].(string)
		if !ok {
			t.Fatalf("Parse accepted %s = %#v", name, m[name])
		}
		return s
	}
	num := func(name string) string {
		n, ok := m[name].(json.Number)
		if !ok {
			t.Fatalf("Parse accepted %s = %#v", name, m[name])
		}
		return n.String()
	}

	if got := str("eventId"); !strings.EqualFold(got, e.ID.String()) {
		t.Errorf("eventId %q, Parse read %v", got, e.ID)
	}
	if got := str("eventType"); got != order.EventType {
		t.Errorf("eventType %q accepted", got)
	}
	if at, err := time.Parse(time.RFC3339Nano, str("occurredAt")); err != nil || !at.Equal(e.OccurredAt) {
		t.Errorf("occurredAt %q, Parse read %v", str("occurredAt"), e.OccurredAt)
	}
	if _, ok := m["aggregateType"]; ok && str("aggregateType") != "Order" {
		t.Errorf("aggregateType %q accepted", str("aggregateType"))
	}
	if got := num("orderId"); got != strconv.FormatInt(e.OrderID, 10) {
		t.Errorf("orderId %s, Parse read %d", got, e.OrderID)
	}
	if got := num("customerId"); got != strconv.FormatInt(e.CustomerID, 10) {
		t.Errorf("customerId %s, Parse read %d", got, e.CustomerID)
	}
	if m, err := order.ParseMoney(num("totalAmount"), str("currency")); err != nil || m != e.Amount {
		t.Errorf("totalAmount %s %s, Parse read %v", num("totalAmount"), str("currency"), e.Amount)
	}
}
