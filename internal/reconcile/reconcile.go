// Package reconcile compares billing's charge table with the payment
// provider's records of a time window, to catch what deduplication cannot:
// a charge lost on either side, or recorded differently on the two sides.
//
// Both sides are matched by the idempotency key, which is the event id: the
// charge table's event_id and the key the provider stored with each charge.
// A charge the provider recorded without a key is matched by its charge id
// instead, which the table keeps as provider_charge_id.
//
// The two sides time a charge differently. The table's created_at is the
// start of the transaction that recorded it, which began before the provider
// call (and, after a lost answer and a retry, possibly long after the
// provider created the charge); the provider's created is when it charged.
// So a pair can straddle the window's edge. A record or charge is "in the
// window" by its own side's time, and its counterpart is looked up outside
// the window too before it is called missing: in the table by key, at any
// time; at the provider within a wider lookup window (Options.Slack).
package reconcile

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"example.com/billing/internal/charge"
	"example.com/billing/internal/payment"
)

// Record is billing's side: one row of the charge table.
type Record struct {
	EventID          string    `json:"eventId"`
	OrderID          int64     `json:"orderId"`
	CustomerID       int64     `json:"customerId"`
	Amount           int64     `json:"amount"` // minor units
	Currency         string    `json:"currency"`
	Status           string    `json:"status"` // one of charge's statuses
	ProviderChargeID string    `json:"providerChargeId,omitempty"`
	CreatedAt        time.Time `json:"createdAt"`
}

// Charge is the provider's side: one charge it created, as the payment
// client lists it.
type Charge = payment.ListedCharge

// Ledger is the provider's record of charges (payment.Client).
//
// Charges returns every charge created in [from, to), in any order. An
// implementation for a provider whose list API pages (Stripe's has_more and
// starting_after) follows the pages itself: the comparison needs the whole
// window, and a caller that got half of it would report the rest as missing.
type Ledger interface {
	Charges(ctx context.Context, from, to time.Time) ([]Charge, error)
}

// Window is the time range [From, To).
type Window struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
}

// Contains reports whether From <= t < To.
func (w Window) Contains(t time.Time) bool { return !t.Before(w.From) && t.Before(w.To) }

// Widen returns the window grown by d on both sides.
func (w Window) Widen(d time.Duration) Window { return Window{From: w.From.Add(-d), To: w.To.Add(d)} }

// Validate rejects an empty or inverted window.
func (w Window) Validate() error {
	if w.From.IsZero() || w.To.IsZero() {
		return fmt.Errorf("window [%s, %s) has an open end", w.From.Format(time.RFC3339), w.To.Format(time.RFC3339))
	}
	if !w.From.Before(w.To) {
		return fmt.Errorf("window [%s, %s) is empty: from must be before to", w.From.Format(time.RFC3339), w.To.Format(time.RFC3339))
	}
	return nil
}

// Kind is the kind of a discrepancy.
type Kind string

const (
	// MissingAtProvider: billing recorded a succeeded charge the provider
	// does not have. The customer was not charged although billing thinks
	// so (or the provider lost it).
	MissingAtProvider Kind = "missing_at_provider"
	// MissingInDB: the provider charged and billing has no record of it —
	// money taken that billing does not know of (a lost row, a charge made
	// outside billing, or a second charge under one key).
	MissingInDB Kind = "missing_in_db"
	// Mismatch: both sides have the charge but disagree on order, customer,
	// amount, currency, status, provider charge id or idempotency key.
	Mismatch Kind = "mismatch"
	// Pending: a charge attempt whose provider answer billing has not
	// recorded, older than the settle margin: maintenance should have
	// completed it. The provider's charge, when it has one, is attached.
	// Past the provider's idempotency window it is never retried blindly
	// and waits for a human.
	Pending Kind = "pending"
)

// Diff is one field on which the two sides of a pair disagree.
type Diff struct {
	Field    string `json:"field"`
	DB       string `json:"db"`
	Provider string `json:"provider"`
}

