//go:build chaos

package chaos_test

import (
	"net/http"
	"path/filepath"
	"time"

	"example.com/billing/internal/postgres"
)

// Faults aimed at claim → charge → settle: the provider's answers lost
// while two events of one order race in two partitions, processes killed
// while their charge attempts are in flight, and a provider brownout.

// Two different events for every order, in two partitions, while 30 % of
// the provider's answers are lost after it charged: the second event meets
// the first one's attempt pending and completes it before it decides, so
// every order is charged once (verify, with stream.seconds).
func injectSameOrderLostAnswers(r *run) {
	r.resets(0.3, r.stream.duration())
}

// kill -9 of consumers while the provider takes 400 ms an answer, so that
// the kills land between the claim and the settle of attempts in flight
// (counted: an attempt pending when the process died), and between the
// settle and the commit of their offsets (committed once a second). The
// redelivered messages resume the attempts under the same keys, or
// maintenance does: nothing is lost, nothing charged twice (verify).
func injectKillsMidCharge(r *run) {
	db, err := postgres.Open(r.dsn, 1)
	if err != nil {
		r.t.Errorf("open database: %v", err)
		return
	}
	defer db.Close()
	rng := r.rng("kill")
	hits := 0
	for _, at := range moments(rng, 6, time.Second, r.stream.duration()-500*time.Millisecond) {
		r.sleepUntil(at)
		var pending int
		if err := db.Get(&pending, `SELECT count(*) FROM charge WHERE status = 'pending'`); err != nil {
			r.t.Errorf("count pending attempts: %v", err)
		}
		if pending > 0 {
			hits++
		}
		r.t.Logf("[+%s] %d charge attempts pending (claimed, not settled) at this kill", r.elapsed(), pending)
		r.kill9(rng)
	}
	r.addFaults("kills-mid-charge", hits)
	if hits == 0 {
		r.t.Errorf("no kill landed while an attempt was between its claim and its settle: the scenario proves nothing")
	}
}

// The provider takes 10 s an answer for 30 s (serve's PAYMENT_TIMEOUT is
// 2 s, so every request times out while the provider still charges). No
// transaction waits for it: no session sits idle in transaction, the
// dedup and outbox maintenance (billing maintain) still run at once,
// /readyz stays 200 (the provider is not a readiness dependency) and,
// afterwards, everything is charged once (verify).
func injectBrownout(r *run) {
	rng := r.rng("brownout")
	r.sleepUntil(between(rng, 2*time.Second, 3*time.Second))
	db, err := postgres.Open(r.dsn, 1)
	if err != nil {
		r.t.Errorf("open database: %v", err)
		return
	}
	defer db.Close()
	const hold = 30 * time.Second
	if err := r.psp.setFaults(func(o map[string]any) { o["latency"] = int64(10 * time.Second) }); err != nil {
		r.t.Errorf("provider latency: %v", err)
		return
	}
	r.fault("psp-brownout", "latency 10s for %s", hold)
	started := time.Now()
	var worstIdle time.Duration
	maintained := false
	for time.Since(started) < hold {
		var idle float64
		const q = `SELECT coalesce(max(extract(epoch FROM now() - state_change)) FILTER (WHERE state LIKE 'idle in transaction%'), 0)::float8
			FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`
		if err := db.Get(&idle, q); err == nil {
			worstIdle = max(worstIdle, time.Duration(idle*float64(time.Second)))
		}
		for _, c := range r.running() {
			if code := c.get("/readyz"); code != http.StatusOK && !c.exited() {
				r.t.Errorf("[+%s] %s /readyz = %d while only the provider is slow, want 200", r.elapsed(), c.name, code)
			}
		}
		if !maintained && time.Since(started) > 10*time.Second {
			maintained = true
			r.maintainDuringBrownout()
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err := r.psp.setFaults(func(o map[string]any) { o["latency"] = int64(r.sc.latency) }); err != nil {
		r.t.Errorf("provider latency: %v", err)
		return
	}
	r.faultOver()
	r.t.Logf("[+%s] provider brownout over; longest idle-in-transaction session meanwhile %s", r.elapsed(), worstIdle.Round(time.Millisecond))
	if worstIdle > time.Second {
		r.t.Errorf("a session sat idle in transaction for %s during the brownout: a transaction waited for the provider", worstIdle)
	}
}

// maintainDuringBrownout runs billing maintain (retention of the dedup
// store and the outbox, the report of charge attempts) while the provider
// is slow: it must finish at once, blocked by no transaction.
func (r *run) maintainDuringBrownout() {
	began := time.Now()
	p, err := startProc("maintain", filepath.Join(r.dir, "maintain.log"), map[string]string{"DATABASE_URL": r.dsn}, nil, "maintain")
	if err != nil {
		r.t.Errorf("billing maintain: %v", err)
		return
	}
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		r.t.Errorf("billing maintain did not finish within 20s during the brownout\n%s", p.tail(20))
		return
	}
	if p.exitErr != nil {
		r.t.Errorf("billing maintain during the brownout: %v\n%s", p.exitErr, p.tail(20))
		return
	}
	r.fault("maintain", "billing maintain finished in %s during the brownout", time.Since(began).Round(time.Millisecond))
}
