//go:build dev

package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/gofrs/uuid/v5"

	"example.com/billing/internal/charge"
	"example.com/billing/internal/config"
	"example.com/billing/internal/dev/loadgen"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/metrics"
)

// The demo's summary: what it measured, each number from the system's own
// records (the broker, the database, the provider, /metrics), against what
// the generator produced.

// demoSummary is what the demo measured, each number from the system's
// own records.
type demoSummary struct {
	produced, dlq                    int64 // broker end offsets
	unique, charged, declined        int   // database
	settledLater                     int   // database: succeeded once the provider's webhook or a lookup said so
	chargedTwiceDB, mismatched       int   // database
	duplicates, alreadyCharged       float64
	providerCharges, chargedTwicePSP int64 // provider
	outcomes                         outcomeCounts
	elapsed                          time.Duration
	// Latency percentiles in seconds: occurredAt → start of the transaction
	// per event from the database, and the buckets of occurredAt → commit
	// in the billing_event_latency_seconds histogram that hold them.
	p50DB, p99DB         float64
	p50Bucket, p99Bucket [2]float64
}

// measure reads the summary from the broker, the database, the provider
// and /metrics.
func (d *demo) measure(ctx context.Context) (demoSummary, error) {
	var s demoSummary
	end, err := kafka.EndOffsets(d.client, d.kafkaCfg.Topic)
	if err != nil {
		return s, fmt.Errorf("demo: read end offsets: %w", err)
	}
	s.produced = sumOffsets(end)
	dlqEnd, err := kafka.EndOffsets(d.client, d.kafkaCfg.DLQTopic)
	if err != nil {
		return s, fmt.Errorf("demo: read dead-letter end offsets: %w", err)
	}
	s.dlq = sumOffsets(dlqEnd)

	counts := []struct {
		dst  *int
		q    string
		args []any
	}{
		{&s.unique, `SELECT count(*) FROM processed_event WHERE consumer_group = $1`, []any{d.kafkaCfg.GroupID}},
		{&s.charged, `SELECT count(*) FROM charge WHERE status = $1`, []any{charge.Succeeded}},
		{&s.declined, `SELECT count(*) FROM charge WHERE status = $1`, []any{charge.Declined}},
		{&s.chargedTwiceDB, `SELECT count(*) FROM (SELECT order_id FROM charge WHERE status = $1
			GROUP BY order_id HAVING count(*) > 1) AS twice`, []any{charge.Succeeded}},
		{&s.settledLater, `SELECT count(*) FROM charge WHERE status = $1 AND deferred`, []any{charge.Succeeded}},
	}
	for _, c := range counts {
		if err := d.db.GetContext(ctx, c.dst, c.q, c.args...); err != nil {
			return s, fmt.Errorf("demo: query database: %w", err)
		}
	}
	// processed_at is now() of the claiming transaction, i.e. its start;
	// the first 48 bits of a UUID v7 are the Unix milliseconds at which the
	// event was created, with its occurredAt.
	const latencyQ = `
SELECT coalesce(percentile_cont(0.50) WITHIN GROUP (ORDER BY ms), 'NaN') / 1000 AS p50,
       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), 'NaN') / 1000 AS p99
FROM (SELECT extract(epoch FROM processed_at) * 1000
             - ('x' || substr(replace(event_id::text, '-', ''), 1, 12))::bit(48)::bigint AS ms
      FROM processed_event WHERE consumer_group = $1) AS latency`
	if err := d.db.QueryRowContext(ctx, latencyQ, d.kafkaCfg.GroupID).Scan(&s.p50DB, &s.p99DB); err != nil {
		return s, fmt.Errorf("demo: query latency: %w", err)
	}
	s.mismatched, err = d.mismatchedCharges(ctx)
	if err != nil {
		return s, err
	}

	snap, err := metrics.Scrape(ctx, "http://"+d.httpAddr+"/metrics")
	if err != nil {
		return s, fmt.Errorf("demo: read /metrics: %w", err)
	}
	s.duplicates = snap.Values[`billing_events_total{outcome="duplicate"}`]
	s.alreadyCharged = snap.Values[`billing_events_total{outcome="already_charged"}`]
	latency := snap.Histograms["billing_event_latency_seconds"]
	s.p50Bucket[0], s.p50Bucket[1] = latency.BucketOf(0.50)
	s.p99Bucket[0], s.p99Bucket[1] = latency.BucketOf(0.99)

	st := d.psp.Stats()
	s.providerCharges, s.chargedTwicePSP = st.ChargesCreated, st.OrdersChargedTwice
	switch d.opts.provider {
	case config.ProviderStripe:
		s.providerCharges = st.Stripe.Succeeded + st.Stripe.ProcessingSucceeded
	case config.ProviderAdyen:
		s.providerCharges = st.Adyen.Authorised + st.Adyen.PendingAuthorised
	}
	if s.outcomes, err = d.countOutcomes(ctx); err != nil {
		return s, err
	}
	s.elapsed = d.finished.Sub(d.began)
	return s, nil
}

// mismatchedCharges counts the generated valid events whose charge row is
// missing or differs from the event (order, customer, amount, currency),
// plus charge rows of events that were never generated.
func (d *demo) mismatchedCharges(ctx context.Context) (int, error) {
	rows, err := charge.Select(ctx, d.db, "")
	if err != nil {
		return 0, fmt.Errorf("demo: charges: %w", err)
	}
	want := make(map[uuid.UUID]loadgen.Event, len(d.exp.Events))
	for _, ev := range d.exp.Events {
		want[ev.ID] = ev
	}
	bad := 0
	for _, r := range rows {
		ev, ok := want[r.EventID]
		delete(want, r.EventID)
		if !ok || ev.OrderID != r.OrderID || ev.CustomerID != r.CustomerID ||
			ev.Amount.Minor != r.Amount || ev.Amount.Currency != r.Currency {
			bad++
		}
	}
	return bad + len(want), nil
}