// Discrepancy is one charge the two sides do not agree on.
type Discrepancy struct {
	Kind Kind `json:"kind"`
	// Key is the idempotency key (the event id) of the charge, or the
	// provider's charge id for a charge it recorded without a key.
	Key    string  `json:"key"`
	Record *Record `json:"record,omitempty"`
	Charge *Charge `json:"charge,omitempty"`
	Diffs  []Diff  `json:"diffs,omitempty"`
	// Note explains what is not obvious from the rest, e.g. a second charge
	// under one key.
	Note string `json:"note,omitempty"`
}

// Summary counts the outcome of a comparison. A pair is counted when either
// of its sides is in the window.
type Summary struct {
	// Records and Charges are the rows and the succeeded provider charges
	// whose own time is in the window.
	Records int `json:"records"`
	Charges int `json:"charges"`
	// Matched pairs agree on every field.
	Matched int `json:"matched"`
	// Declined and Rejected records have no provider charge, as expected.
	Declined          int `json:"declined"`
	Rejected          int `json:"rejected"`
	MissingAtProvider int `json:"missingAtProvider"`
	MissingInDB       int `json:"missingInDb"`
	Mismatched        int `json:"mismatched"`
	// Pending attempts have no recorded answer (see Pending).
	Pending int `json:"pending"`
	// InProgress attempts are payments the provider holds without a
	// verdict billing has recorded yet: billing settles them itself, by
	// the provider's webhook or a lookup, so they are no discrepancy (a
	// charge the provider already made for one is paired with it, not
	// missing in the database).
	InProgress int `json:"inProgress"`
}

// Discrepancies is the number of charges the sides disagree on, or whose
// outcome billing does not know.
func (s Summary) Discrepancies() int {
	return s.MissingAtProvider + s.MissingInDB + s.Mismatched + s.Pending
}

// Report is the result of a reconciliation.
type Report struct {
	Window Window `json:"window"`
	// Lookup is where the provider's side was read: the window widened by
	// the slack, so that a counterpart just outside the window is found.
	Lookup        Window        `json:"lookup"`
	Summary       Summary       `json:"summary"`
	Discrepancies []Discrepancy `json:"discrepancies"`
}

