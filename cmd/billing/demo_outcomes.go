//go:build dev

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"example.com/billing/internal/charge"
	"example.com/billing/internal/dev/embeddedkafka"
	"example.com/billing/internal/order"
)

// outcomeCounts is what the demo reads back from the outcome topic.
type outcomeCounts struct {
	// distinct is the number of distinct outcome eventIds published:
	// publication is at least once, so a consumer counts each id once.
	distinct int
	// unlike counts the published outcomes whose type or amount disagree
	// with the charge table's record of their order event, plus the settled
	// charges without an outcome.
	unlike int
}

// waitPublished waits until the outbox relay has published every outcome
// recorded (the outbox has no unpublished row).
func (d *demo) waitPublished(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		// A payment the provider decides later (in_progress) is settled by
		// its webhook after its message was committed; its outcome is
		// recorded then.
		var open, waiting int
		if err := d.db.GetContext(ctx, &open, `SELECT count(*) FROM charge WHERE status IN ($1, $2)`, charge.Pending, charge.InProgress); err != nil {
			return fmt.Errorf("demo: read the charge table: %w", err)
		}
		if err := d.db.GetContext(ctx, &waiting, `SELECT count(*) FROM outbox WHERE published_at IS NULL`); err != nil {
			return fmt.Errorf("demo: read the outbox: %w", err)
		}
		if open == 0 && waiting == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: %d charge attempts still open and %d payment outcome events still unpublished after 30s (logs in %s)", open, waiting, d.opts.logPath)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// countOutcomes reads every outcome event on the outcome topic and checks
// it against the charge table: succeeded and declined charges each have one,
// with the charge's amount.
func (d *demo) countOutcomes(ctx context.Context) (outcomeCounts, error) {
	var c outcomeCounts
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	msgs, err := embeddedkafka.ReadTopic(ctx, d.client, d.kafkaCfg.OutcomeTopic)
	if err != nil {
		return c, err
	}
	type outcome struct {
		EventID     string          `json:"eventId"`
		EventType   string          `json:"eventType"`
		CausationID string          `json:"causationId"`
		TotalAmount json.RawMessage `json:"totalAmount"`
	}
	byCause := map[string]outcome{}
	seen := map[string]bool{}
	for _, m := range msgs {
		var o outcome
		if err := json.Unmarshal(m.Value, &o); err != nil {
			c.unlike++
			continue
		}
		if seen[o.EventID] {
			continue
		}
		seen[o.EventID] = true
		byCause[o.CausationID] = o
	}
	c.distinct = len(seen)

	rows, err := charge.Select(ctx, d.db, `WHERE status IN ($1, $2)`, charge.Succeeded, charge.Declined)
	if err != nil {
		return c, fmt.Errorf("demo: settled charges: %w", err)
	}
	for _, r := range rows {
		o, ok := byCause[r.EventID.String()]
		want := "payment." + r.Status + ".v1"
		if !ok || o.EventType != want || !sameAmount(string(o.TotalAmount), r.Amount, r.Currency) {
			c.unlike++
		}
	}
	return c, nil
}

// sameAmount reports whether the JSON number text is amount minor units of
// currency, written with exactly the currency's digits.
func sameAmount(text string, minor int64, currency string) bool {
	return order.Money{Minor: minor, Currency: currency}.Decimal() == text
}
