package payment

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// lateSlack is how late a waiter may wake for its gap and still keep the
// schedule: the next gap is counted from when this one was due, so that
// what the timer and the scheduler lose (a fraction of a millisecond a
// gap, more on a loaded machine) does not slow the rate down; a later
// wake starts the schedule over. It shifts a request by at most this
// much, well within the arrival jitter rpsMargin allows for.
const lateSlack = 2 * time.Millisecond

// errPaused: charging was paused while the request waited for its turn; it
// was not sent, and waits for the resume (Client.Charge asks again then).
var errPaused = errors.New("charging is paused: request not sent")

// pacer decides when each of the client's requests may leave: at most so
// many a second, and, while charging is paused, none that could create a
// payment.
//
// Requests leave at least 1/rate apart (a token bucket with a burst of one:
// no one-second window holds more than rate+1 of them), where rate is the
// lower of the process's cap (PAYMENT_MAX_RPS) and, when a fleet shares the
// provider account's budget (PAYMENT_ACCOUNT_MAX_RPS), this replica's share
// of it; both paced over rpsMargin. A share holds only until its lease
// ends, by this process's monotonic clock: past it the replica sends
// nothing until the share is renewed, since the other replicas may take it
// over once its lease has expired in the database.
//
// The rate is read when a request's turn comes, not when it began to wait:
// one caller at a time waits for the next gap (turn) and the others queue
// behind it. A token bucket that hands each waiter a reservation
// (rate.Limiter.Wait) would let a thousand waiters go at the rate in force
// when they arrived, seconds after the share shrank or lapsed.
type pacer struct {
	turn chan struct{} // held by the caller waiting for the next gap

	mu sync.Mutex
	// max is PAYMENT_MAX_RPS, 0 for none.
	max float64
	// shared: the account's budget is shared by a fleet, and no request
	// leaves without a share of it (share, until).
	shared bool
	share  float64
	until  time.Time
	paused bool
	// last is when the last request left.
	last time.Time
	// changed is closed and replaced whenever the share, its lease or the
	// pause change, to wake the waiters.
	changed chan struct{}
}

func newPacer(max float64, shared bool) *pacer {
	return &pacer{turn: make(chan struct{}, 1), max: max, shared: shared, changed: make(chan struct{})}
}

// setShare sets this replica's share of the account's budget, held until
// until (a time.Now()-based time, so compared by the monotonic clock).
func (p *pacer) setShare(rps float64, until time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.share, p.until = rps, until
	p.signal()
}

// setPaused holds back (or lets go again) every request that could create
// a payment.
func (p *pacer) setPaused(paused bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused != paused {
		p.paused = paused
		p.signal()
	}
}

func (p *pacer) isPaused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused
}

// signal wakes the waiters; p.mu is held.
func (p *pacer) signal() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// gap is the least time between two requests now; ok is false while no
// request may leave at all (a shared budget without a share in force).
// p.mu is held.
func (p *pacer) gap(now time.Time) (gap time.Duration, ok bool) {
	rate := p.max
	if p.shared {
		share := p.share
		if !now.Before(p.until) {
			share = 0
		}
		if share <= 0 {
			return 0, false
		}
		if rate == 0 || share < rate {
			rate = share
		}
	}
	if rate == 0 {
		return 0, true
	}
	return time.Duration(float64(time.Second) * rpsMargin / rate), true
}

// wait returns when a request may leave now, and counts it as left. A
// request that creates is refused with errPaused while charging is paused,
// also when the pause comes while it waits; ctx ending returns its error.
func (p *pacer) wait(ctx context.Context, creates bool) error {
	p.mu.Lock()
	unpaced := !p.shared && p.max == 0
	refused := creates && p.paused
	p.mu.Unlock()
	switch {
	case refused:
		return errPaused
	case unpaced:
		return nil
	}
	select {
	case p.turn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-p.turn }()
	for {
		p.mu.Lock()
		if creates && p.paused {
			p.mu.Unlock()
			return errPaused
		}
		now := time.Now()
		gap, ok := p.gap(now)
		next := p.last.Add(gap)
		if ok && !now.Before(next) {
			p.last = now
			if late := now.Sub(next); late <= lateSlack {
				p.last = next
			}
			p.mu.Unlock()
			return nil
		}
		changed := p.changed
		p.mu.Unlock()
		// A change (a new share, a pause) may move the next gap: look
		// again then. A share that lapses meanwhile is seen at the gap.
		var due <-chan time.Time
		var t *time.Timer
		if ok {
			t = time.NewTimer(next.Sub(now))
			due = t.C
		}
		select {
		case <-ctx.Done():
		case <-changed:
		case <-due:
		}
		if t != nil {
			t.Stop()
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// readyRecheck is how often a request held by a pause asks its caller
// whether it still wants it.
const readyRecheck = time.Second

// resumed returns once charging is not paused. While it is, ready (when
// not nil) is asked at once and every readyRecheck: a caller that no
// longer wants its request (its partition revoked, a drain) is not kept
// waiting for the resume (ErrNotSent), which would hold a drain for its
// whole timeout.
func (p *pacer) resumed(ctx context.Context, ready func() error) error {
	for {
		p.mu.Lock()
		paused, changed := p.paused, p.changed
		p.mu.Unlock()
		if !paused {
			return nil
		}
		var recheck <-chan time.Time
		if ready != nil {
			if err := ready(); err != nil {
				return Transient("not_sent", 0, fmt.Errorf("%w: %w", ErrNotSent, err))
			}
			recheck = time.After(readyRecheck)
		}
		select {
		case <-ctx.Done():
			return Transient("canceled", 0, ctx.Err())
		case <-changed:
		case <-recheck:
		}
	}
}
