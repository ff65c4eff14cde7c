//go:build chaos

package chaos_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/lib/pq"

	"example.com/billing/internal/dev/loadgen"
	"example.com/billing/internal/postgres"
)

// zombieBound is how soon after a replica lost its brokers it must start
// no new charge: it notices within the session timeout that the
// coordinator no longer confirms its membership (its own heartbeats go
// unanswered; the group moves its partitions at the same moment), a
// request it had started may run PAYMENT_TIMEOUT more, and 2s are slack
// for the provider's clock and the poll.
const zombieBound = sessionTimeout + paymentTimeout + 2*time.Second

// zombieRPS is partition-broker's PAYMENT_MAX_RPS: how fast each replica
// charges.
const zombieRPS = 15

// readyzLimit is how long a /readyz answer may take whatever the database
// does: serve gives its database checks 2s, and 1s is slack.
const readyzLimit = 3 * time.Second

// partition-broker: serve-0 runs in a network namespace of its own and
// loses every broker (its packets to and from the brokers' ports dropped,
// PostgreSQL and the provider still reachable) for 24-27s, longer than the
// session timeout, while the provider takes 350ms an answer so that
// charges are in flight at the cut. The group moves its partitions to the
// others after the session timeout; the cut-off replica, a zombie, still
// holds the messages it fetched. So that it holds many, the stream (150/s)
// outruns the replicas, each held to 15 charges/s (PAYMENT_MAX_RPS): at
// the cut the zombie has fetched far more than 14s of work. Required: it sends no charge request from
// zombieBound after the cut until the heal (fakepsp counts requests per
// client address, and the zombie's is its namespace's), its /readyz is
// 503 from then on, and after the heal it rejoins (/readyz 200) and the
// group drains; verify: nothing charged twice, nothing lost.
//
// Charge attempt recovery (Recover) also sends requests, from any replica,
// for attempts pending for PAYMENT_RECOVER_AFTER (default: 1m with the
// suite's 2s PAYMENT_TIMEOUT). The scenario sets it to 2m: no attempt can
// qualify before the heal (the stream starts less than 45s before it), so
// every request the zombie sends meanwhile is its consumer's work.
func injectPartitionBroker(r *run) {
	rng := r.rng("partition-broker")
	host, zombie := r.hosts[0], r.inSlot(0)
	if host == nil || zombie == nil {
		r.t.Errorf("partition-broker: serve-0 is not running in a host")
		return
	}
	ports, err := r.brokerPorts()
	if err != nil {
		r.t.Errorf("partition-broker: %v", err)
		return
	}
	r.sleepUntil(between(rng, 12*time.Second, 14*time.Second))
	// Cut while the zombie has charges in flight: it sent a request within
	// the provider's latency.
	var before pspClient
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if before, err = r.psp.client(host.nsIP); err == nil && time.Since(before.Last) < r.sc.latency {
			break
		}
	}
	// The zombie must hold more work than it can do before the bound, or
	// a zombie that never stops would pass.
	owned, backlog, err := r.backlogOf(zombie.name)
	if err != nil {
		r.t.Errorf("partition-broker: %v", err)
		return
	}
	hold := between(rng, 24*time.Second, 27*time.Second)
	r.fault("partition-broker", "%s (pid %d, %s) cut off from the brokers (ports %v) for %s; PostgreSQL and the provider stay reachable",
		zombie.name, zombie.pid(), host.nsIP, ports, hold.Round(100*time.Millisecond))
	cut := time.Now()
	r.mu.Lock()
	r.faultStart = cut
	r.mu.Unlock()
	if err := host.cut(ports...); err != nil {
		r.t.Errorf("partition-broker: %v", err)
		return
	}
	healed := false
	heal := func() {
		if healed {
			return
		}
		healed = true
		if err := host.heal(); err != nil {
			r.t.Errorf("partition-broker: heal: %v", err)
		}
		r.faultOver()
	}
	defer heal()
	r.t.Logf("[+%s] %s had sent %d charge requests, the last %s before the cut", r.elapsed(), zombie.name, before.Requests, cut.Sub(before.Last).Round(time.Millisecond))
	r.figure("zombie's partitions %v held %d messages not committed at the cut", owned, backlog)
	if rps := float64(zombieRPS); float64(backlog) < rps*(zombieBound+5*time.Second).Seconds() {
		r.t.Errorf("%s's partitions held %d uncommitted messages at the cut, less than %s of its work at %.0f charges/s: the scenario cannot tell a zombie that stops from one that does not",
			zombie.name, backlog, zombieBound+5*time.Second, rps)
	}

	sleepFor(cut, zombieBound)
	atBound, err := r.psp.client(host.nsIP)
	if err != nil {
		r.t.Errorf("partition-broker: provider stats: %v", err)
		return
	}
	r.t.Logf("[+%s] %s sent %d charge requests in the %s after the cut", r.elapsed(), zombie.name, atBound.Requests-before.Requests, zombieBound)
	stop := make(chan struct{})
	watched := make(chan []probe, 1)
	go func() { watched <- watchReadyz(zombie, stop) }()
	sleepFor(cut, hold)
	close(stop)
	probes := <-watched
	atHeal, err := r.psp.client(host.nsIP)
	if err != nil {
		r.t.Errorf("partition-broker: provider stats: %v", err)
		return
	}
	heal()
	r.t.Logf("[+%s] %s healed after %s", r.elapsed(), zombie.name, time.Since(cut).Round(100*time.Millisecond))
	if rebalances, err := r.rebalances(cut, time.Now()); err == nil {
		for _, rb := range rebalances {
			r.figure("the coordinator rebalanced the group %s after the cut (%s)", rb.at.Sub(cut).Round(100*time.Millisecond), rb.reason)
		}
	}

	r.figure("zombie's last charge request %s after the cut (bound %s), %d requests after the bound",
		atHeal.Last.Sub(cut).Round(10*time.Millisecond), zombieBound, atHeal.Requests-atBound.Requests)
	if n := atHeal.Requests - atBound.Requests; n > 0 {
		r.t.Errorf("%s, cut off from the brokers, sent %d charge requests between %s after the cut (session timeout %s + PAYMENT_TIMEOUT %s + 2s) and the heal %s after it; its last at +%s: a zombie still charging",
			zombie.name, n, zombieBound, sessionTimeout, paymentTimeout, hold.Round(100*time.Millisecond), atHeal.Last.Sub(cut).Round(10*time.Millisecond))
	}
	r.judgeReadyz(zombie, probes, http.StatusServiceUnavailable, readyzLimit, fmt.Sprintf("from %s after the cut to the heal", zombieBound))
	r.checkZombieRecovery(zombie)

	// Back: it joins the group again.
	if took, last, ok := waitReadyzBody(zombie, http.StatusOK, time.Minute); ok {
		r.figure("zombie ready again %s after the heal", took.Round(100*time.Millisecond))
	} else {
		r.t.Errorf("%s /readyz not 200 within %s of the heal: %s", zombie.name, took.Round(time.Second), last)
	}
}

