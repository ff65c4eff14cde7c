package kafka

import (
	"sort"
	"sync"
)

// tracker knows which offsets of one partition were taken off the claim and
// which of them are finished, and so how far the partition may be marked.
//
// Lanes finish messages out of offset order. An offset becomes committable
// only when it and every message before it are finished: sarama's MarkOffset
// never moves back, so marking a later offset early would lose an earlier,
// unfinished message on a crash.
type tracker struct {
	mu      sync.Mutex
	entries []entry // ascending offsets; entries[head:] are not yet marked
	head    int
}

type entry struct {
	offset int64
	done   bool
}

// add records an offset taken off the claim. Offsets arrive in ascending
// order (with gaps where the log was compacted or held transaction markers).
func (t *tracker) add(offset int64) {
	t.mu.Lock()
	t.entries = append(t.entries, entry{offset: offset})
	t.mu.Unlock()
}

// finish records offset as finished. When that completes a prefix, it
// returns the next offset to read (the value to mark) and true.
func (t *tracker) finish(offset int64) (int64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	pending := t.entries[t.head:]
	i := sort.Search(len(pending), func(i int) bool { return pending[i].offset >= offset })
	if i == len(pending) || pending[i].offset != offset {
		return 0, false
	}
	pending[i].done = true

	start := t.head
	for t.head < len(t.entries) && t.entries[t.head].done {
		t.head++
	}
	if t.head == start {
		return 0, false
	}
	next := t.entries[t.head-1].offset + 1
	// Reuse the slice's space once most of it is marked.
	if t.head > 1024 && t.head*2 > len(t.entries) {
		t.entries = append(t.entries[:0], t.entries[t.head:]...)
		t.head = 0
	}
	return next, true
}

// unfinished returns how many offsets are taken but not yet committable.
func (t *tracker) unfinished() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.entries) - t.head
}
