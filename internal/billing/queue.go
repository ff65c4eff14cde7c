package billing

import (
	"context"
	"sync"
)

// queue is where work waits for a writer: events for a claim, pushed by
// the goroutine that handles the event (Handle), and answered calls for a
// settle, pushed by the caller that sent the request; the event's
// goroutine blocks until a writer has recorded what it waits for. A writer takes
// whatever is waiting, up to a batch, in one transaction: alone when
// billing is idle, so nothing waits for a batch to fill, and many together
// under load, so the transactions per event fall as the load rises (group
// commit). Pushing never blocks: what waits is bounded by the messages the
// consumer holds (MAX_IN_FLIGHT).
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

// callers runs the provider requests on at most limit goroutines (0: no
// limit): a request beyond the limit waits in a FIFO as a closure of a few
// words, and a caller that is answered takes the next one. The event's own
// goroutine (the consumer's key) waits for the call's settle meanwhile,
// in a few frames: a request run on it would put net/http's frames on top
// of the consumer's and billing's, doubling its stack to 16 KiB, and a
// thousand keys waiting for a slot would each hold the payment client's
// frames as well (BENCHMARKS.md, issue 43). Go's GC paces on the stacks
// too, so each KiB of them costs about two of resident memory.
type callers struct {
	limit   int
	mu      sync.Mutex
	running int
	waiting []func()
}

// do runs f on a caller: at once while fewer than limit run, else after
// those queued before it.
func (c *callers) do(f func()) {
	c.mu.Lock()
	if c.limit > 0 && c.running >= c.limit {
		c.waiting = append(c.waiting, f)
		c.mu.Unlock()
		return
	}
	c.running++
	c.mu.Unlock()
	go c.run(f)
}

// run is one caller: f, then whatever waits, until nothing does.
func (c *callers) run(f func()) {
	for f != nil {
		f()
		c.mu.Lock()
		f = nil
		if len(c.waiting) > 0 {
			f = c.waiting[0]
			c.waiting[0] = nil // a run request must not stay alive in the backing array
			c.waiting = c.waiting[1:]
			if len(c.waiting) == 0 {
				c.waiting = nil
			}
		} else {
			c.running--
		}
		c.mu.Unlock()
	}
}