// demoExpected is what the generator's events must come to with the
// demo's provider.
type demoExpected struct {
	loadgen.Expected
	// declined, and settledLater: the charges the provider answered
	// processing, settled by its webhook.
	declined, settledLater int
}

// expect is what the events generated must come to: the contract declines
// by order id, the fake Stripe and Adyen by the customer's saved card
// (demoCardOf).
func (d *demo) expect() demoExpected {
	e := demoExpected{Expected: d.exp}
	if d.opts.provider == config.ProviderContract {
		e.declined = d.exp.Declined(d.opts.declineEvery)
		return e
	}
	for _, ev := range d.exp.Events {
		switch demoCardOf(ev.CustomerID, d.opts.declineEvery) {
		case cardDeclines:
			e.declined++
		case cardLater:
			e.settledLater++
		}
	}
	return e
}

// print writes the summary table and the verdict, and returns the number of
// rows that differ from the expectation.
func (s demoSummary) print(w io.Writer, exp demoExpected) int {
	declined := exp.declined
	charged := exp.Unique - declined
	rows := []struct {
		what, source string
		got, want    int64
	}{
		{"events published", "broker: end offsets", s.produced, int64(exp.Produced)},
		{"unique events processed", "database: processed_event", int64(s.unique), int64(exp.Unique)},
		{"charged", "database: charge succeeded", int64(s.charged), int64(charged)},
		{"declined by the provider", "database: charge declined", int64(s.declined), int64(declined)},
		{"charged once the provider said so", "database: charge succeeded, deferred", int64(s.settledLater), int64(exp.settledLater)},
		{"duplicates skipped", "/metrics: outcome=duplicate", int64(s.duplicates), int64(exp.Duplicates)},
		{"second events for a paid order", "/metrics: outcome=already_charged", int64(s.alreadyCharged), 0},
		{"sent to the dead-letter topic", "broker: DLQ end offsets", s.dlq, int64(exp.Invalid)},
		{"provider charges created", "provider: /_stats", s.providerCharges, int64(charged)},
		{"charge rows unlike their event", "database vs generated events", int64(s.mismatched), 0},
		{"orders charged twice (database)", "database: charge", int64(s.chargedTwiceDB), 0},
		{"orders charged twice (provider)", "provider: /_stats", s.chargedTwicePSP, 0},
		// Every settled event is announced once: charged + declined + failed
		// (the mix has no decoded event to park as failed).
		{"outcome events published", "broker: payments.settled, distinct", int64(s.outcomes.distinct), int64(charged + declined)},
		{"outcome events unlike their charge", "broker vs database: charge", int64(s.outcomes.unlike), 0},
	}
	fmt.Fprintf(w, "\n%-34s %9s %9s   %s\n", "", "measured", "expected", "measured from")
	failures := 0
	var differ []string
	for _, r := range rows {
		mark := ""
		if r.got != r.want {
			mark = "   <-- differs"
			failures++
			differ = append(differ, r.what)
		}
		fmt.Fprintf(w, "%-34s %9d %9d   %s%s\n", r.what, r.got, r.want, r.source, mark)
	}
	fmt.Fprintln(w)
	secs := s.elapsed.Seconds()
	fmt.Fprintf(w, "throughput   %.0f events/s (%d events from the first published to the last finished, in %.2fs)\n",
		float64(exp.Produced)/secs, exp.Produced, secs)
	fmt.Fprintf(w, "latency      p50 %s, p99 %s: occurredAt -> start of the event's transaction, per event,\n", seconds(s.p50DB), seconds(s.p99DB))
	fmt.Fprintln(w, "             from the database (processed_at minus the time in the UUID v7 eventId)")
	fmt.Fprintf(w, "             p50 in %s, p99 in %s: occurredAt -> commit, the buckets of\n",
		bucketText(s.p50Bucket[0], s.p50Bucket[1]), bucketText(s.p99Bucket[0], s.p99Bucket[1]))
	fmt.Fprintln(w, "             /metrics billing_event_latency_seconds that hold them")
	fmt.Fprintln(w, "             (all events are published at once: latency is mostly waiting in the backlog)")
	fmt.Fprintln(w)
	if failures == 0 {
		fmt.Fprintf(w, "PASS: all %d events accounted for: %d charged once each, %d declined, %d duplicates skipped, %d dead-lettered; no order charged twice; %d outcome events published.\n",
			exp.Produced, charged, declined, exp.Duplicates, exp.Invalid, charged+declined)
	} else {
		fmt.Fprintf(w, "FAIL: %s differ from what was produced.\n", strings.Join(differ, ", "))
	}
	return failures
}

func seconds(s float64) string {
	switch {
	case math.IsNaN(s):
		return "n/a"
	case s < 1:
		return fmt.Sprintf("%.0fms", s*1000)
	}
	return fmt.Sprintf("%.2fs", s)
}

// metricsSnapshot is one scrape of /metrics.
// bucketText writes a bucket as an interval, e.g. "(1s, 2.5s]".
func bucketText(lower, upper float64) string {
	switch {
	case math.IsNaN(upper):
		return "n/a"
	case math.IsInf(upper, 1):
		return "> " + bound(lower)
	}
	return "(" + bound(lower) + ", " + bound(upper) + "]"
}

// bound writes a bucket bound (seconds) briefly: 0, 250ms, 2.5s.
func bound(s float64) string {
	switch {
	case s == 0:
		return "0"
	case s < 1:
		return strconv.FormatFloat(s*1000, 'g', -1, 64) + "ms"
	}
	return strconv.FormatFloat(s, 'g', -1, 64) + "s"
}
