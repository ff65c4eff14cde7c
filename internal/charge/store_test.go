package charge_test

import (
	"strings"
	"testing"

	"github.com/lib/pq"

	"example.com/billing/internal/charge"
	"example.com/billing/internal/testenv/dbtest"
)

// A claim reads the attempts of its orders through indexes, never by
// scanning the whole table: with millions of attempts a scan per claim
// would cost the database more than everything else an event does.
func TestForOrders_ReadsThroughIndexes(t *testing.T) {
	db, _ := dbtest.New(t)
	// Enough rows that the planner would rather not scan, and statistics.
	if _, err := db.Exec(`
INSERT INTO charge (event_id, order_id, customer_id, amount_minor, currency, status, provider_charge_id)
SELECT gen_random_uuid(), i, 1, 100, 'EUR', 'succeeded', 'ch_' || i FROM generate_series(1, 20000) AS i`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`ANALYZE charge`); err != nil {
		t.Fatal(err)
	}
	var plan []string
	if err := db.Select(&plan, `EXPLAIN `+charge.ForOrdersQuery, pq.Int64Array{1, 2, 3}, pq.StringArray{"01938d2e-8a41-7e5c-b3f2-5d0c3a9e7b21"}, charge.Succeeded, charge.Pending, charge.InProgress); err != nil {
		t.Fatal(err)
	}
	if text := strings.Join(plan, "\n"); strings.Contains(text, "Seq Scan") {
		t.Errorf("ForOrders scans the charge table:\n%s", text)
	}
}
