//go:build chaos

package chaos_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"example.com/billing/internal/metrics"
)

// The fleet scenario (issue 42): three replicas share one budget of the
// provider account's requests (PAYMENT_ACCOUNT_MAX_RPS) while a stream
// faster than it piles up a backlog; charging is paused mid-stream with
// billing pause and resumed with billing resume; later a replica is killed
// with -9 and started again only after a while. The provider answers 429
// past the budget. Beyond the common books (0 charged twice, 0 lost): the
// busiest second at the provider within the budget and no 429; from 5 s
// after the pause until the resume no request at the provider, /readyz
// 200 and billing_charging_paused 1 on every replica, and the group's
// generation unchanged (no rebalance). Figures: the busiest second, the
// mean while the backlog lasted, the time to the last request after the
// pause, and the time the survivors took to spread the killed replica's
// share among them.

// fleetBudget is the scenario's PAYMENT_ACCOUNT_MAX_RPS: below the
// stream's rate, so that a backlog piles up and the budget is what bounds
// the provider's requests.
const fleetBudget = 40

// fleetRun is what the fleet scenario samples and measures.
type fleetRun struct {
	stopSampling chan struct{}
	sampled      chan struct{}

	mu sync.Mutex
	// samples are the provider's charge requests so far, every 100 ms.
	samples []sample
	// The pause: when billing pause began, when billing resume did, the
	// group's generation on every replica as the pause took hold and as
	// it ended, and whether every replica was ready and paused.
	paused, resumed        time.Time
	genBefore, genAfter    map[string]float64
	pauseChecked           bool
	killed, killedRestart  time.Time
	killedName             string
	pauseOutput, resumeOut string
}

// sample is the provider's count of charge requests at a moment.
type sample struct {
	at       time.Time
	requests int64
}

// fleetEnv is every replica's shared budget.
var fleetEnv = map[string]string{"PAYMENT_ACCOUNT_MAX_RPS": fmt.Sprint(fleetBudget)}

// readyFleet makes the provider answer 429 past the budget, as an
// account's rate limit does, and starts sampling its requests.
func readyFleet(r *run) error {
	if err := r.psp.setFaults(func(o map[string]any) { o["rateLimit"] = fleetBudget }); err != nil {
		return err
	}
	f := &fleetRun{stopSampling: make(chan struct{}), sampled: make(chan struct{})}
	r.fleet = f
	go f.sample(r)
	r.t.Cleanup(func() { close(f.stopSampling); <-f.sampled })
	return nil
}

// sample notes the provider's charge requests every 100 ms.
func (f *fleetRun) sample(r *run) {
	defer close(f.sampled)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-f.stopSampling:
			return
		case <-tick.C:
		}
		st, err := r.psp.stats()
		if err != nil {
			continue
		}
		f.mu.Lock()
		f.samples = append(f.samples, sample{at: time.Now(), requests: st.Requests})
		f.mu.Unlock()
	}
}

// requestsAt is the provider's count of requests at the last sample at or
// before t.
func (f *fleetRun) requestsAt(t time.Time) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var n int64
	for _, s := range f.samples {
		if s.at.After(t) {
			break
		}
		n = s.requests
	}
	return n
}

// lastChange is the first sample in [from, to) after which the count did
// not change until to: when the last request before to arrived, within
// 100 ms; from when none arrived.
func (f *fleetRun) lastChange(from, to time.Time) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	last := from
	var prev int64 = -1
	for _, s := range f.samples {
		if s.at.Before(from) {
			prev = s.requests
			continue
		}
		if !s.at.Before(to) {
			break
		}
		if prev >= 0 && s.requests != prev {
			last = s.at
		}
		prev = s.requests
	}
	return last
}

// rate is the requests per second over [from, to).
func (f *fleetRun) rate(from, to time.Time) float64 {
	if !to.After(from) {
		return 0
	}
	return float64(f.requestsAt(to)-f.requestsAt(from)) / to.Sub(from).Seconds()
}

// gauges reads one series of every running replica's /metrics, by name.
func (r *run) gauges(series string) (map[string]float64, error) {
	out := map[string]float64{}
	for _, c := range r.running() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		snap, err := metrics.Scrape(ctx, "http://"+c.addr+"/metrics")
		cancel()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
		out[c.name] = snap.Values[series]
	}
	return out, nil
}

// chargingCommand runs billing pause or billing resume and returns what
// it printed.
func (r *run) chargingCommand(cmd, reason string) (string, error) {
	env := map[string]string{"DATABASE_URL": r.dsn, "KAFKA_GROUP_ID": r.group}
	return r.billingCommand(cmd, env, nil, cmd, "--reason", reason, "--by", "chaos")
}

