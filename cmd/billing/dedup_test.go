package main

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"example.com/billing/internal/dlq"
	"example.com/billing/internal/order"
	"example.com/billing/internal/testenv/kafkatest"
	"example.com/billing/internal/testenv/wait"
)

func TestServe_StaleAndTamperedEventsAreParkedUncharged(t *testing.T) {
	h := newHarness(t, 1)
	s := h.serve(h.environ())

	ev, value := event(t, 300, 1200, "EUR")
	h.publish(0, "300", value)
	tampered := ev
	tampered.Amount.Minor = 1 // same eventId, another payload
	tamperedValue, err := tampered.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	h.publish(0, "300", tamperedValue)

	staleID, err := order.NewIDAt(time.Now().Add(-9 * 24 * time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	stale, _ := event(t, 301, 1200, "EUR")
	stale.ID = staleID
	staleValue, err := stale.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	h.publish(0, "301", staleValue)
	h.waitCaughtUp()

	if st := h.psp.Stats(); st.Requests != 1 || st.ChargesCreated != 1 {
		t.Fatalf("provider stats %+v: only the first event may reach it", st)
	}
	reasons := map[string]string{}
	for _, m := range kafkatest.ReadAll(t, h.client, h.broker.DLQTopic) {
		reasons[string(m.Value)] = kafkatest.Header(m, dlq.HeaderReason)
	}
	if r := reasons[string(tamperedValue)]; !strings.HasPrefix(r, "payload-mismatch: ") {
		t.Errorf("tampered event reason %q, want payload-mismatch", r)
	}
	if r := reasons[string(staleValue)]; !strings.HasPrefix(r, "stale-event: ") {
		t.Errorf("stale event reason %q, want stale-event", r)
	}
	wait.For(t, 5*time.Second, "dlq metrics", func() bool {
		return s.metric(t, `billing_dlq_messages_total{reason="payload-mismatch"}`) == 1 &&
			s.metric(t, `billing_dlq_messages_total{reason="stale-event"}`) == 1
	})
}

func TestServe_RefusesADedupRetentionShorterThanTheTopics(t *testing.T) {
	month := strconv.FormatInt((30 * 24 * time.Hour).Milliseconds(), 10)
	h := newHarness(t, 1, kafkatest.TopicConfig(map[string]string{"retention.ms": month}))

	env := h.environ()
	var logs syncBuffer
	err := run(t.Context(), []string{"billing", "serve"}, env, nil, &logs, &logs)
	if err == nil || !strings.Contains(err.Error(), "DEDUP_RETENTION") || !strings.Contains(err.Error(), "DEDUP_ALLOW_SHORT_RETENTION") {
		t.Fatalf("serve = %v, want a refusal naming DEDUP_RETENTION and the override", err)
	}

	// The operator accepts it explicitly: serve starts, says so loudly, and
	// the metric shows the shortfall.
	s := h.serve(h.environ("DEDUP_ALLOW_SHORT_RETENTION", "true"))
	if got := s.metric(t, "billing_dedup_retention_shortfall_seconds"); got != (23 * 24 * time.Hour).Seconds() {
		t.Errorf("shortfall metric = %v, want 23 days", got)
	}
	if !strings.Contains(s.logs.String(), `"level":"ERROR"`) {
		t.Errorf("no error logged about the short retention")
	}

	// With a retention that covers the topic, no complaint.
	s.stop(t)
	s = h.serve(h.environ("DEDUP_RETENTION", "720h"))
	if got := s.metric(t, "billing_dedup_retention_shortfall_seconds"); got != 0 {
		t.Errorf("shortfall metric = %v, want 0", got)
	}
}

func TestMaintain_CreatesAheadDropsExpiredAndReports(t *testing.T) {
	h := newHarness(t, 1)
	if _, err := h.db.Exec(`SELECT ensure_processed_event_partition((now() AT TIME ZONE 'UTC')::date - 40)`); err != nil {
		t.Fatal(err)
	}
	var out, logs bytes.Buffer
	env := map[string]string{"DATABASE_URL": h.dsn, "DEDUP_PARTITIONS_AHEAD": "5"}
	if err := run(t.Context(), []string{"billing", "maintain"}, env, nil, &out, &logs); err != nil {
		t.Fatalf("maintain: %v\n%s", err, logs.String())
	}
	var rep struct {
		Created    []string `json:"created"`
		Dropped    []string `json:"dropped"`
		Partitions int      `json:"partitions"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("report %q: %v", out.String(), err)
	}
	if len(rep.Dropped) != 1 || len(rep.Created) != 2 {
		t.Errorf("report %+v: want the 40-day-old partition dropped and days 4 and 5 ahead created", rep)
	}
	if rep.Partitions != 8+5 {
		t.Errorf("partitions = %d, want 13 (7 back, today, 5 ahead)", rep.Partitions)
	}
	if !strings.Contains(logs.String(), "DEDUP_PARTITIONS_AHEAD is an earlier name of PARTITIONS_AHEAD") {
		t.Errorf("maintain read DEDUP_PARTITIONS_AHEAD without naming PARTITIONS_AHEAD:\n%s", logs.String())
	}
	if err := run(t.Context(), []string{"billing", "maintain"}, map[string]string{"DATABASE_URL": h.dsn, "DEDUP_RETENTION": "1h"}, nil, &out, &logs); err == nil || !strings.Contains(err.Error(), "DEDUP_RETENTION") {
		t.Errorf("maintain with a 1h retention = %v, want an error naming DEDUP_RETENTION", err)
	}
}
