package billing

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// The provider's requests run on at most limit goroutines, in the order
// they came, and every one runs; without a limit none waits.
func TestCallers_RunAtMostLimitInOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		limit, jobs int
		wantMax     int
	}{
		{"limit 3", 3, 20, 3},
		{"limit 1", 1, 5, 1},
		{"no limit", 0, 20, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := &callers{limit: tc.limit}
			var (
				mu               sync.Mutex
				started          []int
				running, highest int
			)
			release := make(chan struct{})
			var done sync.WaitGroup
			done.Add(tc.jobs)
			for i := range tc.jobs {
				c.do(func() {
					mu.Lock()
					started = append(started, i)
					running++
					highest = max(highest, running)
					mu.Unlock()
					<-release
					mu.Lock()
					running--
					mu.Unlock()
					done.Done()
				})
			}
			// Let the first wave start, then answer one request at a time.
			waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(started) == tc.wantMax })
			for k := range tc.jobs {
				release <- struct{}{}
				// The one answered takes the next waiting, before another is answered.
				want := min(tc.jobs, tc.wantMax+k+1)
				waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(started) == want })
			}
			done.Wait()
			if highest != tc.wantMax {
				t.Errorf("at most %d ran at once, want %d", highest, tc.wantMax)
			}
			if tc.limit > 0 && !slices.IsSorted(started[tc.limit:]) {
				t.Errorf("requests beyond the limit ran in the order %v, want the order they came", started[tc.limit:])
			}
			if len(started) != tc.jobs {
				t.Errorf("%d of %d ran", len(started), tc.jobs)
			}
			waitFor(t, func() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.running == 0 && c.waiting == nil })
		})
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}