// injectFleet pauses charging mid-stream for 12 s, resumes it, and later
// kills a replica with -9 and starts it again 12 s after.
func injectFleet(r *run) {
	f := r.fleet
	r.sleepUntil(6 * time.Second)
	f.mu.Lock()
	f.paused = time.Now()
	f.mu.Unlock()
	r.fault("pause", "billing pause while the backlog grows")
	out, err := r.chargingCommand("pause", "chaos: the provider double-charges")
	f.mu.Lock()
	f.pauseOutput = strings.TrimSpace(out)
	f.mu.Unlock()
	if err != nil {
		r.t.Errorf("billing pause: %v", err)
		return
	}
	r.t.Logf("[+%s] billing pause printed: %s", r.elapsed(), strings.ReplaceAll(strings.TrimSpace(out), "\n", "; "))

	// Within 5 s every replica applies it; the generation then must
	// not move until the resume.
	time.Sleep(time.Until(f.paused.Add(5 * time.Second)))
	before, err := r.gauges("billing_consumer_group_generation")
	if err != nil {
		r.t.Errorf("generation at the pause: %v", err)
	}
	pausedGauge, err := r.gauges("billing_charging_paused")
	if err != nil {
		r.t.Errorf("billing_charging_paused: %v", err)
	}
	for name, v := range pausedGauge {
		if v != 1 {
			r.t.Errorf("%s billing_charging_paused = %v 5 s after billing pause, want 1", name, v)
		}
	}
	for _, c := range r.running() {
		if code := c.get("/readyz"); code != http.StatusOK {
			r.t.Errorf("%s /readyz = %d while paused, want 200", c.name, code)
		}
	}
	time.Sleep(7 * time.Second)
	after, err := r.gauges("billing_consumer_group_generation")
	if err != nil {
		r.t.Errorf("generation at the resume: %v", err)
	}
	f.mu.Lock()
	f.genBefore, f.genAfter, f.pauseChecked = before, after, true
	f.resumed = time.Now()
	f.mu.Unlock()
	out, err = r.chargingCommand("resume", "chaos: the provider is fixed")
	f.mu.Lock()
	f.resumeOut = strings.TrimSpace(out)
	f.mu.Unlock()
	if err != nil {
		r.t.Errorf("billing resume: %v", err)
		return
	}
	r.t.Logf("[+%s] billing resume printed: %s", r.elapsed(), strings.ReplaceAll(strings.TrimSpace(out), "\n", "; "))
	r.faultOver()

	// A replica dies while the backlog is worked off; its share is the
	// survivors' once its lease expired.
	r.sleepUntil(f.resumed.Sub(r.start) + 8*time.Second)
	c := r.pick(r.rng("fleet-kill"))
	if c == nil {
		r.t.Errorf("kill -9: %v", errNotRunning)
		return
	}
	slot := r.slotOf(c)
	f.mu.Lock()
	f.killed, f.killedName = time.Now(), c.name
	f.mu.Unlock()
	r.fault("kill-9", "%s (pid %d), restarted 12 s later", c.name, c.pid())
	c.kill9()
	time.Sleep(12 * time.Second)
	f.mu.Lock()
	f.killedRestart = time.Now()
	f.mu.Unlock()
	r.startInSlot(slot)
	r.faultOver()
}

// fleetStats are the provider's counts the scenario judges.
type fleetStats struct {
	PeakPerSecond int64 `json:"peakPerSecond"`
	RateLimited   int64 `json:"rateLimited"`
}

// checkFleet judges the budget and the pause, and records the figures.
func checkFleet(r *run) {
	f := r.fleet
	var st fleetStats
	if err := r.psp.getJSON("/_stats", &st); err != nil {
		r.t.Errorf("provider stats: %v", err)
		return
	}
	if st.PeakPerSecond > fleetBudget {
		r.t.Errorf("busiest second at the provider: %d requests, over the budget of %d", st.PeakPerSecond, fleetBudget)
	}
	if st.RateLimited > 0 {
		r.t.Errorf("the provider answered 429 %d times", st.RateLimited)
	}

	f.mu.Lock()
	paused, resumed, killed, restarted := f.paused, f.resumed, f.killed, f.killedRestart
	before, after, checked := f.genBefore, f.genAfter, f.pauseChecked
	f.mu.Unlock()
	if !checked {
		r.t.Errorf("the pause was not checked")
		return
	}
	quiet := paused.Add(5 * time.Second)
	whilePaused := f.requestsAt(resumed) - f.requestsAt(quiet)
	if whilePaused != 0 {
		r.t.Errorf("%d requests reached the provider from 5 s after billing pause until billing resume", whilePaused)
	}
	for name, g := range before {
		if a, ok := after[name]; !ok || a != g || g == 0 {
			r.t.Errorf("%s: the group's generation was %v as the pause took hold and %v at its end, want it unchanged (no rebalance)", name, g, a)
		}
	}
	lastRequest := f.lastChange(paused, resumed).Sub(paused)

	// The survivors' rate over each second after the kill, every 100 ms,
	// until it reaches 90% of the budget.
	respread := time.Duration(0)
	for t := killed.Add(time.Second); t.Before(restarted); t = t.Add(100 * time.Millisecond) {
		if f.rate(t.Add(-time.Second), t) >= 0.9*fleetBudget {
			respread = t.Sub(killed)
			break
		}
	}
	first := r.start
	f.mu.Lock()
	for _, s := range f.samples {
		if s.requests > 0 {
			first = s.at
			break
		}
	}
	f.mu.Unlock()
	meanBefore := f.rate(first, paused)
	meanAfter := f.rate(resumed.Add(2*time.Second), killed)
	r.t.Logf(`fleet figures (seed %d): budget %d/s, three replicas
  billing pause: %s
  billing resume: %s
  busiest second at the provider: %d requests; 429s: %d
  mean while the backlog lasted: %.1f/s before the pause, %.1f/s after the resume (from 2 s after it to the kill)
  pause: the last request %s after billing pause began; %d requests from 5 s after it until billing resume %s after it; generation %v as it took hold, %v at its end
  kill -9 of %s: the survivors at 90%% of the budget again %s after it`,
		r.seed, fleetBudget, f.pauseOutput, f.resumeOut, st.PeakPerSecond, st.RateLimited, meanBefore, meanAfter,
		lastRequest.Round(100*time.Millisecond), whilePaused, resumed.Sub(paused).Round(100*time.Millisecond), before, after,
		f.killedName, respread.Round(100*time.Millisecond))
	r.figure("busiest second %d/%d, mean %.0f/s, last request %s after pause, %d while paused, re-spread %s after kill -9",
		st.PeakPerSecond, fleetBudget, meanBefore, lastRequest.Round(100*time.Millisecond), whilePaused, respread.Round(100*time.Millisecond))
}
