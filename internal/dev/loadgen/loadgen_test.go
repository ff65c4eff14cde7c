package loadgen_test

import (
	"bytes"
	"errors"
	"maps"
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	"example.com/billing/internal/dev/loadgen"
	"example.com/billing/internal/order"
)

// generate returns every message of a generator of opts.
func generate(t *testing.T, opts loadgen.Options) ([]loadgen.Message, loadgen.Expected) {
	t.Helper()
	g, err := loadgen.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	var out []loadgen.Message
	for {
		m, ok, err := g.Next()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		out = append(out, m)
	}
	if g.Remaining() != 0 {
		t.Fatalf("Remaining = %d after the last message", g.Remaining())
	}
	return out, g.Expected()
}

func TestGenerator_CountsMatchTheOptions(t *testing.T) {
	tests := []struct {
		name                   string
		opts                   loadgen.Options
		unique, dups, invalids int
	}{
		{"OK_Demo", loadgen.Options{Count: 3000, Duplicates: 0.1, Invalid: 0.03}, 2610, 300, 90},
		{"OK_ValidOnly", loadgen.Options{Count: 50}, 50, 0, 0},
		{"OK_Rounding", loadgen.Options{Count: 7, Duplicates: 0.1, Invalid: 0.05}, 6, 1, 0},
		{"OK_AllInvalid", loadgen.Options{Count: 24, Invalid: 1}, 0, 0, 24},
		{"OK_MostlyDuplicates", loadgen.Options{Count: 100, Duplicates: 0.99}, 1, 99, 0},
		{"OK_Empty", loadgen.Options{Count: 0, Duplicates: 0.5}, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msgs, exp := generate(t, tt.opts)
			if len(msgs) != tt.opts.Count || exp.Produced != tt.opts.Count {
				t.Fatalf("generated %d messages (Expected.Produced %d), want %d", len(msgs), exp.Produced, tt.opts.Count)
			}
			byKind := map[loadgen.Kind]int{}
			for _, m := range msgs {
				byKind[m.Kind]++
			}
			if byKind[loadgen.Valid] != tt.unique || byKind[loadgen.Duplicate] != tt.dups || byKind[loadgen.Invalid] != tt.invalids {
				t.Errorf("kinds %v, want %d valid, %d duplicate, %d invalid", byKind, tt.unique, tt.dups, tt.invalids)
			}
			if exp.Unique != tt.unique || exp.Duplicates != tt.dups || exp.Invalid != tt.invalids || len(exp.Events) != tt.unique {
				t.Errorf("Expected %+v, want %d unique, %d duplicates, %d invalid", exp, tt.unique, tt.dups, tt.invalids)
			}
		})
	}
}

func TestGenerator_ValidEventsParseAndMatchTheExpectation(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	msgs, exp := generate(t, loadgen.Options{
		Count: 500, Duplicates: 0.2, Invalid: 0.1, FirstOrder: 1000,
		Currencies: []string{"JPY", "KWD"}, Seed: 7, Now: func() time.Time { return now },
	})
	want := map[string]loadgen.Event{}
	for _, ev := range exp.Events {
		want[ev.ID.String()] = ev
	}
	orders := map[int64]bool{}
	for _, m := range msgs {
		if m.Kind == loadgen.Invalid {
			continue
		}
		ev, err := order.Parse(m.Value)
		if err != nil {
			t.Fatalf("%s message does not parse: %v\n%s", m.Kind, err, m.Value)
		}
		if string(m.Key) != strconv.FormatInt(ev.OrderID, 10) || m.OrderID != ev.OrderID {
			t.Errorf("key %q, OrderID %d for order %d", m.Key, m.OrderID, ev.OrderID)
		}
		w, ok := want[ev.ID.String()]
		if !ok {
			t.Fatalf("event %s is not in Expected.Events", ev.ID)
		}
		if w.OrderID != ev.OrderID || w.CustomerID != ev.CustomerID || w.Amount != ev.Amount {
			t.Errorf("event %s is %+v, Expected says %+v", ev.ID, ev, w)
		}
		if c := ev.Amount.Currency; c != "JPY" && c != "KWD" {
			t.Errorf("currency %s not asked for", c)
		}
		if !ev.OccurredAt.Equal(now) {
			t.Errorf("occurredAt %s, want the clock's %s", ev.OccurredAt, now)
		}
		if m.Kind == loadgen.Valid {
			if orders[ev.OrderID] {
				t.Errorf("order %d confirmed by two different events", ev.OrderID)
			}
			orders[ev.OrderID] = true
		}
	}
	if len(orders) != exp.Unique {
		t.Errorf("%d distinct orders among valid events, want %d", len(orders), exp.Unique)
	}
	if exp.LastOrder != 1000+int64(exp.Unique+exp.Invalid)-1 {
		t.Errorf("LastOrder = %d, want %d", exp.LastOrder, 1000+int64(exp.Unique+exp.Invalid)-1)
	}
}