// checkZombieRecovery fails when charge attempt recovery ran on the
// zombie, whose requests would then not all be its consumer's.
func (r *run) checkZombieRecovery(c *consumer) {
	if lines := r.logLines("completed charge attempts left pending")[c.name]; len(lines) > 0 {
		r.t.Errorf("%s completed charge attempts left pending (charge attempt recovery) at %s: its provider requests are not all its consumer's",
			c.name, lines[0].Time.Format(time.RFC3339Nano))
	}
}

// partition-database: serve-0 runs in a host and loses PostgreSQL (its
// packets to and from the database's port dropped; brokers and provider
// reachable) for 15-20s, cut at a moment when charge attempts are pending
// (claimed, not settled) and the provider takes 400ms an answer, so that
// some of its own are between claim and settle. Required: no offset
// committed past unsettled work (just before the heal, every pending
// attempt's event lies at or above its partition's committed offset),
// /readyz 503 on the cut-off replica within seconds, attempts left
// pending resumed after the heal, and verify's nothing charged twice,
// nothing lost.
func injectPartitionDatabase(r *run) {
	rng := r.rng("partition-database")
	host, cutOff := r.hosts[0], r.inSlot(0)
	if host == nil || cutOff == nil {
		r.t.Errorf("partition-database: serve-0 is not running in a host")
		return
	}
	port, err := databasePort(r.dsn)
	if err != nil {
		r.t.Errorf("partition-database: %v", err)
		return
	}
	db, err := postgres.Open(r.dsn, 1)
	if err != nil {
		r.t.Errorf("open database: %v", err)
		return
	}
	defer db.Close()

	r.sleepUntil(between(rng, 5*time.Second, 7*time.Second))
	// Cut while attempts are pending and the replica has charges in
	// flight (a request of its own within the provider's latency).
	var pending int
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		cl, _ := r.psp.client(host.nsIP)
		if err := db.Get(&pending, `SELECT count(*) FROM charge WHERE status = 'pending'`); err == nil && pending > 0 && time.Since(cl.Last) < r.sc.latency {
			break
		}
	}
	hold := between(rng, 15*time.Second, 20*time.Second)
	r.fault("partition-database", "%s (pid %d, %s) cut off from PostgreSQL (port %d) for %s, %d charge attempts pending; brokers and provider stay reachable",
		cutOff.name, cutOff.pid(), host.nsIP, port, hold.Round(100*time.Millisecond), pending)
	cut := time.Now()
	r.mu.Lock()
	r.faultStart = cut
	r.mu.Unlock()
	if err := host.cut(port); err != nil {
		r.t.Errorf("partition-database: %v", err)
		return
	}
	healed := false
	heal := func() {
		if !healed {
			healed = true
			if err := host.heal(); err != nil {
				r.t.Errorf("partition-database: heal: %v", err)
			}
			r.faultOver()
		}
	}
	defer heal()

	// /readyz: 503 from the cut on, each answer within readyzLimit.
	stop := make(chan struct{})
	watched := make(chan []probe, 1)
	go func() { watched <- watchReadyz(cutOff, stop) }()
	sleepFor(cut, hold-time.Second)
	close(stop)
	probes := <-watched
	for _, p := range probes[:min(len(probes), 6)] {
		r.t.Logf("%s /readyz asked %s after the cut: %s", cutOff.name, p.at.Sub(cut).Round(100*time.Millisecond), p)
	}
	for _, p := range probes {
		if p.code == http.StatusServiceUnavailable {
			r.figure("cut-off replica /readyz 503 %s after the cut", p.at.Add(p.took).Sub(cut).Round(100*time.Millisecond))
			break
		}
	}
	r.judgeReadyz(cutOff, probes, http.StatusServiceUnavailable, readyzLimit, "while cut off from PostgreSQL")

	// No offset committed past unsettled work: the committed offsets read
	// first, the pending attempts after. An attempt pending now was
	// pending when the offsets were read (an attempt only leaves pending),
	// so none of its event's messages may lie below them.
	committed, err := committedOffsets(r.probe, r.group, r.topic)
	if err != nil {
		r.t.Errorf("committed offsets before the heal: %v", err)
		return
	}
	var ids []string
	if err := db.Select(&ids, `SELECT event_id::text FROM charge WHERE status = 'pending' ORDER BY event_id`); err != nil {
		r.t.Errorf("pending attempts before the heal: %v", err)
		return
	}
	heal()
	where := r.stream.positions()
	var past []string
	for _, id := range ids {
		for _, pos := range where[id] {
			if c, ok := committed[pos.partition]; ok && c > pos.offset {
				past = append(past, fmt.Sprintf("%s at %d/%d (committed %d)", id, pos.partition, pos.offset, c))
			}
		}
	}
	r.figure("%d attempts pending just before the heal, %d committed past", len(ids), len(past))
	if len(ids) == 0 {
		r.t.Errorf("no charge attempt was pending just before the heal: the cut caught nothing between claim and settle, the scenario proves nothing")
	}
	if len(past) > 0 {
		sort.Strings(past)
		r.t.Errorf("offsets committed past %d unsettled charge attempts: %s", len(past), strings.Join(past[:min(len(past), 10)], "; "))
	}

	// The attempts left pending are resumed once the database is back.
	healedAt := time.Now()
	if took, last, ok := waitReadyzBody(cutOff, http.StatusOK, 30*time.Second); !ok {
		r.t.Errorf("%s /readyz not 200 within %s of the heal: %s", cutOff.name, took.Round(time.Second), last)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(250 * time.Millisecond) {
		var left int
		err := db.Get(&left, `SELECT count(*) FROM charge WHERE status = 'pending' AND event_id::text = ANY($1)`, pq.Array(ids))
		if err == nil && left == 0 {
			r.figure("attempts pending at the heal settled %s after it", time.Since(healedAt).Round(100*time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			r.t.Errorf("%d of the %d attempts pending at the heal still pending a minute after it (%v)", left, len(ids), err)
			break
		}
	}
}

// databasePort is the port of a postgres:// URL.
func databasePort(dsn string) (int, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(u.Port())
}

// positions returns where each event id was published (every copy of it:
// duplicates, cross-partition copies), from the acknowledged messages.
func (s *stream) positions() map[string][]position {
	out := map[string][]position{}
	for _, m := range s.messages() {
		if m.kind == loadgen.Invalid {
			continue
		}
		var ev struct {
			EventID uuid.UUID `json:"eventId"`
		}
		if json.Unmarshal(m.value, &ev) == nil && !ev.EventID.IsNil() {
			id := ev.EventID.String()
			out[id] = append(out[id], position{m.partition, m.offset})
		}
	}
	return out
}
