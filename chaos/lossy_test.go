//go:build chaos

package chaos_test

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gofrs/uuid/v5"

	"example.com/billing/internal/postgres"
)

// The lossy network's parameters.
const (
	lossyLatency = 200 * time.Millisecond // per direction
	lossyJitter  = 50 * time.Millisecond  // ± per chunk
	lossyDrop    = 0.05                   // of the packets, each direction
	lossyHold    = time.Minute
	// maxRebalances bounds the group's rebalances while the network is
	// lossy and shortly after, as its coordinator counts them. With the delay and 5% loss, a heartbeat
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
// most maxRebalances rebalances (counted by checkLossy); throughput
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
	var dropped, delayed int64
	for _, h := range r.hosts {
		n, err := h.dropped()
		if err != nil {
			r.t.Errorf("lossy-network: %v", err)
		}
		dropped += n
		if err := h.heal(); err != nil {
			r.t.Errorf("lossy-network: heal: %v", err)
		}
	}
	for _, p := range r.proxies {
		delayed += p.delayedChunks()
		p.setDelay(0, 0)
	}
	r.faultOver()
	r.figure("%d packets dropped, %d chunks delayed", dropped, delayed)
	if dropped == 0 || delayed == 0 {
		r.t.Errorf("lossy-network: %d packets dropped, %d chunks delayed: the fault did not reach the replicas' broker traffic, the scenario proves nothing", dropped, delayed)
	}
	after, err := r.committedTotal()
	if err != nil {
		r.t.Errorf("lossy-network: committed offsets: %v", err)
		return
	}
	r.figure("%.0f messages/s committed while lossy (the stream: %.0f/s)", float64(after-before)/time.Since(start).Seconds(), r.sc.rate)
	r.mu.Lock()
	r.committedAtEnd = after
	r.mu.Unlock()
}

// checkLossy counts the group's rebalances from the lossy network's start
// to 10s after its end, from its coordinator's log, and measures how the
// fault slowed billing: messages/s from its end to lag 0, and the latency
// of events published before, during and after it.
func checkLossy(r *run) {
	r.mu.Lock()
	from, faultEnd, lagZero, committed := r.faultStart, r.faultEnd, r.lagZero, r.committedAtEnd
	r.mu.Unlock()
	rebalances, err := r.rebalances(from, faultEnd.Add(10*time.Second))
	if err != nil {
		r.t.Errorf("lossy-network: rebalances: %v", err)
	}
	var what []string
	for _, rb := range rebalances {
		what = append(what, fmt.Sprintf("+%s %s", rb.at.Sub(from).Round(100*time.Millisecond), rb.reason))
	}
	r.figure("%d rebalances while lossy and 10s after %v", len(rebalances), what)
	if len(rebalances) > maxRebalances {
		r.t.Errorf("%d rebalances while the network was lossy, want at most %d: a rebalance storm: %s", len(rebalances), maxRebalances, strings.Join(what, "; "))
	}
	if !lagZero.IsZero() && lagZero.After(faultEnd) {
		if end, err := r.committedTotal(); err == nil {
			r.figure("%.0f messages/s committed from the fault's end to lag 0 (%d messages in %s)",
				float64(end-committed)/lagZero.Sub(faultEnd).Seconds(), end-committed, lagZero.Sub(faultEnd).Round(100*time.Millisecond))
		}
	}
	lat, err := r.claimLatency(from, faultEnd)
	if err != nil {
		r.t.Errorf("lossy-network: latency: %v", err)
		return
	}
	r.figure("claim latency p50/p99 before %s, during %s, after %s", lat[0], lat[1], lat[2])
}

// claimLatency returns, for the events that occurred before from, between
// from and to, and after to, the p50 and p99 of their latency from
// occurredAt (the time in their UUID v7 event id) to their claim
// (processed_at).
func (r *run) claimLatency(from, to time.Time) ([3]string, error) {
	var out [3]string
	db, err := postgres.Open(r.dsn, 1)
	if err != nil {
		return out, err
	}
	defer db.Close()
	var rows []struct {
		ID uuid.UUID `db:"event_id"`
		At time.Time `db:"processed_at"`
	}
	if err := db.Select(&rows, `SELECT event_id, processed_at FROM processed_event WHERE consumer_group = $1`, r.group); err != nil {
		return out, err
	}
	var periods [3][]time.Duration
	for _, row := range rows {
		ts, err := uuid.TimestampFromV7(row.ID)
		if err != nil {
			return out, err
		}
		occurred, _ := ts.Time()
		i := 1
		switch {
		case occurred.Before(from):
			i = 0
		case occurred.After(to):
			i = 2
		}
		periods[i] = append(periods[i], row.At.Sub(occurred))
	}
	for i, p := range periods {
		if len(p) == 0 {
			out[i] = "–"
			continue
		}
		slices.Sort(p)
		out[i] = fmt.Sprintf("%s/%s (%d events)", p[len(p)/2].Round(time.Millisecond), p[len(p)*99/100].Round(time.Millisecond), len(p))
	}
	return out, nil
}
