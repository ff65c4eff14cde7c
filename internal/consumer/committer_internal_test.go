package consumer

// An internal test: tracker is unexported, and it is the piece that decides
// how far a partition may be marked, so it is tested on its own.

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// mark is what finish returned.
type mark struct {
	next int64
	ok   bool
}

// none is finish's answer when nothing new became committable.
var none = mark{}

func TestTracker_Finish(t *testing.T) {
	t.Parallel()
	type step struct {
		finish int64
		want   mark
	}
	tests := []struct {
		name           string
		added          []int64
		steps          []step
		wantUnfinished int
	}{
		{"OK_InOrder", []int64{0, 1, 2, 3}, []step{
			{0, mark{1, true}}, {1, mark{2, true}}, {2, mark{3, true}}, {3, mark{4, true}},
		}, 0},
		{"OK_Reverse", []int64{0, 1, 2, 3}, []step{
			{3, none}, {2, none}, {1, none}, {0, mark{4, true}},
		}, 0},
		{"OK_HeadLast", []int64{10, 11, 12, 13, 14}, []step{
			{12, none}, {14, none}, {11, none}, {13, none}, {10, mark{15, true}},
		}, 0},
		{"OK_PrefixThenHole", []int64{0, 1, 2, 3, 4}, []step{
			{1, none}, {0, mark{2, true}}, {3, none}, {4, none}, {2, mark{5, true}},
		}, 0},
		{"OK_HoleStaysUnmarked", []int64{0, 1, 2, 3, 4}, []step{
			{0, mark{1, true}}, {2, none}, {3, none}, {4, none},
		}, 4},
		// Compaction and transaction markers leave gaps: the next offset to
		// read after 4 is 5 even though 5 does not exist.
		{"OK_GapsInOrder", []int64{3, 4, 7, 9}, []step{
			{3, mark{4, true}}, {4, mark{5, true}}, {7, mark{8, true}}, {9, mark{10, true}},
		}, 0},
		{"OK_GapsOutOfOrder", []int64{3, 4, 7, 9}, []step{
			{7, none}, {3, mark{4, true}}, {9, none}, {4, mark{10, true}},
		}, 0},
		{"OK_GapsHeadLast", []int64{3, 4, 7, 9}, []step{
			{9, none}, {7, none}, {4, none}, {3, mark{10, true}},
		}, 0},
		{"OK_UnknownOffsetsIgnored", []int64{3, 4, 7, 9}, []step{
			{5, none},   // in a gap
			{2, none},   // before the first
			{100, none}, // after the last
			{3, mark{4, true}},
			{3, none}, // already marked
			{6, none}, // in a gap, after the head moved
			{4, mark{5, true}},
		}, 2},
		{"OK_FinishTwiceBeforeHead", []int64{0, 1, 2}, []step{
			{1, none}, {1, none}, {0, mark{2, true}}, {2, mark{3, true}},
		}, 0},
		{"OK_NothingTaken", nil, []step{{0, none}, {42, none}}, 0},
		{"OK_NegativeUnknown", []int64{0}, []step{{-1, none}, {0, mark{1, true}}}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var tr tracker
			for _, o := range tt.added {
				tr.add(o)
			}
			for i, s := range tt.steps {
				next, ok := tr.finish(s.finish)
				if got := (mark{next, ok}); got != s.want {
					t.Errorf("step %d: finish(%d) = %+v, want %+v", i, s.finish, got, s.want)
				}
			}
			if got := tr.unfinished(); got != tt.wantUnfinished {
				t.Errorf("unfinished() = %d, want %d", got, tt.wantUnfinished)
			}
		})
	}
}

// model is the obvious, slow tracker: the finished set and the first offset
// not yet finished.
type model struct {
	taken    []int64
	finished map[int64]bool
	marked   int // taken[:marked] are committable
}

func (m *model) finish(o int64) mark {
	if !slices.Contains(m.taken[m.marked:], o) || m.finished[o] {
		return none
	}
	m.finished[o] = true
	start := m.marked
	for m.marked < len(m.taken) && m.finished[m.taken[m.marked]] {
		m.marked++
	}
	if m.marked == start {
		return none
	}
	return mark{m.taken[m.marked-1] + 1, true}
}

