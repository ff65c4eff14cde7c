package dlq_test

import (
	"testing"

	"example.com/billing/internal/dlq"
)

// A replay's plan covers the parked messages of its ranges, of its code
// when it has one: billing explain tells by it which replay republished a
// message.
func TestPlan_Covers(t *testing.T) {
	plan := dlq.Plan{Code: "provider-rejected", Ranges: map[int32]dlq.Range{0: {From: 3, To: 7}}}
	all := dlq.Plan{Ranges: plan.Ranges}
	tests := []struct {
		name      string
		plan      dlq.Plan
		partition int32
		offset    int64
		why       string
		want      bool
	}{
		{"OK_First", plan, 0, 3, "provider-rejected: 422", true},
		{"OK_Last", plan, 0, 6, "provider-rejected: 422", true},
		{"OK_AnyCode", all, 0, 4, "invalid-event: bad JSON", true},
		{"Before", plan, 0, 2, "provider-rejected: 422", false},
		{"AtTheEnd", plan, 0, 7, "provider-rejected: 422", false},
		{"OtherPartition", plan, 1, 4, "provider-rejected: 422", false},
		{"OtherCode", plan, 0, 4, "invalid-event: bad JSON", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.plan.Covers(tt.partition, tt.offset, tt.why); got != tt.want {
				t.Errorf("Covers(%d, %d, %q) = %v, want %v", tt.partition, tt.offset, tt.why, got, tt.want)
			}
		})
	}
}
