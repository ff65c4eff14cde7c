package fleet

import (
	"math"
	"time"
)

// How the provider's 429s move the group's budget: a cut by a quarter at
// each report of 429s, never below a tenth of PAYMENT_ACCOUNT_MAX_RPS, and
// a twentieth of it back every second once none came for a quiet period.
const (
	cutFactor = 0.75
	floorPart = 0.1
	raiseStep = 0.05
	// cutSpacing: the 429s reported within it after a cut were answered
	// to requests sent before every replica renewed under the cut (each
	// renews every Interval), so they are the same signal, not a new one.
	cutSpacing = 2 * time.Second
	// quiet is how long after the last 429 the budget starts to grow
	// back; raiseSpacing how often it grows a step.
	quiet        = 10 * time.Second
	raiseSpacing = time.Second
)

// budget is a group's row of payment_budget.
type budget struct {
	RPS float64 `db:"rps"`
	// LimitedAt is when a replica last reported 429s, CutAt when 429s last
	// cut the budget, RaisedAt when it last grew a step; zero: never.
	LimitedAt time.Time `db:"limited_at"`
	CutAt     time.Time `db:"cut_at"`
	RaisedAt  time.Time `db:"raised_at"`
}

// adjust returns b as of now, under ceiling (the lowest
// PAYMENT_ACCOUNT_MAX_RPS of the live members), when the renewing replica
// saw 429s since its last renewal (limited) or not. A ceiling raised since
// (every replica restarted with a higher limit) is approached step by
// step, as after 429s.
func adjust(b budget, ceiling float64, limited bool, now time.Time) budget {
	floor := ceiling * floorPart
	switch {
	case limited:
		b.LimitedAt = now
		if now.Sub(b.CutAt) >= cutSpacing {
			b.RPS, b.CutAt = b.RPS*cutFactor, now
		}
	case b.RPS < ceiling && now.Sub(b.LimitedAt) >= quiet && now.Sub(b.RaisedAt) >= raiseSpacing:
		b.RPS, b.RaisedAt = b.RPS+ceiling*raiseStep, now
	}
	b.RPS = min(max(b.RPS, floor), ceiling)
	return b
}

// ceilingOf is the budget's bound: the lowest PAYMENT_ACCOUNT_MAX_RPS of
// own and the others' that set one (0: none), so that a lowered limit
// applies as soon as one replica runs with it.
func ceilingOf(own float64, others []float64) float64 {
	c := own
	for _, o := range others {
		if o > 0 && o < c {
			c = o
		}
	}
	return c
}

// shareOf is what a replica may take of budget while the live others hold
// the shares others: an equal part of it, but never more than they leave,
// in whole requests a second. A replica that joins thus starts with what
// is free and grows at its next renewals, as the others shrink to their
// equal parts at theirs.
//
// Whole, because a replica paced at s a second (over rpsMargin, which
// absorbs arrival jitter) puts up to ceil(s) requests in a one-second
// window: whole shares that sum to the budget stay within it in every
// window, where fractional ones could each round up by one.
func shareOf(budget float64, others []float64) float64 {
	free := budget
	for _, s := range others {
		free -= s
	}
	return max(0, math.Floor(min(budget/float64(len(others)+1), free)))
}
