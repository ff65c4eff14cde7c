//go:build chaos

package chaos_test

import (
	"slices"
	"time"

	"github.com/lib/pq"

	"example.com/billing/internal/dev/loadgen"
	"example.com/billing/internal/postgres"
)

// stuckOrders is how many orders the provider refuses in stuck-key.
const stuckOrders = 3

// A few orders whose every charge request the provider answers 503, from
// before they are published until after the whole stream was: each is a key
// stuck on a transient failure with thousands of messages of other keys
// behind it in its partition. Every other order must be settled while they
// are stuck (a stuck key holds only its own messages); then the provider
// takes them, and verify checks each charged once. Oversized compressed
// values (injectOversize) arrive meanwhile: each must be parked.
func injectStuckKeys(r *run) {
	rng := r.rng("stuck")
	oversized := make(chan struct{})
	go func() { defer close(oversized); injectOversize(r) }()
	defer func() { <-oversized }()
	var orders []int64
	for len(orders) < stuckOrders {
		id := 1 + int64(r.sc.count/10+rng.IntN(r.sc.count*4/10))
		if !slices.Contains(orders, id) {
			orders = append(orders, id)
		}
	}
	if err := r.psp.setFaults(func(o map[string]any) { o["failOrders"] = orders }); err != nil {
		r.t.Errorf("provider failOrders: %v", err)
		return
	}
	r.fault("stuck-key", "provider answers 503 to every charge of orders %v", orders)
	r.sleepUntil(r.stream.duration())
	for published := false; !published; time.Sleep(100 * time.Millisecond) {
		r.mu.Lock()
		published = !r.published.IsZero()
		r.mu.Unlock()
	}

	db, err := postgres.Open(r.dsn, 1)
	if err != nil {
		r.t.Errorf("open database: %v", err)
		return
	}
	defer db.Close()
	// The orders of the valid events published: each must be settled,
	// except the stuck ones (an invalid message's order is never charged).
	others, stuck := map[int64]bool{}, map[int64]bool{}
	for _, m := range r.stream.messages() {
		if m.kind != loadgen.Valid {
			continue
		}
		if slices.Contains(orders, m.orderID) {
			stuck[m.orderID] = true
		} else {
			others[m.orderID] = true
		}
	}
	const q = `SELECT count(DISTINCT order_id) FILTER (WHERE status <> 'pending'),
		count(*) FILTER (WHERE status = 'pending' AND order_id = ANY($1))
		FROM charge`
	var settled, pending int
	deadline := time.Now().Add(catchUpLimit)
	for {
		if err := db.QueryRow(q, pq.Array(orders)).Scan(&settled, &pending); err != nil {
			r.t.Errorf("count settled orders: %v", err)
			return
		}
		if settled >= len(others) || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	r.t.Logf("[+%s] while %d orders were stuck: %d of the %d other orders settled; %d stuck attempts pending", r.elapsed(), len(stuck), settled, len(others), pending)
	if settled != len(others) {
		r.t.Errorf("%d of %d orders settled while %d orders were stuck, want all: a stuck key held back others", settled, len(others), len(stuck))
	}
	if pending != len(stuck) {
		r.t.Errorf("%d charge attempts of the stuck orders pending, want %d (one per stuck order published valid)", pending, len(stuck))
	}

	if err := r.psp.setFaults(func(o map[string]any) { delete(o, "failOrders") }); err != nil {
		r.t.Errorf("provider failOrders: %v", err)
		return
	}
	r.faultOver()
}
