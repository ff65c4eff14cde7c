package dedup_test

import (
	"context"
	"maps"
	"testing"

	"example.com/billing/internal/dedup"
	"example.com/billing/internal/testenv/dbtest"
)

// Save raises positions, never lowers one (a member whose partition moved
// on saves late), and returns what the database held before: a position
// below what the caller saved last is how a consumer learns that the
// database lost commits.
func TestPositions_SaveRaisesAndReportsWhatWasThere(t *testing.T) {
	db, _ := dbtest.New(t)
	ctx := context.Background()
	p := dedup.NewPositions(db, "billing")
	steps := []struct {
		save, before, after map[int32]int64
	}{
		{save: map[int32]int64{0: 10, 1: 5}, before: map[int32]int64{}, after: map[int32]int64{0: 10, 1: 5}},
		{save: map[int32]int64{0: 20}, before: map[int32]int64{0: 10}, after: map[int32]int64{0: 20, 1: 5}},
		{save: map[int32]int64{0: 15, 1: 7}, before: map[int32]int64{0: 20, 1: 5}, after: map[int32]int64{0: 20, 1: 7}},
	}
	for i, s := range steps {
		before, err := p.Save(ctx, "orders.confirmed", s.save)
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(before, s.before) {
			t.Errorf("step %d: Save returned %v, want %v", i, before, s.before)
		}
		var rows []struct {
			Partition int32 `db:"partition"`
			Next      int64 `db:"next_offset"`
		}
		if err := db.Select(&rows, `SELECT partition, next_offset FROM consumer_position WHERE consumer_group = 'billing' AND topic = 'orders.confirmed'`); err != nil {
			t.Fatal(err)
		}
		got := map[int32]int64{}
		for _, r := range rows {
			got[r.Partition] = r.Next
		}
		if !maps.Equal(got, s.after) {
			t.Errorf("step %d: the database holds %v, want %v", i, got, s.after)
		}
	}
}
