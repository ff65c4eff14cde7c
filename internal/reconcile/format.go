package reconcile

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

// WriteJSON writes rep as one JSON document.
func WriteJSON(w io.Writer, rep Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// WriteText writes rep for a human: the window, the summary, then one line
// per discrepancy.
func WriteText(w io.Writer, rep Report) error {
	s := rep.Summary
	var b strings.Builder
	fmt.Fprintf(&b, "window   %s .. %s (provider read %s .. %s)\n",
		ts(rep.Window.From), ts(rep.Window.To), ts(rep.Lookup.From), ts(rep.Lookup.To))
	fmt.Fprintf(&b, "in window: %d charge rows, %d provider charges\n", s.Records, s.Charges)
	fmt.Fprintf(&b, "matched %d, declined or rejected (not expected at the provider) %d, missing at provider %d, missing in database %d, mismatched %d, pending %d, in progress (settled by billing later) %d\n",
		s.Matched, s.Declined+s.Rejected, s.MissingAtProvider, s.MissingInDB, s.Mismatched, s.Pending, s.InProgress)
	for _, d := range rep.Discrepancies {
		switch d.Kind {
		case MissingAtProvider:
			r := d.Record
			fmt.Fprintf(&b, "MISSING AT PROVIDER  event %s  order %d  %d %s  charge %s  recorded %s\n",
				r.EventID, r.OrderID, r.Amount, strings.TrimSpace(r.Currency), orNone(r.ProviderChargeID), ts(r.CreatedAt))
		case MissingInDB:
			c := d.Charge
			fmt.Fprintf(&b, "MISSING IN DATABASE  key %s  order %d  %d %s  charge %s  created %s",
				orNone(c.IdempotencyKey), c.OrderID, c.Amount, c.Currency, c.ID, ts(c.Created))
			if d.Note != "" {
				fmt.Fprintf(&b, "  (%s)", d.Note)
			}
			b.WriteString("\n")
		case Pending:
			r := d.Record
			fmt.Fprintf(&b, "PENDING              event %s  order %d  %d %s  attempt of %s  (%s)\n",
				r.EventID, r.OrderID, r.Amount, strings.TrimSpace(r.Currency), ts(r.CreatedAt), d.Note)
		case Mismatch:
			parts := make([]string, len(d.Diffs))
			for i, f := range d.Diffs {
				parts[i] = fmt.Sprintf("%s: database %s, provider %s", f.Field, orNone(f.DB), orNone(f.Provider))
			}
			fmt.Fprintf(&b, "MISMATCH             event %s  order %d  charge %s  %s\n",
				d.Key, d.Record.OrderID, d.Charge.ID, strings.Join(parts, "; "))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func ts(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
