package main

import (
	"strconv"
	"testing"
	"time"

	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/testenv/wait"
)

// /metrics after a run tells what happened: every message under one outcome,
// the DLQ by reason, the provider's answers, the retries, the rebalances, and
// a lag that follows the backlog down to zero and stays true while the
// partition is idle.
func TestMetrics_TellWhatHappened(t *testing.T) {
	h := newHarness(t, 2)
	h.psp.SetOptions(fakepsp.Options{DeclineEvery: 10})
	s := h.serve(h.environ())

	// The provider goes down: the events wait, the lag shows them.
	h.psp.SetDown(true)
	const n = 30
	for i := range int64(n) {
		orderID := 1 + i // 10, 20 and 30 are declined
		_, value := event(t, orderID, 1000+i, "EUR")
		h.publish(int32(i%2), strconv.FormatInt(orderID, 10), value)
	}
	h.publish(0, "bad", []byte("{not json"))
	_, dup := event(t, 501, 700, "EUR")
	h.publish(1, "501", dup)
	h.publish(1, "501", dup)

	wait.For(t, 20*time.Second, "lag to show the waiting events", func() bool {
		return s.metric(t, `billing_consumer_lag{partition="0"}`)+s.metric(t, `billing_consumer_lag{partition="1"}`) >= n
	})
	wait.For(t, 10*time.Second, "retries while the provider is down", func() bool {
		return s.metric(t, `billing_retries_total{cause="payment"}`) > 0 &&
			s.metric(t, `billing_payment_requests_total{result="server_error"}`) > 0
	})

	h.psp.SetDown(false)
	h.waitCaughtUp()
	// The partitions are idle now; the lag still comes down to zero.
	wait.For(t, 15*time.Second, "lag back to zero", func() bool {
		return s.metric(t, `billing_consumer_lag{partition="0"}`) == 0 && s.metric(t, `billing_consumer_lag{partition="1"}`) == 0
	})

	want := map[string]float64{
		`billing_events_total{outcome="charged"}`:                n - 3 + 1,
		`billing_events_total{outcome="declined"}`:               3,
		`billing_events_total{outcome="duplicate"}`:              1,
		`billing_events_total{outcome="invalid"}`:                1,
		`billing_events_total{outcome="already_charged"}`:        0,
		`billing_dlq_messages_total{reason="invalid-event"}`:     1,
		`billing_event_processing_seconds`:                       n + 3,
		`billing_event_latency_seconds`:                          n + 2,
		`billing_partitions_rebalanced_total{change="assigned"}`: 2,
		`billing_messages_retrying`:                              0,
	}
	for series, v := range want {
		if got := s.metric(t, series); got != v {
			t.Errorf("%s = %v, want %v", series, got, v)
		}
	}
	// A batch retried after the outage asks again for charges the provider
	// already made (and replays): requests are at least the outcomes, and
	// the provider made each charge once.
	if got := s.metric(t, `billing_payment_requests_total{result="charged"}`); got < n-3+1 {
		t.Errorf("charged requests = %v, want at least %d", got, n-3+1)
	}
	if got := s.metric(t, `billing_payment_requests_total{result="declined"}`); got < 3 {
		t.Errorf("declined requests = %v, want at least 3", got)
	}
	if st := h.psp.Stats(); st.ChargesCreated != n-3+1 || st.Declines != 3 {
		t.Errorf("provider created %d charges and %d declines, want %d and 3", st.ChargesCreated, st.Declines, n-3+1)
	}
	if got := s.metric(t, `go_sql_max_open_connections{db_name="billing"}`); got != 16 {
		t.Errorf("database pool size metric = %v, want 16", got)
	}
	if got := s.metric(t, `billing_dedup_partitions`); got < 11 {
		t.Errorf("dedup partitions = %v, want at least 11", got)
	}
}