// Compare matches records with charges and reports, for the pairs with a
// side in w, what is missing on either side or differs. records and charges
// may hold more than w: the counterparts found outside it. Compare is pure;
// Reconcile gathers its inputs.
func Compare(w Window, records []Record, charges []Charge) Report {
	rep := Report{Window: w, Lookup: w, Discrepancies: []Discrepancy{}}

	// Only succeeded charges moved money; a provider that also lists failed
	// or pending attempts has nothing there to reconcile.
	succeeded := make([]*Charge, 0, len(charges))
	for i := range charges {
		if charges[i].Status == "" || charges[i].Status == charge.Succeeded {
			succeeded = append(succeeded, &charges[i])
		}
	}
	byKey := map[string][]*Charge{}
	byID := map[string]*Charge{}
	for _, c := range succeeded {
		if k := normKey(c.IdempotencyKey); k != "" {
			byKey[k] = append(byKey[k], c)
		}
		byID[c.ID] = c
	}

	// Pair each record with a charge: by key first, for every record, so
	// that a charge goes to the record that owns its key; then, for the
	// records still alone, by the provider charge id they recorded.
	recs := make([]*Record, len(records))
	for i := range records {
		recs[i] = &records[i]
	}
	pairOf := make(map[*Record]*Charge, len(recs))
	used := map[*Charge]bool{}
	for _, r := range recs {
		cands := byKey[normKey(r.EventID)]
		var pick *Charge
		for _, c := range cands {
			if !used[c] && (pick == nil || (r.ProviderChargeID != "" && c.ID == r.ProviderChargeID)) {
				pick = c
			}
		}
		if pick != nil {
			pairOf[r], used[pick] = pick, true
		}
	}
	for _, r := range recs {
		if pairOf[r] != nil || r.ProviderChargeID == "" {
			continue
		}
		if c := byID[r.ProviderChargeID]; c != nil && !used[c] {
			pairOf[r], used[c] = c, true
		}
	}

	for _, r := range recs {
		if w.Contains(r.CreatedAt) {
			rep.Summary.Records++
		}
		c := pairOf[r]
		if !w.Contains(r.CreatedAt) && (c == nil || !w.Contains(c.Created)) {
			continue // neither side in the window: another window's pair
		}
		if r.Status == charge.InProgress {
			rep.Summary.InProgress++
			continue
		}
		if r.Status == charge.Pending {
			d := Discrepancy{Kind: Pending, Key: r.EventID, Record: r, Charge: c,
				Note: "no charge at the provider under its key"}
			if c != nil {
				d.Note = "the provider charged it; billing has not recorded the answer"
			}
			rep.Summary.Pending++
			rep.Discrepancies = append(rep.Discrepancies, d)
			continue
		}
		if c == nil {
			switch r.Status {
			case charge.Declined:
				rep.Summary.Declined++
				continue
			case charge.Rejected:
				rep.Summary.Rejected++
				continue
			}
			rep.Summary.MissingAtProvider++
			rep.Discrepancies = append(rep.Discrepancies, Discrepancy{Kind: MissingAtProvider, Key: r.EventID, Record: r})
			continue
		}
		if diffs := diff(r, c); len(diffs) > 0 {
			rep.Summary.Mismatched++
			rep.Discrepancies = append(rep.Discrepancies, Discrepancy{Kind: Mismatch, Key: r.EventID, Record: r, Charge: c, Diffs: diffs})
			continue
		}
		rep.Summary.Matched++
	}
	for _, c := range succeeded {
		if !w.Contains(c.Created) {
			continue
		}
		rep.Summary.Charges++
		if used[c] {
			continue
		}
		d := Discrepancy{Kind: MissingInDB, Key: cmp.Or(c.IdempotencyKey, c.ID), Charge: c}
		if n := len(byKey[normKey(c.IdempotencyKey)]); c.IdempotencyKey != "" && n > 1 {
			d.Note = fmt.Sprintf("the provider holds %d charges under this idempotency key", n)
		}
		rep.Summary.MissingInDB++
		rep.Discrepancies = append(rep.Discrepancies, d)
	}

	slices.SortStableFunc(rep.Discrepancies, func(a, b Discrepancy) int {
		return cmp.Or(a.when().Compare(b.when()), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Key, b.Key))
	})
	return rep
}

// when orders discrepancies by time, the table's when it has the row.
func (d Discrepancy) when() time.Time {
	if d.Record != nil {
		return d.Record.CreatedAt
	}
	return d.Charge.Created
}

// diff lists the fields on which a record and its charge disagree.
func diff(r *Record, c *Charge) []Diff {
	var out []Diff
	add := func(field, db, provider string) {
		if db != provider {
			out = append(out, Diff{Field: field, DB: db, Provider: provider})
		}
	}
	// A declined row paired with a succeeded charge: the customer paid for
	// an order billing believes unpaid.
	add("status", r.Status, charge.Succeeded)
	// A provider side that does not tell the order or the customer
	// (Adyen's notifications name a payment by its reference alone) leaves
	// them 0: not compared.
	if c.OrderID != 0 {
		add("orderId", fmt.Sprint(r.OrderID), fmt.Sprint(c.OrderID))
	}
	if c.CustomerID != 0 {
		add("customerId", fmt.Sprint(r.CustomerID), fmt.Sprint(c.CustomerID))
	}
	add("amount", fmt.Sprint(r.Amount), fmt.Sprint(c.Amount))
	add("currency", strings.TrimSpace(r.Currency), c.Currency)
	if r.ProviderChargeID != "" || r.Status == charge.Succeeded {
		add("providerChargeId", r.ProviderChargeID, c.ID)
	}
	if c.IdempotencyKey != "" {
		add("idempotencyKey", normKey(r.EventID), normKey(c.IdempotencyKey))
	}
	return out
}

// normKey makes keys comparable: PostgreSQL prints a uuid in lower case, a
// provider echoes the key as it was sent.
func normKey(k string) string { return strings.ToLower(strings.TrimSpace(k)) }
