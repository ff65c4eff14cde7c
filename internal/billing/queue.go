package billing

import (
	"context"
	"sync"
)

// queue is where work waits for a writer: events for a claim, answered
// calls for a settle. A writer takes whatever is waiting, up to a batch, in
// one transaction: alone when billing is idle, so nothing waits for a
// batch to fill, and many together under load, so the transactions per
// event fall as the load rises (group commit). Pushing never blocks: what
// waits is bounded by the messages the consumer holds (MAX_IN_FLIGHT).
type queue[T any] struct {
	mu     sync.Mutex
	items  []T
	closed bool
	wake   chan struct{} // signalled when items arrive
}

func newQueue[T any]() *queue[T] {
	return &queue[T]{wake: make(chan struct{}, 1)}
}

// push appends items, in order; it reports false, keeping none, once the
// queue is closed.
func (q *queue[T]) push(items ...T) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false
	}
	q.items = append(q.items, items...)
	q.signal()
	return true
}

// signal wakes one waiting writer; q.mu is held.
func (q *queue[T]) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// take waits until something is queued and returns up to max of it, in
// order, or nil once ctx ends.
func (q *queue[T]) take(ctx context.Context, max int) []T {
	for {
		q.mu.Lock()
		if n := min(len(q.items), max); n > 0 {
			batch := make([]T, n)
			copy(batch, q.items)
			clear(q.items[:n]) // taken work must not stay alive in the backing array
			q.items = q.items[n:]
			if len(q.items) > 0 {
				q.signal() // another writer takes the rest
			} else {
				q.items = nil
			}
			q.mu.Unlock()
			return batch
		}
		q.mu.Unlock()
		select {
		case <-q.wake:
		case <-ctx.Done():
			return nil
		}
	}
}

// close refuses further pushes and returns what was still queued.
func (q *queue[T]) close() []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	left := q.items
	q.items = nil
	return left
}
