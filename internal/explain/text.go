package explain

import (
	"cmp"
	"fmt"
	"io"
	"strings"
	"time"

	"example.com/billing/internal/charge"
	"example.com/billing/internal/dlq/reason"
)

// summary says in one line what became of ev.
func summary(ev *Event, horizon time.Time) string {
	var s string
	a := ev.Attempt
	switch {
	case a != nil && a.Status == charge.Succeeded:
		s = fmt.Sprintf("charged %s %s (provider %s)", a.Amount, a.Currency, a.ProviderChargeID)
		if a.SettledAt != nil {
			s += " at " + stamp(*a.SettledAt)
		}
	case a != nil && a.Status == charge.Declined:
		s = "declined, not charged"
		if a.DeclineCode != "" {
			s += " (" + a.DeclineCode + ")"
		}
	case a != nil && a.Status == charge.Rejected:
		s = "not charged: its request was refused or not sent (rejected)"
	case a != nil && a.Status == charge.Pending:
		s = fmt.Sprintf("not decided: its attempt is pending since %s, no answer recorded (requests sent: %d)", stamp(a.CreatedAt), a.Requests)
	case a != nil && a.Status == charge.InProgress:
		s = fmt.Sprintf("not decided: the provider holds its payment %s without a verdict since %s", cmp.Or(a.ProviderChargeID, "(no id)"), stamp(a.CreatedAt))
	case ev.Waiting != nil:
		s = fmt.Sprintf("not decided: it waits for order %d's payment in progress", ev.Waiting.OrderID)
	case ev.ChargedBy != nil && len(ev.Claims) > 0:
		s = fmt.Sprintf("not charged: its order was charged by event %s (already charged)", ev.ChargedBy)
	case len(ev.Parkings) > 0:
		s = "parked (" + string(reason.Parse(ev.Parkings[len(ev.Parkings)-1].Reason).Code) + "), not charged"
	case len(ev.Claims) > 0:
		s = "claimed, with no attempt of its own"
	default:
		s = "billing recorded nothing of it"
		if ev.Created != nil && !horizon.IsZero() && ev.Created.Before(horizon) {
			s += fmt.Sprintf(" (its day is before the dedup store's memory, which starts %s)", horizon.Format(time.DateOnly))
		}
	}
	var copies []string
	if n := len(ev.Reads); n > 1 {
		copies = append(copies, "read "+times(n))
	}
	if n := len(ev.Parkings); n > 0 {
		copies = append(copies, "parked "+times(n))
	}
	replays := 0
	for _, r := range ev.Reads {
		if r.ReplayedFrom != "" {
			replays++
		}
	}
	if replays > 0 {
		copies = append(copies, "replayed "+times(replays))
	}
	if len(copies) > 0 {
		s += "; " + strings.Join(copies, ", ")
	}
	return s
}

// WriteText writes st for a human.
func WriteText(w io.Writer, st Story) error {
	p := &printer{w: w}
	if st.OrderID != 0 && st.Subject == fmt.Sprint(st.OrderID) {
		p.line("order %d: %d events", st.OrderID, len(st.Events))
	}
	for _, ev := range st.Events {
		p.event(ev, len(st.Searches) > 0)
	}
	p.line("operator actions:")
	if len(st.Actions) == 0 {
		p.line("  none")
	}
	for _, a := range st.Actions {
		p.line("  %s", strings.ReplaceAll(a.Text(), "\n", "\n  "))
	}
	p.line("kafka searches:")
	if len(st.Searches) == 0 {
		p.line("  none")
	}
	for _, s := range st.Searches {
		p.search(s)
	}
	if len(st.Notes) > 0 {
		p.line("notes:")
		for _, n := range st.Notes {
			p.line("  %s", n)
		}
	}
	return p.err
}

// printer writes lines and keeps the first error.
type printer struct {
	w   io.Writer
	err error
}

func (p *printer) line(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format+"\n", args...)
	}
}