// With Past, valid events are dated within the range, their eventId's time
// and occurredAt alike: a backlog of days.
func TestGenerator_PastDatesEventsWithinTheRange(t *testing.T) {
	now := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	lo, hi := 24*time.Hour, 6*24*time.Hour
	msgs, _ := generate(t, loadgen.Options{Count: 300, Duplicates: 0.1, Invalid: 0.05, Seed: 3,
		Now: func() time.Time { return now }, Past: [2]time.Duration{lo, hi}})
	var earliest, latest time.Time
	for _, m := range msgs {
		if m.Kind != loadgen.Valid {
			continue
		}
		ev, err := order.Parse(m.Value)
		if err != nil {
			t.Fatal(err)
		}
		at := ev.IDTime()
		if !at.Equal(ev.OccurredAt.Truncate(time.Millisecond)) {
			t.Errorf("event %s: id time %s, occurredAt %s: want the same moment", ev.ID, at, ev.OccurredAt)
		}
		if at.Before(now.Add(-hi)) || at.After(now.Add(-lo)) {
			t.Errorf("event %s dated %s, outside %s..%s ago", ev.ID, at, hi, lo)
		}
		if earliest.IsZero() || at.Before(earliest) {
			earliest = at
		}
		if at.After(latest) {
			latest = at
		}
	}
	if latest.Sub(earliest) < 3*24*time.Hour {
		t.Errorf("events dated from %s to %s: not spread over the range", earliest, latest)
	}
}

func TestGenerator_DuplicatesRepeatEarlierBytesNearAndFar(t *testing.T) {
	msgs, exp := generate(t, loadgen.Options{Count: 2000, Duplicates: 0.15, Seed: 3})
	firstAt := map[string]int{} // value → index of its Valid message
	var adjacent, far int
	for i, m := range msgs {
		switch m.Kind {
		case loadgen.Valid:
			firstAt[string(m.Value)] = i
		case loadgen.Duplicate:
			j, ok := firstAt[string(m.Value)]
			if !ok {
				t.Fatalf("duplicate at %d repeats no earlier valid message", i)
			}
			if !bytes.Equal(m.Key, msgs[j].Key) {
				t.Errorf("duplicate at %d has key %q, original %q", i, m.Key, msgs[j].Key)
			}
			if i-j == 1 {
				adjacent++
			}
			if i-j > 100 {
				far++
			}
		}
	}
	if adjacent == 0 || far == 0 {
		t.Errorf("of %d duplicates, %d directly follow their original and %d come more than 100 messages later; want some of each",
			exp.Duplicates, adjacent, far)
	}
}

