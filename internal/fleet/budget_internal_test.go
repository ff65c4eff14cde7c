package fleet

import (
	"math"
	"testing"
	"time"
)

func TestShareOf(t *testing.T) {
	tests := []struct {
		name   string
		budget float64
		others []float64
		want   float64
	}{
		{"OK_Alone", 100, nil, 100},
		{"OK_EqualPartOfThree", 90, []float64{30, 30}, 30},
		{"OK_JoinerTakesWhatIsFree", 100, []float64{50, 50}, 0},
		{"OK_JoinerTakesPartOfWhatIsFree", 100, []float64{40, 50}, 10},
		{"OK_GrowsToItsPartAsTheOthersShrink", 100, []float64{33, 33}, 33},
		{"OK_AfterADeath", 100, []float64{33}, 50},
		{"OK_WholeRequests", 10, []float64{3}, 5},
		{"OK_WholeRequestsOfAFractionalBudget", 56.25, []float64{18, 18}, 18},
		{"OK_NothingWhenTheOthersHoldMoreThanACutBudget", 75, []float64{50, 50}, 0},
		{"OK_NothingFreeOfACutBudget", 75, []float64{25, 50}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := shareOf(tt.budget, tt.others)
			if math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("shareOf(%v, %v) = %v, want %v", tt.budget, tt.others, got, tt.want)
			}
			sum := got
			for _, o := range tt.others {
				sum += o
			}
			if got > 0 && sum > tt.budget+1e-9 {
				t.Errorf("the shares sum to %v, over the budget %v", sum, tt.budget)
			}
		})
	}
}

// Three replicas renewing in turn, one joining late and one dying: the
// shares recorded never sum above the budget, and they settle on equal
// parts within two rounds.
func TestShareOf_Rounds(t *testing.T) {
	const budget = 100.0
	shares := map[string]float64{"a": 0, "b": 0}
	round := func(names ...string) {
		for _, n := range names {
			var others []float64
			for o, s := range shares {
				if o != n {
					others = append(others, s)
				}
			}
			shares[n] = shareOf(budget, others)
			sum := 0.0
			for _, s := range shares {
				sum += s
			}
			if sum > budget+1e-9 {
				t.Fatalf("after %s renewed the shares %v sum to %v", n, shares, sum)
			}
		}
	}
	round("a", "b")
	round("a", "b")
	if shares["a"] != 50 || shares["b"] != 50 {
		t.Fatalf("two replicas: %v, want 50 each", shares)
	}
	shares["c"] = 0
	round("c", "a", "b")
	round("c", "a", "b")
	for n, s := range shares {
		if s != 33 {
			t.Errorf("three replicas after two rounds: %s holds %v, want 33 (a third, in whole requests)", n, s)
		}
	}
	delete(shares, "b")
	round("a", "c")
	round("a", "c")
	if shares["a"] != 50 || shares["c"] != 50 {
		t.Errorf("after a death: %v, want 50 each", shares)
	}
}

func TestCeilingOf(t *testing.T) {
	tests := []struct {
		name   string
		own    float64
		others []float64
		want   float64
	}{
		{"OK_Own", 100, nil, 100},
		{"OK_AgreeingOthers", 100, []float64{100, 100}, 100},
		{"OK_LowerOtherWins", 100, []float64{80, 100}, 80},
		{"OK_HigherOtherIgnored", 100, []float64{120}, 100},
		{"OK_OtherWithoutALimitIgnored", 100, []float64{0}, 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ceilingOf(tt.own, tt.others); got != tt.want {
				t.Errorf("ceilingOf(%v, %v) = %v, want %v", tt.own, tt.others, got, tt.want)
			}
		})
	}
}

func TestAdjust(t *testing.T) {
	now := time.Date(2026, 12, 10, 12, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	tests := []struct {
		name    string
		b       budget
		ceiling float64
		limited bool
		want    budget
	}{
		{"OK_Steady", budget{RPS: 100}, 100, false, budget{RPS: 100}},
		{"OK_FirstCut", budget{RPS: 100}, 100, true, budget{RPS: 75, LimitedAt: now, CutAt: now}},
		{"OK_NoSecondCutWithinTheSpacing", budget{RPS: 75, LimitedAt: ago(time.Second), CutAt: ago(time.Second)}, 100, true,
			budget{RPS: 75, LimitedAt: now, CutAt: ago(time.Second)}},
		{"OK_CutAgainAfterTheSpacing", budget{RPS: 75, LimitedAt: ago(cutSpacing), CutAt: ago(cutSpacing)}, 100, true,
			budget{RPS: 56.25, LimitedAt: now, CutAt: now}},
		{"OK_NeverBelowTheFloor", budget{RPS: 11, CutAt: ago(time.Minute)}, 100, true, budget{RPS: 10, LimitedAt: now, CutAt: now}},
		{"OK_NotRaisedBeforeTheQuietPeriod", budget{RPS: 50, LimitedAt: ago(quiet - time.Second)}, 100, false,
			budget{RPS: 50, LimitedAt: ago(quiet - time.Second)}},
		{"OK_RaisedAStepAfterTheQuietPeriod", budget{RPS: 50, LimitedAt: ago(quiet)}, 100, false,
			budget{RPS: 55, LimitedAt: ago(quiet), RaisedAt: now}},
		{"OK_OneStepASecond", budget{RPS: 55, LimitedAt: ago(quiet), RaisedAt: ago(raiseSpacing / 2)}, 100, false,
			budget{RPS: 55, LimitedAt: ago(quiet), RaisedAt: ago(raiseSpacing / 2)}},
		{"OK_NeverAboveTheCeiling", budget{RPS: 98, LimitedAt: ago(time.Hour)}, 100, false, budget{RPS: 100, LimitedAt: ago(time.Hour), RaisedAt: now}},
		{"OK_ALoweredCeilingAppliesAtOnce", budget{RPS: 100}, 80, false, budget{RPS: 80}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := adjust(tt.b, tt.ceiling, tt.limited, now); got != tt.want {
				t.Errorf("adjust(%+v, %v, %v) = %+v, want %+v", tt.b, tt.ceiling, tt.limited, got, tt.want)
			}
		})
	}
}