// event writes ev; searched says whether Kafka was searched at all.
func (p *printer) event(ev Event, searched bool) {
	p.line("event %s: %s", ev.EventID, ev.Summary)
	if ev.Created != nil {
		p.line("  created   %s (the time in its id)", stamp(*ev.Created))
	}
	for _, r := range ev.Reads {
		s := fmt.Sprintf("  read      %s/%d@%d at %s, key %q", r.Topic, r.Partition, r.Offset, stamp(r.Timestamp), r.Key)
		if r.ReplayedFrom != "" {
			s += ", republished from the dead-letter topic's " + r.ReplayedFrom
			if r.ReplayAction != 0 {
				s += fmt.Sprintf(" by operator action #%d", r.ReplayAction)
			}
		}
		p.line("%s", s)
	}
	switch {
	case len(ev.Reads) > 0:
	case searched:
		p.line("  read      not found on the order topic within the searches' bounds (below)")
	default:
		p.line("  read      unknown: Kafka was not searched")
	}
	for _, c := range ev.Claims {
		p.line("  claimed   by %s at %s (claim protocol %d)", c.Group, stamp(c.ProcessedAt), c.ClaimedWith)
	}
	if len(ev.Claims) == 0 {
		p.line("  claimed   no record in processed_event")
	}
	if a := ev.Attempt; a != nil {
		p.line("  attempt   %s: %s %s, order %d, customer %d; requests sent: %d", a.Status, a.Amount, a.Currency, a.OrderID, a.CustomerID, a.Requests)
		var ids []string
		for _, f := range []struct{ name, v string }{{"provider", a.ProviderChargeID}, {"decline code", a.DeclineCode},
			{"customer ref", a.CustomerRef}, {"payment method", a.PaymentMethodRef}, {"counted by", a.CountedBy}} {
			if f.v != "" {
				ids = append(ids, f.name+" "+f.v)
			}
		}
		if len(ids) > 0 {
			p.line("            %s", strings.Join(ids, "; "))
		}
		times := fmt.Sprintf("created %s, updated %s", stamp(a.CreatedAt), stamp(a.UpdatedAt))
		if a.SettledAt != nil {
			times += ", settled " + stamp(*a.SettledAt)
		}
		if a.ResolveAt != nil {
			times += ", next lookup " + stamp(*a.ResolveAt)
		}
		p.line("            %s", times)
		var flags []string
		if a.Deferred {
			flags = append(flags, "deferred (its message was finished before its outcome)")
		}
		if a.Indeterminate > 0 {
			flags = append(flags, fmt.Sprintf("%d answers without a verdict", a.Indeterminate))
		}
		if len(flags) > 0 {
			p.line("            %s", strings.Join(flags, "; "))
		}
		if a.LastError != "" {
			p.line("            last error: %s", a.LastError)
		}
	}
	if w := ev.Waiting; w != nil {
		p.line("  waiting   since %s for order %d's payment in progress", stamp(w.CreatedAt), w.OrderID)
	}
	for _, pk := range ev.Parkings {
		p.line("  parked    %s/%d@%d at %s: %s (read at %s by %s)", pk.Topic, pk.Partition, pk.Offset, stamp(pk.Timestamp), pk.Reason, pk.Original, pk.Group)
	}
	for _, o := range ev.Outcomes {
		s := fmt.Sprintf("  outcome   %s %s recorded %s", o.Type, o.EventID, stamp(o.OccurredAt))
		for _, f := range []struct{ name, v string }{{"provider", o.ProviderID}, {"decline code", o.DeclineCode}, {"reason", o.Reason}} {
			if f.v != "" {
				s += ", " + f.name + " " + f.v
			}
		}
		switch o.State {
		case Published:
			s += fmt.Sprintf(": published %s/%d@%d at %s", o.Read.Topic, o.Read.Partition, o.Read.Offset, stamp(o.Read.Timestamp))
		case InOutbox:
			s += fmt.Sprintf(": in the outbox, not published yet (%d tries)", o.Attempts)
		case Dead:
			s += ": dead, never published"
		}
		if o.LastError != "" && o.State != Published {
			s += "; last error: " + o.LastError
		}
		p.line("%s", s)
	}
	if len(ev.Outcomes) == 0 {
		p.line("  outcome   none in the outbox or found on the outcome topic")
	}
	for _, n := range ev.Notified {
		p.line("  notified  %s %s %s at %s, received %s", n.PaymentRef, n.Status, n.Amount, stamp(n.CreatedAt), stamp(n.ReceivedAt))
	}
}

func (p *printer) search(s Search) {
	window := "from " + stamp(s.From)
	if s.To != nil {
		window += " to " + stamp(*s.To)
	} else {
		window += " to the end"
	}
	parts := make([]string, len(s.Partitions))
	for i, n := range s.Partitions {
		parts[i] = fmt.Sprint(n)
	}
	result := fmt.Sprintf("%d read, %d found", s.Read, s.Found)
	switch {
	case s.Err != "":
		result = "failed: " + s.Err
	case s.Found == 0 && s.Stopped != "":
		result += " (stopped: " + s.Stopped + "; nothing found within what was read)"
	case s.Found == 0:
		result += " (nothing found within these bounds)"
	case s.Stopped != "":
		result += " (stopped: " + s.Stopped + ")"
	}
	p.line("  %s, %s: partitions [%s] %s: %s", s.Topic, s.For, strings.Join(parts, " "), window, result)
}

// times is n as a count of occurrences: once, twice, 3 times.
func times(n int) string {
	switch n {
	case 1:
		return "once"
	case 2:
		return "twice"
	}
	return fmt.Sprintf("%d times", n)
}

// stamp writes t in UTC, to the millisecond.
func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }
