//go:build chaos

package chaos_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/jmoiron/sqlx"

	"example.com/billing/internal/charge"
	"example.com/billing/internal/dev/loadgen"
	"example.com/billing/internal/dlq"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/testenv/kafkatest"
)

// result is what verify measured.
type result struct {
	messages, valid, dups, invalid int
	cross                          int // of dups: copies on another partition
	double, lost, dlqRepark        int
	abortedCharged                 int // phantom events of aborted transactions found (txn streams)
	outcomes, settled              int // distinct outcome events published; settled events
	charges                        int // charges the provider created
}

// position is a message's place in the order topic.
type position struct {
	partition int32
	offset    int64
}

// verify checks the invariants against the provider's books, the database
// and the broker, once every consumer has stopped.
func (r *run) verify() result {
	t := r.t
	msgs := r.stream.messages()
	exp := r.stream.expected
	var res result
	// With seconds, every order has two different events, and one charge.
	seconds := len(r.stream.secondEvents)
	paired := r.stream.seconds
	res.messages = len(msgs)
	res.valid, res.invalid = exp.Unique+seconds, exp.Invalid
	res.dups = len(msgs) - exp.Unique - exp.Invalid - seconds
	for _, m := range msgs {
		if m.cross {
			res.cross++
		}
	}
	if exp.Produced+res.dups-exp.Duplicates+seconds != len(msgs) {
		t.Errorf("acknowledged %d messages, generated %d plus %d cross-partition copies and %d second events", len(msgs), exp.Produced, res.dups-exp.Duplicates, seconds)
	}

	events := map[string]loadgen.Event{}
	for _, ev := range exp.Events {
		events[ev.ID.String()] = ev
	}
	for id, ev := range r.stream.secondEvents {
		events[id] = ev
	}
	declined := func(ev loadgen.Event) bool { return ev.OrderID%declineEvery == 0 }
	wantDeclines := exp.Declined(declineEvery)
	wantKeys := exp.Unique
	if paired {
		// A declined order's second event asks too; a paid one's does not.
		wantKeys += wantDeclines
		wantDeclines *= 2
	}
	// chargedOrders are the orders the provider charged: with seconds, one
	// event of the order is charged and the other is already_charged.
	chargedOrders := map[int64]bool{}
	lost := map[string]string{} // event id -> where it is missing

	// --- The broker: what was published is in the topic, and the group
	// committed all of it.
	end, err := kafka.EndOffsets(r.client, r.topic)
	if err != nil {
		t.Fatalf("end offsets: %v", err)
	}
	committed, err := committedOffsets(r.client, r.group, r.topic)
	if err != nil {
		t.Fatalf("committed offsets: %v", err)
	}
	var total int64
	for p := range int32(partitions) {
		total += end[p]
		if committed[p] != end[p] {
			t.Errorf("partition %d: committed offset %d, end offset %d (skipped or left behind)", p, committed[p], end[p])
		}
	}
	r.mu.Lock()
	extra := append([]*sent(nil), r.extra...)
	r.mu.Unlock()
	res.messages += len(extra)
	res.invalid += len(extra)
	// A transactional stream's topic also holds aborted records and
	// markers: checkTxnLog reads it instead.
	if total != int64(len(msgs)+len(extra)) && r.stream.txn == nil {
		t.Errorf("the topic holds %d messages, %d were acknowledged", total, len(msgs)+len(extra))
	}

	// --- The provider: every valid event charged (or declined) exactly once
	// under its event id, with the exact amount; nothing else.
	st, err := r.psp.stats()
	if err != nil {
		t.Fatalf("provider stats: %v", err)
	}
	charges, err := r.psp.charges()
	if err != nil {
		t.Fatalf("provider charges: %v", err)
	}
	byKey := map[string][]pspCharge{}
	byOrder := map[int64]int{}
	for _, c := range charges {
		byKey[c.IdempotencyKey] = append(byKey[c.IdempotencyKey], c)
		byOrder[c.OrderID]++
		ev, ok := events[c.IdempotencyKey]
		switch {
		case !ok:
			t.Errorf("provider charge %s under key %q (order %d) is not a valid event's: an invalid event reached the provider", c.ID, c.IdempotencyKey, c.OrderID)
		case declined(ev):
			t.Errorf("provider charged order %d, which it should have declined", ev.OrderID)
		case c.OrderID != ev.OrderID || c.CustomerID != ev.CustomerID || c.Amount != ev.Amount.Minor || c.Currency != ev.Amount.Currency:
			t.Errorf("provider charge %s for event %s: order %d customer %d %d %s, want order %d customer %d %d %s",
				c.ID, c.IdempotencyKey, c.OrderID, c.CustomerID, c.Amount, c.Currency, ev.OrderID, ev.CustomerID, ev.Amount.Minor, ev.Amount.Currency)
		}
	}
	for order, n := range byOrder {
		if n > 1 {
			res.double++
			t.Errorf("order %d charged %d times at the provider", order, n)
		}
	}
	if st.OrdersChargedTwice != 0 {
		t.Errorf("provider ordersChargedTwice = %d", st.OrdersChargedTwice)
		res.double = max(res.double, int(st.OrdersChargedTwice))
	}
	for _, c := range charges {
		chargedOrders[c.OrderID] = true
	}
	for id, ev := range events {
		if !declined(ev) && len(byKey[id]) == 0 && (!paired || !chargedOrders[ev.OrderID]) {
			lost[id] = "not charged at the provider"
		}
	}
	res.charges = int(st.ChargesCreated)
	if int(st.ChargesCreated) != exp.Unique-exp.Declined(declineEvery) {
		t.Errorf("provider created %d charges, want %d", st.ChargesCreated, exp.Unique-exp.Declined(declineEvery))
	}
	if int(st.Declines) != wantDeclines {
		t.Errorf("provider declined %d requests, want %d", st.Declines, wantDeclines)
	}
	if int(st.DistinctKeys) != wantKeys {
		t.Errorf("provider holds outcomes of %d keys, want %d (one per charged order, one per declined event)", st.DistinctKeys, wantKeys)
	}
	if st.Mismatches != 0 || st.Unauthorized != 0 {
		t.Errorf("provider saw %d key mismatches, %d unauthorized: want none", st.Mismatches, st.Unauthorized)
	}
	switch kills := r.count("kill-9"); {
	case st.BadRequests > 0 && kills == 0:
		t.Errorf("provider answered %d requests 400: an invalid request reached it", st.BadRequests)
	case st.BadRequests > 0:
		// A process killed while it sent a request leaves the provider a
		// truncated body, which it answers 400 to nobody. A 400 that
		// billing did receive would have parked its event as
		// provider-rejected, which the DLQ check below rejects.
		t.Logf("provider answered %d truncated requests 400 (cut off by kill -9; nobody received the answer)", st.BadRequests)
	}
	t.Logf("provider: %d requests, %d charges, %d declines, %d replays, %d conflicts (409), %d resets, %d down rejections, %d injected 503s",
		st.Requests, st.ChargesCreated, st.Declines, st.Replays, st.Conflicts, st.Resets, st.DownRejections, st.InjectedFailures)

	// --- The database: processed_event holds exactly the valid events, the
	// charge table agrees with the provider.
	db, err := postgres.Open(r.dsn, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	processed := r.checkProcessed(db, events, lost)
	rows, err := charge.Select(context.Background(), db, "")
	if err != nil {
		t.Fatalf("read charge: %v", err)
	}
	rowOf := map[string]bool{}
	succeeded := map[int64]int{}
	for _, row := range rows {
		id := row.EventID.String()
		rowOf[id] = true
		ev, ok := events[id]
		if !ok {
			t.Errorf("charge row for %s, which is not a valid event", id)
			continue
		}
		if row.OrderID != ev.OrderID || row.CustomerID != ev.CustomerID || row.Amount != ev.Amount.Minor || row.Currency != ev.Amount.Currency {
			t.Errorf("charge row of %s: order %d customer %d %d %s, want order %d customer %d %d %s",
				id, row.OrderID, row.CustomerID, row.Amount, row.Currency, ev.OrderID, ev.CustomerID, ev.Amount.Minor, ev.Amount.Currency)
		}
		switch row.Status {
		case charge.Succeeded:
			succeeded[row.OrderID]++
			pc := byKey[id]
			if len(pc) != 1 || row.ProviderChargeID == nil || pc[0].ID != *row.ProviderChargeID {
				t.Errorf("charge row of %s says provider charge %v; the provider has %v", id, row.ProviderChargeID, pc)
			}
		case charge.Declined:
			if !declined(ev) {
				t.Errorf("charge row of %s (order %d) is declined; the provider charges that order", id, ev.OrderID)
			}
		default:
			t.Errorf("charge row of %s has status %q", id, row.Status)
		}
	}
	for order, n := range succeeded {
		if n > 1 {
			res.double++
			t.Errorf("order %d has %d succeeded charge rows", order, n)
		}
	}
	for id, ev := range events {
		if !rowOf[id] && (!paired || declined(ev) || succeeded[ev.OrderID] == 0) {
			lost[id] += "; no charge row"
		}
	}
	var unknown []string
	for id := range byKey {
		if _, ok := events[id]; ok && !rowOf[id] {
			unknown = append(unknown, id)
		}
	}
	if len(unknown) > 0 {
		// A database that lost commits (a failover) forgets hundreds:
		// the count and a few say it.
		sort.Strings(unknown)
		t.Errorf("the provider charged %d events the charge table does not know, e.g. %s", len(unknown), strings.Join(unknown[:min(len(unknown), 10)], ", "))
	}

	// --- The outcome topic: every settled event announced once (by
	// eventId, after dedup), with the right type and amount; nothing else.
	statusOf := map[string]string{}
	for _, row := range rows {
		statusOf[row.EventID.String()] = row.Status
	}
	res.settled = len(rows)
	outcomes, err := r.readTopic(r.outcomeTopic)
	if err != nil {
		t.Fatalf("read the outcome topic: %v", err)
	}
	announced := map[string]string{} // causation id -> outcome eventId
	var unrecorded []string          // causation ids announced without a charge row
	for _, m := range outcomes {
		var o struct {
			EventID     string          `json:"eventId"`
			EventType   string          `json:"eventType"`
			CausationID string          `json:"causationId"`
			OrderID     int64           `json:"orderId"`
			TotalAmount json.RawMessage `json:"totalAmount"`
			Currency    string          `json:"currency"`
		}
		if err := json.Unmarshal(m.Value, &o); err != nil {
			t.Errorf("outcome %d/%d is not JSON: %v", m.Partition, m.Offset, err)
			continue
		}
		if prev, ok := announced[o.CausationID]; ok {
			if prev != o.EventID {
				t.Errorf("order event %s announced twice, as %s and %s", o.CausationID, prev, o.EventID)
			}
			continue // a re-publication: the consumer deduplicates it
		}
		announced[o.CausationID] = o.EventID
		ev, ok := events[o.CausationID]
		status, recorded := statusOf[o.CausationID]
		want := "payment." + status + ".v1"
		switch {
		case !ok:
			t.Errorf("outcome %s for %s, which is not a valid event", o.EventID, o.CausationID)
		case !recorded:
			unrecorded = append(unrecorded, o.CausationID)
		case o.EventType != want:
			t.Errorf("outcome %s of %s is %s, the charge table says %s", o.EventID, o.CausationID, o.EventType, want)
		case o.OrderID != ev.OrderID || string(o.TotalAmount) != ev.Amount.Decimal() || o.Currency != ev.Amount.Currency:
			t.Errorf("outcome %s of %s: order %d %s %s, want order %d %s %s", o.EventID, o.CausationID,
				o.OrderID, o.TotalAmount, o.Currency, ev.OrderID, ev.Amount.Decimal(), ev.Amount.Currency)
		}
	}
	res.outcomes = len(announced)
	if len(unrecorded) > 0 {
		// Outcomes of settles a database that lost commits forgot.
		sort.Strings(unrecorded)
		t.Errorf("%d events announced on %s have no charge row, e.g. %s", len(unrecorded), r.outcomeTopic, strings.Join(unrecorded[:min(len(unrecorded), 10)], ", "))
	}
	for _, row := range rows {
		if _, ok := announced[row.EventID.String()]; !ok {
			t.Errorf("settled event %s (%s) was never announced on %s", row.EventID, row.Status, r.outcomeTopic)
		}
	}

	// --- The dead-letter topic: every invalid message, unchanged, with its
	// reason and origin, and nothing else.
	invalidAt := map[position]*sent{}
	for _, m := range append(msgs, extra...) {
		if m.kind == loadgen.Invalid {
			invalidAt[position{m.partition, m.offset}] = m
		}
	}
	dlqMsgs, err := r.readTopic(r.dlqTopic)
	if err != nil {
		t.Fatalf("read the DLQ: %v", err)
	}
	parked := map[position]int{}
	for _, d := range dlqMsgs {
		reason := kafkatest.Header(d, dlq.HeaderReason)
		part, perr := strconv.ParseInt(kafkatest.Header(d, dlq.HeaderOriginalPartition), 10, 32)
		off, oerr := strconv.ParseInt(kafkatest.Header(d, dlq.HeaderOriginalOffset), 10, 64)
		where := fmt.Sprintf("DLQ message %d/%d", d.Partition, d.Offset)
		if !strings.HasPrefix(reason, "invalid-event: ") {
			t.Errorf("%s: x-dlq-reason %q, want invalid-event: ...", where, reason)
		}
		if got := kafkatest.Header(d, dlq.HeaderOriginalTopic); got != r.topic {
			t.Errorf("%s: x-original-topic %q", where, got)
		}
		if got := kafkatest.Header(d, dlq.HeaderConsumerGroup); got != r.group {
			t.Errorf("%s: x-consumer-group %q", where, got)
		}
		if perr != nil || oerr != nil {
			t.Errorf("%s: x-original-partition/offset unreadable: %v %v", where, perr, oerr)
			continue
		}
		pos := position{int32(part), off}
		orig, ok := invalidAt[pos]
		if !ok {
			t.Errorf("%s: from %d/%d, which is not an invalid message (reason %q)", where, pos.partition, pos.offset, reason)
			continue
		}
		if !bytes.Equal(d.Value, orig.value) || !bytes.Equal(d.Key, orig.key) {
			t.Errorf("%s: key or value differ from the original at %d/%d (%s)", where, pos.partition, pos.offset, orig.defect)
		}
		parked[pos]++
		if parked[pos] > 1 {
			res.dlqRepark++
		}
	}
	var notParked []string
	for pos, m := range invalidAt {
		if parked[pos] == 0 {
			notParked = append(notParked, fmt.Sprintf("%d/%d (%s)", pos.partition, pos.offset, m.defect))
		}
	}
	sort.Strings(notParked)
	if len(notParked) > 0 {
		t.Errorf("%d invalid messages are not in the DLQ: %s", len(notParked), strings.Join(notParked, ", "))
	}
	if res.dlqRepark > 0 {
		// At least once: a consumer that dies (or loses a commit) after the
		// DLQ acknowledged a message and before its offset was committed
		// parks it again. Same bytes, same origin; counted, not an error.
		t.Logf("DLQ: %d messages parked more than once (same origin, same bytes)", res.dlqRepark)
	}

	if tx := r.stream.txn; tx != nil {
		var announcedIDs []string
		for id := range announced {
			announcedIDs = append(announcedIDs, id)
		}
		var rowIDs []string
		for id := range rowOf {
			rowIDs = append(rowIDs, id)
		}
		res.abortedCharged = phantomsFound(tx.phantoms, slices.Collect(maps.Keys(byKey)), processed, rowIDs, announcedIDs)
		if res.abortedCharged > 0 {
			t.Errorf("%d events of aborted transactions were charged, recorded or announced", res.abortedCharged)
		}
		r.figure("events of aborted transactions charged, recorded or announced: %d", res.abortedCharged)
	}

	res.lost = len(lost)
	if len(lost) > 0 {
		ids := make([]string, 0, len(lost))
		for id := range lost {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		if len(ids) > 20 {
			t.Errorf("%d lost events; the first 20:", len(ids))
			ids = ids[:20]
		}
		where := map[string][]string{}
		for _, m := range msgs {
			if m.kind != loadgen.Invalid && len(m.value) > 0 {
				for _, id := range ids {
					if bytes.Contains(m.value, []byte(id)) {
						where[id] = append(where[id], fmt.Sprintf("%d/%d", m.partition, m.offset))
					}
				}
			}
		}
		for _, id := range ids {
			t.Errorf("lost event %s (order %d, at %v): %s", id, events[id].OrderID, where[id], strings.TrimPrefix(lost[id], "; "))
		}
	}
	return res
}

// checkProcessed checks that processed_event holds exactly the valid
// events, each once, records in lost the valid events it lacks, and
// returns the event ids it holds.
func (r *run) checkProcessed(db *sqlx.DB, events map[string]loadgen.Event, lost map[string]string) []string {
	t := r.t
	t.Helper()
	var processed []string
	if err := db.Select(&processed, `SELECT event_id::text FROM processed_event WHERE consumer_group = $1`, r.group); err != nil {
		t.Fatalf("read processed_event: %v", err)
	}
	seen := map[string]bool{}
	for _, id := range processed {
		if seen[id] {
			t.Errorf("processed_event holds %s twice", id)
		}
		seen[id] = true
		if _, ok := events[id]; !ok {
			t.Errorf("processed_event holds %s, which is not a valid event", id)
		}
	}
	for id := range events {
		if !seen[id] {
			lost[id] += "; not in processed_event"
		}
	}
	return processed
}
