package payment

import (
	"errors"
	"sync"
	"time"
)

// ErrCircuitOpen: the provider failed repeatedly and is being left alone
// for a while; the charge was not sent. Transient: retry later.
var ErrCircuitOpen = errors.New("provider unavailable: circuit open, request not sent")

// breaker stops a process from hammering a provider that is down.
//
// Without it, every key whose charge failed retries on its own backoff
// schedule, and a provider that is down gets a request from each of them
// every few seconds, from every replica. After failureThreshold
// consecutive failures the breaker opens: calls fail at once
// without a request. When the cool-down has passed, one call goes through as
// a probe; its success closes the breaker, its failure reopens it with a
// doubled cool-down. Answers about the request (declined, rejected) are
// successes here: the provider is up.
type breaker struct {
	mu        sync.Mutex
	failures  int
	openUntil time.Time // zero when closed
	cooldown  time.Duration
	probing   bool
	now       func() time.Time
}

const (
	failureThreshold = 5
	minCooldown      = 500 * time.Millisecond
	maxCooldown      = 5 * time.Second
)

// allow reports whether a call may be sent now, and whether it is the probe
// of an open breaker.
func (b *breaker) allow() (ok, probe bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.openUntil.IsZero() {
		return true, false
	}
	if b.probing || b.now().Before(b.openUntil) {
		return false, false
	}
	b.probing = true
	return true, true
}

// release gives back an allowed call that was not sent (its wait for its
// turn ended, or its caller no longer wanted it): it says nothing of the
// provider's health, and a probe that was not sent lets the next call be
// the probe.
func (b *breaker) release(probe bool) {
	if !probe {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
}

// record records the result of an allowed call: healthy is false for an
// answer that says the provider is unavailable.
func (b *breaker) record(healthy, probe bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe {
		b.probing = false
	}
	if healthy {
		b.failures, b.openUntil, b.cooldown = 0, time.Time{}, 0
		return
	}
	b.failures++
	switch {
	case probe:
		b.cooldown = min(2*b.cooldown, maxCooldown)
	case b.failures >= failureThreshold && b.openUntil.IsZero():
		b.cooldown = minCooldown
	default:
		return
	}
	b.openUntil = b.now().Add(b.cooldown)
}
