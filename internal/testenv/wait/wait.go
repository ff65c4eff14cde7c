// Package wait is the tests' one way to wait for something that happens
// eventually (a commit, a rebalance, a metric): poll it, and fail the test
// with what was awaited when it does not happen in time.
package wait

import (
	"testing"
	"time"
)

// interval is how often a condition is polled: short against the seconds a
// test waits, long enough that a condition reading the database or
// /metrics does not load the machine.
const interval = 25 * time.Millisecond

// For polls cond until it holds and fails t, naming what, when it does not
// within timeout.
func For(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(interval)
	}
}
