package metrics_test

import (
	"math"
	"testing"

	"example.com/billing/internal/metrics"
)

const page = `# TYPE billing_events_total counter
billing_events_total{outcome="charged"} 7
# TYPE billing_db_transaction_seconds histogram
billing_db_transaction_seconds_bucket{phase="claim",le="0.01"} 6
billing_db_transaction_seconds_bucket{phase="claim",le="0.1"} 9
billing_db_transaction_seconds_bucket{phase="claim",le="1"} 10
billing_db_transaction_seconds_bucket{phase="claim",le="+Inf"} 10
billing_db_transaction_seconds_sum{phase="claim"} 0.3
billing_db_transaction_seconds_count{phase="claim"} 10
`

func TestParse(t *testing.T) {
	snap, err := metrics.Parse(page)
	if err != nil {
		t.Fatal(err)
	}
	if got := snap.Values[`billing_events_total{outcome="charged"}`]; got != 7 {
		t.Errorf("counter = %v, want 7", got)
	}
	h, ok := snap.Histograms[`billing_db_transaction_seconds{phase="claim"}`]
	if !ok || h.Count != 10 {
		t.Fatalf("histogram %+v", h)
	}
	tests := []struct {
		name      string
		got, want float64
	}{
		{"Above0.01", h.Above(0.01), 4},
		{"Above1", h.Above(1), 0},
		{"Quantile0.5", h.Quantile(0.5), 0.01 * 5 / 6},
		{"Quantile0.75", h.Quantile(0.75), 0.01 + 0.09*(7.5-6)/3},
	}
	for _, tt := range tests {
		if math.Abs(tt.got-tt.want) > 1e-9 {
			t.Errorf("%s = %v, want %v", tt.name, tt.got, tt.want)
		}
	}
	if lo, up := h.BucketOf(0.95); lo != 0.1 || up != 1 {
		t.Errorf("BucketOf(0.95) = (%v, %v], want (0.1, 1]", lo, up)
	}
	if _, up := (metrics.Histogram{}).BucketOf(0.5); !math.IsNaN(up) {
		t.Errorf("an empty histogram's bucket is %v, want NaN", up)
	}
}