func TestGenerator_InvalidMessagesAreRejectedByTheDecoder(t *testing.T) {
	msgs, exp := generate(t, loadgen.Options{Count: 120, Invalid: 0.5, Seed: 11})
	seen := map[string]int{}
	for _, m := range msgs {
		if m.Kind != loadgen.Invalid {
			continue
		}
		seen[m.Defect]++
		_, err := order.Parse(m.Value)
		var verr *order.ValidationError
		if !errors.As(err, &verr) {
			t.Errorf("%s: Parse returned %v, want a *ValidationError\n%.200s", m.Defect, err, m.Value)
		}
		if string(m.Key) != strconv.FormatInt(m.OrderID, 10) {
			t.Errorf("%s: key %q, want order id %d", m.Defect, m.Key, m.OrderID)
		}
		switch m.Defect {
		case "tombstone":
			if m.Value != nil {
				t.Errorf("tombstone has a value")
			}
		case "oversize":
			if len(m.Value) <= order.MaxSize {
				t.Errorf("oversize value is %d bytes, limit %d", len(m.Value), order.MaxSize)
			}
		}
	}
	if !maps.Equal(seen, exp.Defects) {
		t.Errorf("defects %v, Expected.Defects %v", seen, exp.Defects)
	}
	for _, d := range loadgen.Defects {
		if seen[d] == 0 {
			t.Errorf("defect %s never generated in %d invalid messages", d, exp.Invalid)
		}
	}
}

func TestGenerator_SameSeedSameMix(t *testing.T) {
	shape := func(seed int64) []string {
		msgs, _ := generate(t, loadgen.Options{Count: 300, Duplicates: 0.1, Invalid: 0.1, Seed: seed})
		var out []string
		for _, m := range msgs {
			s := m.Kind.String() + ":" + string(m.Key) + ":" + m.Defect
			if ev, err := order.Parse(m.Value); err == nil {
				s += ":" + ev.Amount.String() + ":" + strconv.FormatInt(ev.CustomerID, 10)
			}
			out = append(out, s)
		}
		return out
	}
	if a, b := shape(5), shape(5); !slices.Equal(a, b) {
		t.Error("two generators with seed 5 differ")
	}
	if a, b := shape(5), shape(6); slices.Equal(a, b) {
		t.Error("seeds 5 and 6 generate the same mix")
	}
}

func TestExpected_Declined(t *testing.T) {
	_, exp := generate(t, loadgen.Options{Count: 100, FirstOrder: 1})
	tests := []struct {
		every int64
		want  int
	}{{0, 0}, {1, 100}, {20, 5}, {7, 14}, {1000, 0}}
	for _, tt := range tests {
		if got := exp.Declined(tt.every); got != tt.want {
			t.Errorf("Declined(%d) = %d, want %d", tt.every, got, tt.want)
		}
	}
}

func TestNew_RejectsImpossibleOptions(t *testing.T) {
	tests := []struct {
		name string
		opts loadgen.Options
	}{
		{"ErrNegativeCount", loadgen.Options{Count: -1}},
		{"ErrRatioAbove1", loadgen.Options{Count: 10, Duplicates: 1.5}},
		{"ErrNegativeRatio", loadgen.Options{Count: 10, Invalid: -0.1}},
		{"ErrNaNRatio", loadgen.Options{Count: 10, Invalid: math.NaN()}},
		{"ErrRatiosAbove1Together", loadgen.Options{Count: 10, Duplicates: 0.6, Invalid: 0.6}},
		{"ErrDuplicatesOfNothing", loadgen.Options{Count: 10, Duplicates: 0.5, Invalid: 0.5}},
		{"ErrUnknownCurrency", loadgen.Options{Count: 10, Currencies: []string{"EUR", "ZZZ"}}},
		{"ErrLowerCaseCurrency", loadgen.Options{Count: 10, Currencies: []string{"eur"}}},
		{"ErrNegativeFirstOrder", loadgen.Options{Count: 10, FirstOrder: -5}},
		{"ErrOrderIDOverflow", loadgen.Options{Count: 10, FirstOrder: math.MaxInt64 - 3}},
		{"ErrNegativePast", loadgen.Options{Count: 10, Past: [2]time.Duration{-time.Hour, time.Hour}}},
		{"ErrPastUpsideDown", loadgen.Options{Count: 10, Past: [2]time.Duration{2 * time.Hour, time.Hour}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := loadgen.New(tt.opts); err == nil {
				t.Errorf("New(%+v) succeeded", tt.opts)
			}
		})
	}
}