// TestTracker_AgainstModel adds and finishes many offsets, with gaps and in
// random order, and compares every answer with the model. The volume makes
// the tracker compact its slice many times while offsets are pending.
func TestTracker_AgainstModel(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		total   int
		window  int // most offsets pending at once
		gapEvry int // every gapEvry-th offset is missing (0: none)
	}{
		{"OK_SmallWindow", 5000, 8, 0},
		{"OK_WideWindow", 5000, 700, 0},
		{"OK_WholeRangeAtOnce", 3000, 3000, 0},
		{"OK_WithGaps", 6000, 300, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(1, uint64(tt.total+tt.window)))
			var tr tracker
			m := model{finished: map[int64]bool{}}
			var pending []int64
			next := int64(100)
			taken := 0
			for taken < tt.total || len(pending) > 0 {
				// Take up to the window, then finish a random pending one.
				for taken < tt.total && len(pending) < tt.window {
					if tt.gapEvry > 0 && next%int64(tt.gapEvry) == 0 {
						next++ // compacted away
					}
					tr.add(next)
					m.taken = append(m.taken, next)
					pending = append(pending, next)
					next++
					taken++
				}
				i := rng.IntN(len(pending))
				o := pending[i]
				pending = slices.Delete(pending, i, i+1)
				if rng.IntN(10) == 0 { // now and then an offset that was never taken
					if n, ok := tr.finish(o - 1 - int64(tt.total)); ok {
						t.Fatalf("finish of an unknown offset returned %d", n)
					}
				}
				n, ok := tr.finish(o)
				if got, want := (mark{n, ok}), m.finish(o); got != want {
					t.Fatalf("after %d taken: finish(%d) = %+v, want %+v", taken, o, got, want)
				}
				if got, want := tr.unfinished(), len(m.taken)-m.marked; got != want {
					t.Fatalf("unfinished() = %d, want %d", got, want)
				}
			}
			if got := tr.unfinished(); got != 0 {
				t.Errorf("unfinished() = %d at the end, want 0", got)
			}
		})
	}
}

// TestTracker_MemoryBounded: a partition is consumed for weeks; the tracker
// must forget marked offsets instead of keeping one entry per message ever
// read.
func TestTracker_MemoryBounded(t *testing.T) {
	t.Parallel()
	const total, window = 200_000, 64
	var tr tracker
	for o := int64(0); o < total; o++ {
		tr.add(o)
		if o >= window {
			tr.finish(o - window)
		}
		if n := len(tr.entries); n > 4*1024 {
			t.Fatalf("after %d offsets the tracker holds %d entries, want a bounded number", o+1, n)
		}
	}
	if got := tr.unfinished(); got != window {
		t.Errorf("unfinished() = %d, want %d", got, window)
	}
}

// TestTracker_ConcurrentFinish: keys finish concurrently; in the end every
// offset is committable and the end offset is reported exactly once.
func TestTracker_ConcurrentFinish(t *testing.T) {
	t.Parallel()
	const offsets, workers = 20_000, 16
	var tr tracker
	valid := map[int64]bool{} // next offsets a prefix can end at
	var all []int64
	for i := range int64(offsets) {
		o := 5 + 2*i // gaps everywhere
		tr.add(o)
		all = append(all, o)
		valid[o+1] = true
	}
	end := all[len(all)-1] + 1

	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		marks []int64
	)
	for w := range workers {
		var mine []int64
		for i := w; i < len(all); i += workers {
			mine = append(mine, all[i])
		}
		rand.New(rand.NewPCG(uint64(w), 7)).Shuffle(len(mine), func(i, j int) { mine[i], mine[j] = mine[j], mine[i] })
		wg.Go(func() {
			var got []int64
			for _, o := range mine {
				if next, ok := tr.finish(o); ok {
					got = append(got, next)
				}
			}
			mu.Lock()
			marks = append(marks, got...)
			mu.Unlock()
		})
	}
	wg.Wait()

	if got := tr.unfinished(); got != 0 {
		t.Errorf("unfinished() = %d, want 0", got)
	}
	if len(marks) == 0 {
		t.Fatal("no finish made anything committable")
	}
	seen := map[int64]bool{}
	for _, n := range marks {
		if !valid[n] {
			t.Errorf("finish returned %d, which is no offset's successor", n)
		}
		if seen[n] {
			t.Errorf("finish returned %d twice", n)
		}
		seen[n] = true
	}
	if got := slices.Max(marks); got != end {
		t.Errorf("the furthest mark is %d, want the end offset %d", got, end)
	}
}
