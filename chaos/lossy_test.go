//go:build chaos

package chaos_test

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// The lossy network's parameters.
const (
	lossyLatency = 200 * time.Millisecond // per direction
	lossyJitter  = 50 * time.Millisecond  // ± per chunk
	lossyDrop    = 0.05                   // of the packets, each direction
	lossyHold    = time.Minute
	// maxRebalances bounds the group's rebalances while the network is
	// lossy and shortly after. With the delay and 5% loss, a heartbeat
	// (every 3s) reaches the coordinator within a few hundred milliseconds
	// plus TCP's retransmissions, well inside the 10s session timeout, so
	// no member should ever be expired: 0 is expected. One rebalance is
	// tolerated (one unlucky connection in exponential backoff); a storm
	// is every member expiring and rejoining again and again.
	maxRebalances = 1
)

// prepareLossy puts a latency proxy in front of each broker and routes
// every host's connections to that broker through it: serve still dials
// 127.0.0.1:<broker port>, and the broker's metadata stays true. The
// proxies add nothing until injectLossy sets their delay.
func prepareLossy(r *run) error {
	for i, addr := range strings.Split(r.brokers, ",") {
		p, err := startProxy(fmt.Sprintf("broker-%d", i), addr, uint64(r.seed)+uint64(i))
		if err != nil {
			return err
		}
		r.t.Cleanup(p.close)
		r.proxies = append(r.proxies, p)
	}
	ports, err := r.brokerPorts()
	if err != nil {
		return err
	}
	for _, h := range r.hosts {
		for i, port := range ports {
			if err := h.redirect(port, r.proxies[i].port()); err != nil {
				return err
			}
		}
	}
	return nil
}

// lossy-network: every replica runs in a host of its own, its broker
// traffic through the latency proxies. For a minute under load, each
// chunk of broker traffic is delayed 200ms ± 50ms per direction and 5% of
// the packets between each host and the brokers are dropped, both
// directions. Required: verify's nothing charged twice, nothing lost; at
// most maxRebalances rebalances (counted by checkRebalances); throughput
// recovers (lag 0 soon after, events/s during and after printed).
func injectLossy(r *run) {
	rng := r.rng("lossy")
	ports, err := r.brokerPorts()
	if err != nil {
		r.t.Errorf("lossy-network: %v", err)
		return
	}
	r.sleepUntil(between(rng, 6*time.Second, 8*time.Second))
	before, err := r.committedTotal()
	if err != nil {
		r.t.Errorf("lossy-network: committed offsets: %v", err)
	}
	r.fault("lossy-network", "broker traffic of %d hosts delayed %s ± %s per direction, %.0f%% of packets dropped, for %s",
		len(r.hosts), lossyLatency, lossyJitter, lossyDrop*100, lossyHold)
	start := time.Now()
	r.mu.Lock()
	r.faultStart = start
	r.mu.Unlock()
	for _, p := range r.proxies {
		p.setDelay(lossyLatency, lossyJitter)
	}
	for _, h := range r.hosts {
		if err := h.lossy(lossyDrop, ports...); err != nil {
			r.t.Errorf("lossy-network: %v", err)
		}
	}
	// The group's progress every 10s, for the log.
	for time.Since(start) < lossyHold {
		time.Sleep(min(10*time.Second, lossyHold-time.Since(start)))
		if n, err := r.committedTotal(); err == nil {
			r.t.Logf("[+%s] lossy for %s: %d messages committed since it began", r.elapsed(), time.Since(start).Round(time.Second), n-before)
		}
	}
	for _, h := range r.hosts {
		if err := h.heal(); err != nil {
			r.t.Errorf("lossy-network: heal: %v", err)
		}
	}
	for _, p := range r.proxies {
		p.setDelay(0, 0)
	}
	r.faultOver()
	after, err := r.committedTotal()
	if err != nil {
		r.t.Errorf("lossy-network: committed offsets: %v", err)
		return
	}
	during := float64(after-before) / time.Since(start).Seconds()
	r.figure("%.0f messages/s committed while lossy (the stream: %.0f/s)", during, r.sc.rate)
	r.mu.Lock()
	r.committedAtEnd = after
	r.mu.Unlock()
}

// checkRebalances counts the group's rebalances from the lossy network's
// start to 10s after its end: the generations the members joined then
// (each rebalance starts a new generation, which every member joins, so
// that one member's rejoin shows as a rebalance of all); and the
// throughput after the fault.
func checkRebalances(r *run) {
	r.mu.Lock()
	from, faultEnd, lagZero, committed := r.faultStart, r.faultEnd, r.lagZero, r.committedAtEnd
	r.mu.Unlock()
	joins := r.logLines("joined consumer group")
	generations := map[int32]bool{}
	var who []string
	for name, lines := range joins {
		w := within(lines, from, faultEnd.Add(10*time.Second))
		for _, l := range w {
			generations[l.Generation] = true
		}
		if len(w) > 0 {
			who = append(who, fmt.Sprintf("%s joined %d times", name, len(w)))
		}
	}
	gens := make([]int32, 0, len(generations))
	for g := range generations {
		gens = append(gens, g)
	}
	slices.Sort(gens)
	sort.Strings(who)
	r.figure("%d rebalances while lossy and 10s after (generations %v; %s)", len(gens), gens, strings.Join(who, ", "))
	if len(gens) > maxRebalances {
		r.t.Errorf("%d rebalances while the network was lossy (generations %v), want at most %d: a rebalance storm", len(gens), gens, maxRebalances)
	}
	if !lagZero.IsZero() && lagZero.After(faultEnd) {
		end, err := r.committedTotal()
		if err == nil {
			r.figure("%.0f messages/s committed from the fault's end to lag 0 (%d messages in %s)",
				float64(end-committed)/lagZero.Sub(faultEnd).Seconds(), end-committed, lagZero.Sub(faultEnd).Round(100*time.Millisecond))
		}
	}
}
