package reconcile_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"example.com/billing/internal/charge"
	"example.com/billing/internal/reconcile"
)

var (
	from = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	to   = from.Add(24 * time.Hour)
	win  = reconcile.Window{From: from, To: to}
	mid  = from.Add(12 * time.Hour)
)

const (
	key1 = "0195a000-0000-7000-8000-000000000001"
	key2 = "0195a000-0000-7000-8000-000000000002"
)

// rec is a succeeded row of key at t that pairs with chg(key, t).
func rec(key string, t time.Time) reconcile.Record {
	return reconcile.Record{EventID: key, OrderID: 42, CustomerID: 7, Amount: 1999, Currency: "EUR",
		Status: charge.Succeeded, ProviderChargeID: "ch_" + key[len(key)-4:], CreatedAt: t}
}

func chg(key string, t time.Time) reconcile.Charge {
	return reconcile.Charge{ID: "ch_" + key[len(key)-4:], IdempotencyKey: key, OrderID: 42, CustomerID: 7,
		Amount: 1999, Currency: "EUR", Status: "succeeded", Created: t}
}

func with[T any](v T, f func(*T)) T { f(&v); return v }

func TestCompare(t *testing.T) {
	declined := with(rec(key1, mid), func(r *reconcile.Record) { r.Status, r.ProviderChargeID = charge.Declined, "" })
	tests := []struct {
		name    string
		records []reconcile.Record
		charges []reconcile.Charge
		want    reconcile.Summary
		// kinds and diffs: "kind" or "mismatch:field,field"
		wantDisc []string
	}{
		{
			name:    "both sides agree",
			records: []reconcile.Record{rec(key1, mid)},
			charges: []reconcile.Charge{chg(key1, mid.Add(time.Second))},
			want:    reconcile.Summary{Records: 1, Charges: 1, Matched: 1},
		},
		{
			name:    "declined row is not expected at the provider",
			records: []reconcile.Record{declined},
			want:    reconcile.Summary{Records: 1, Declined: 1},
		},
		{
			name:     "declined row but the provider charged",
			records:  []reconcile.Record{declined},
			charges:  []reconcile.Charge{chg(key1, mid)},
			want:     reconcile.Summary{Records: 1, Charges: 1, Mismatched: 1},
			wantDisc: []string{"mismatch:status"},
		},
		{
			name:    "rejected row is not expected at the provider",
			records: []reconcile.Record{with(declined, func(r *reconcile.Record) { r.Status = charge.Rejected })},
			want:    reconcile.Summary{Records: 1, Rejected: 1},
		},
		{
			name:     "pending attempt the provider charged",
			records:  []reconcile.Record{with(declined, func(r *reconcile.Record) { r.Status = charge.Pending })},
			charges:  []reconcile.Charge{chg(key1, mid)},
			want:     reconcile.Summary{Records: 1, Charges: 1, Pending: 1},
			wantDisc: []string{"pending"},
		},
		{
			name:     "pending attempt without a provider charge",
			records:  []reconcile.Record{with(declined, func(r *reconcile.Record) { r.Status = charge.Pending })},
			want:     reconcile.Summary{Records: 1, Pending: 1},
			wantDisc: []string{"pending"},
		},
		{
			name:    "in-progress attempt the provider charged meanwhile",
			records: []reconcile.Record{with(declined, func(r *reconcile.Record) { r.Status, r.ProviderChargeID = charge.InProgress, "ch_"+key1 })},
			charges: []reconcile.Charge{chg(key1, mid)},
			want:    reconcile.Summary{Records: 1, Charges: 1, InProgress: 1},
		},
		{
			name:    "in-progress attempt the provider holds without a verdict",
			records: []reconcile.Record{with(declined, func(r *reconcile.Record) { r.Status = charge.InProgress })},
			want:    reconcile.Summary{Records: 1, InProgress: 1},
		},
		{
			name:     "row without provider charge",
			records:  []reconcile.Record{rec(key1, mid)},
			want:     reconcile.Summary{Records: 1, MissingAtProvider: 1},
			wantDisc: []string{"missing_at_provider"},
		},
		{
			name:     "provider charge without row",
			charges:  []reconcile.Charge{chg(key1, mid)},
			want:     reconcile.Summary{Charges: 1, MissingInDB: 1},
			wantDisc: []string{"missing_in_db"},
		},
		{
			name:     "amount differs",
			records:  []reconcile.Record{with(rec(key1, mid), func(r *reconcile.Record) { r.Amount = 2000 })},
			charges:  []reconcile.Charge{chg(key1, mid)},
			want:     reconcile.Summary{Records: 1, Charges: 1, Mismatched: 1},
			wantDisc: []string{"mismatch:amount"},
		},
		{
			name:     "order, customer and currency differ",
			records:  []reconcile.Record{rec(key1, mid)},
			charges:  []reconcile.Charge{with(chg(key1, mid), func(c *reconcile.Charge) { c.OrderID, c.CustomerID, c.Currency = 43, 8, "USD" })},
			want:     reconcile.Summary{Records: 1, Charges: 1, Mismatched: 1},
			wantDisc: []string{"mismatch:orderId,customerId,currency"},
		},
		{
			name:    "a provider side that tells no order or customer (Adyen's notifications)",
			records: []reconcile.Record{rec(key1, mid)},
			charges: []reconcile.Charge{with(chg(key1, mid), func(c *reconcile.Charge) { c.OrderID, c.CustomerID = 0, 0 })},
			want:    reconcile.Summary{Records: 1, Charges: 1, Matched: 1},
		},
		{
			name:     "provider charge id differs",
			records:  []reconcile.Record{with(rec(key1, mid), func(r *reconcile.Record) { r.ProviderChargeID = "ch_other" })},
			charges:  []reconcile.Charge{chg(key1, mid)},
			want:     reconcile.Summary{Records: 1, Charges: 1, Mismatched: 1},
			wantDisc: []string{"mismatch:providerChargeId"},
		},
		{
			name:    "char(3) padding and key case do not differ",
			records: []reconcile.Record{with(rec(key1, mid), func(r *reconcile.Record) { r.Currency = "EUR " })},
			charges: []reconcile.Charge{with(chg(key1, mid), func(c *reconcile.Charge) { c.IdempotencyKey = strings.ToUpper(key1) })},
			want:    reconcile.Summary{Records: 1, Charges: 1, Matched: 1},
		},
		{
			name:    "row just inside, provider charge just before the window",
			records: []reconcile.Record{rec(key1, from)},
			charges: []reconcile.Charge{chg(key1, from.Add(-time.Millisecond))},
			want:    reconcile.Summary{Records: 1, Matched: 1},
		},
		{
			name:    "provider charge just inside, row just after the window",
			records: []reconcile.Record{rec(key1, to)},
			charges: []reconcile.Charge{chg(key1, to.Add(-time.Millisecond))},
			want:    reconcile.Summary{Charges: 1, Matched: 1},
		},
		{
			name:    "both sides outside the window are another window's",
			records: []reconcile.Record{rec(key1, to), rec(key2, from.Add(-time.Hour))},
			charges: []reconcile.Charge{chg(key1, to.Add(time.Second)), chg(key2, from.Add(-time.Hour))},
			want:    reconcile.Summary{},
		},
		{
			name:    "a lone side outside the window is another window's",
			records: []reconcile.Record{rec(key1, to)},
			charges: []reconcile.Charge{chg(key2, from.Add(-time.Second))},
			want:    reconcile.Summary{},
		},
		{
			name:    "a second charge under one key",
			records: []reconcile.Record{rec(key1, mid)},
			charges: []reconcile.Charge{
				with(chg(key1, mid), func(c *reconcile.Charge) { c.ID = "ch_first" }),
				chg(key1, mid.Add(time.Minute)),
			},
			want:     reconcile.Summary{Records: 1, Charges: 2, Matched: 1, MissingInDB: 1},
			wantDisc: []string{"missing_in_db"},
		},
		{
			name:    "provider charge without key matches by charge id",
			records: []reconcile.Record{rec(key1, mid)},
			charges: []reconcile.Charge{with(chg(key1, mid), func(c *reconcile.Charge) { c.IdempotencyKey = "" })},
			want:    reconcile.Summary{Records: 1, Charges: 1, Matched: 1},
		},
		{
			name:     "provider charge id recorded under another key",
			records:  []reconcile.Record{with(rec(key1, mid), func(r *reconcile.Record) { r.ProviderChargeID = "ch_0002" })},
			charges:  []reconcile.Charge{chg(key2, mid)},
			want:     reconcile.Summary{Records: 1, Charges: 1, Mismatched: 1},
			wantDisc: []string{"mismatch:idempotencyKey"},
		},
		{
			name:    "the key's owner wins over a charge id match",
			records: []reconcile.Record{rec(key2, mid), with(rec(key1, mid), func(r *reconcile.Record) { r.ProviderChargeID = "ch_0002" })},
			charges: []reconcile.Charge{chg(key2, mid)},
			want:    reconcile.Summary{Records: 2, Charges: 1, Matched: 1, MissingAtProvider: 1},
			// key1's row claims key2's charge, which key2's row owns.
			wantDisc: []string{"missing_at_provider"},
		},
		{
			name:    "charges that did not succeed are not money",
			charges: []reconcile.Charge{with(chg(key1, mid), func(c *reconcile.Charge) { c.Status = "failed" })},
			want:    reconcile.Summary{},
		},
		{
			name:    "window is [from, to)",
			records: []reconcile.Record{rec(key1, from), rec(key2, to)},
			want:    reconcile.Summary{Records: 1, MissingAtProvider: 1},
			// key2 at to belongs to the next window.
			wantDisc: []string{"missing_at_provider"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := reconcile.Compare(win, tt.records, tt.charges)
			if rep.Summary != tt.want {
				t.Errorf("summary = %+v, want %+v", rep.Summary, tt.want)
			}
			var got []string
			for _, d := range rep.Discrepancies {
				s := string(d.Kind)
				if d.Kind == reconcile.Mismatch {
					var fields []string
					for _, f := range d.Diffs {
						fields = append(fields, f.Field)
					}
					s = "mismatch:" + strings.Join(fields, ",")
				}
				got = append(got, s)
			}
			if !slices.Equal(got, tt.wantDisc) {
				t.Errorf("discrepancies = %v, want %v", got, tt.wantDisc)
			}
			if n := rep.Summary.Discrepancies(); n != len(rep.Discrepancies) {
				t.Errorf("summary counts %d discrepancies, the list holds %d", n, len(rep.Discrepancies))
			}
		})
	}
}

func TestWindowValidate(t *testing.T) {
	for _, w := range []reconcile.Window{{}, {From: from}, {From: to, To: from}, {From: from, To: from}} {
		if err := w.Validate(); err == nil {
			t.Errorf("Validate(%v) = nil, want an error", w)
		}
	}
	if err := win.Validate(); err != nil {
		t.Errorf("Validate(%v) = %v", win, err)
	}
}

func TestWriteText(t *testing.T) {
	rep := reconcile.Compare(win,
		[]reconcile.Record{rec(key1, mid), with(rec(key2, mid), func(r *reconcile.Record) { r.Amount = 5 })},
		[]reconcile.Charge{chg(key2, mid), with(chg(key1, mid), func(c *reconcile.Charge) { c.ID, c.IdempotencyKey = "ch_x", "k3" })})
	var b strings.Builder
	if err := reconcile.WriteText(&b, rep); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"matched 0, declined or rejected (not expected at the provider) 0, missing at provider 1, missing in database 1, mismatched 1, pending 0",
		"MISSING AT PROVIDER  event " + key1,
		"MISSING IN DATABASE  key k3",
		"MISMATCH             event " + key2 + "  order 42  charge ch_0002  amount: database 5, provider 1999",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, b.String())
		}
	}
}
