package billing_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"example.com/billing/internal/billing"
	"example.com/billing/internal/dev/fakepsp"
)

// An event left pending is counted as a retry by the cause of its failure,
// where billing decided it: the provider's (payment) or the database's.
// Its Retry-After travels in the error (payment.TransientError.RetryAfter)
// for the consumer's backoff.
func TestProcess_RetriesAreCountedByCause(t *testing.T) {
	f := newFixture(t, fakepsp.Options{FailRate: 1})
	_, a := newEvent(t, 1, time.Now())
	if res, _ := f.proc.Process(context.Background(), messages(a)); res[0].Outcome != billing.Pending {
		t.Fatalf("during the provider's outage: %v, want pending", res[0].Outcome)
	}
	if got := testutil.ToFloat64(f.m.Retries.WithLabelValues("payment")); got != 1 {
		t.Errorf("billing_retries_total{cause=payment} = %v, want 1", got)
	}
	f.db.Close()
	if res, _ := f.proc.Process(context.Background(), messages(a)); res[0].Outcome != billing.Pending {
		t.Fatalf("without a database: %v, want pending", res[0].Outcome)
	}
	if got := testutil.ToFloat64(f.m.Retries.WithLabelValues("database")); got != 1 {
		t.Errorf("billing_retries_total{cause=database} = %v, want 1", got)
	}
}
