package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/dlq"
	"example.com/billing/internal/testenv/kafkatest"
	"example.com/billing/internal/testenv/wait"
)

// dlqReplay runs `billing dlq replay args...` and returns its stdout. A
// replay that publishes says why, as an operator must: args without
// --reason (or with --dry-run) get one.
func dlqReplay(t *testing.T, env map[string]string, args ...string) string {
	t.Helper()
	if !slices.Contains(args, "--reason") && !slices.Contains(args, "--dry-run") {
		args = append(args, "--reason", "a test replays what it parked")
	}
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), append([]string{"billing", "dlq", "replay"}, args...), env, nil, &stdout, &stderr)
	t.Logf("billing dlq replay %s\n%s", strings.Join(args, " "), stdout.String())
	if err != nil {
		t.Fatalf("billing dlq replay %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

func TestDLQReplay_AfterTheProviderIsFixed(t *testing.T) {
	h := newHarness(t, 2)
	// The provider sits behind a switch, so that the test can replace it
	// with a fixed one at the same address, as an operator's fix would.
	var psp atomic.Pointer[fakepsp.Server]
	psp.Store(h.psp)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { psp.Load().ServeHTTP(w, r) }))
	t.Cleanup(srv.Close)
	env := h.environ("PAYMENT_BASE_URL", srv.URL)
	s := h.serve(env)

	// The provider already holds the rejected event's key with another
	// body: 422, parked as provider-rejected.
	rejected, rejectedValue := event(t, 41, 4100, "EUR")
	if code := postCharge(t, srv.URL, "", 41, rejected.ID.String()); code != http.StatusOK {
		t.Fatalf("seed provider: %d", code)
	}
	_, okValue := event(t, 42, 4200, "EUR")
	h.publish(0, "41", rejectedValue)
	h.publish(1, "bad", []byte(`{"eventId":"oops"}`))
	h.publish(1, "42", okValue)
	h.waitCaughtUp()
	if got := len(kafkatest.ReadAll(t, h.client, h.broker.DLQTopic)); got != 2 {
		t.Fatalf("DLQ holds %d messages, want 2", got)
	}
	topicEnd := kafkatest.EndOffsets(t, h.client, h.broker.Topic)

	// The operator fixes the provider.
	fixed := fakepsp.New(fakepsp.Options{Seed: 2})
	psp.Store(fixed)

	out := dlqReplay(t, env, "--code", "provider-rejected", "--dry-run")
	if !strings.Contains(out, "would replay "+h.broker.DLQTopic+"/") || !strings.Contains(out, `key="41" -> `+h.broker.Topic+`/0 reason="provider-rejected: `) ||
		!strings.Contains(out, "dry run: would replay 1, passed over 1") || strings.Contains(out, "oops") {
		t.Errorf("dry run output:\n%s", out)
	}
	if end := kafkatest.EndOffsets(t, h.client, h.broker.Topic); end[0] != topicEnd[0] || end[1] != topicEnd[1] {
		t.Fatalf("dry run published: end offsets %v, were %v", end, topicEnd)
	}

	out = dlqReplay(t, env, "--code", "provider-rejected")
	if !strings.Contains(out, "replayed 1, passed over 1 with another reason") {
		t.Errorf("replay output:\n%s", out)
	}
	h.waitCaughtUp()
	if st := fixed.Stats(); st.ChargesCreated != 1 || st.OrdersChargedTwice != 0 {
		t.Errorf("fixed provider: %+v, want one charge", st)
	}
	if got := h.count(`SELECT count(*) FROM charge WHERE order_id = 41 AND status = 'succeeded' AND event_id = $1`, rejected.ID.String()); got != 1 {
		t.Errorf("order 41 has %d succeeded rows of its event, want 1", got)
	}

	// A second run finds nothing left for its group.
	if out := dlqReplay(t, env, "--code", "provider-rejected"); !strings.Contains(out, "replayed 0") {
		t.Errorf("second replay output:\n%s", out)
	}

	// An invalid event, replayed, is parked again and counted.
	dlqReplay(t, env, "--code", "invalid-event")
	h.waitCaughtUp()
	parked := kafkatest.ReadAll(t, h.client, h.broker.DLQTopic)
	if len(parked) != 3 {
		t.Fatalf("DLQ holds %d messages, want 3", len(parked))
	}
	var again int
	for _, m := range parked {
		if from := kafkatest.Header(m, dlq.HeaderReplayedFrom); from != "" {
			again++
			if !strings.HasPrefix(kafkatest.Header(m, dlq.HeaderReason), "invalid-event: ") || string(m.Key) != "bad" {
				t.Errorf("parked again: key %s, reason %q", m.Key, kafkatest.Header(m, dlq.HeaderReason))
			}
		}
	}
	if again != 1 {
		t.Errorf("%d parked messages carry %s, want 1", again, dlq.HeaderReplayedFrom)
	}

	// The charged event replayed once more (another group) is a duplicate.
	dlqReplay(t, env, "--code", "provider-rejected", "--group", "ops-second-look")
	h.waitCaughtUp()
	wait.For(t, 10*time.Second, "metrics", func() bool {
		return s.metric(t, `billing_events_total{outcome="duplicate"}`) == 1 &&
			s.metric(t, `billing_events_total{outcome="charged"}`) == 2 &&
			s.metric(t, `billing_dlq_messages_total{reason="invalid-event"}`) == 2 &&
			s.metric(t, `billing_dlq_messages_total{reason="provider-rejected"}`) == 1
	})
	if st := fixed.Stats(); st.ChargesCreated != 1 || st.Requests != 1 {
		t.Errorf("fixed provider after the duplicate: %+v, want one request, one charge", st)
	}
}

func TestDLQReplay_Flags(t *testing.T) {
	env := map[string]string{"KAFKA_BROKERS": "127.0.0.1:1", "DATABASE_URL": "postgres://billing@127.0.0.1:1/billing"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "a command is required"},
		{[]string{"purge"}, `unknown command "purge"`},
		{[]string{"replay", "--code", "provider-rejeted"}, "not a reason code"},
		{[]string{"replay", "--reason", "provider-rejected"}, "--code provider-rejected replays the messages parked for it"},
		{[]string{"replay", "--code", "provider-rejected"}, "--reason is required"},
		{[]string{"replay", "--max", "-1"}, "--max"},
		{[]string{"replay", "--group", "billing-order-confirmed", "--reason", "why"}, "the service's own group"},
		{[]string{"replay", "now"}, "takes no arguments"},
	} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), append([]string{"billing", "dlq"}, tc.args...), env, nil, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("dlq %v: err = %v, want %q", tc.args, err, tc.want)
		}
	}
	var stdout bytes.Buffer
	if err := run(context.Background(), []string{"billing", "dlq", "replay", "-h"}, env, nil, &stdout, &stdout); err != nil ||
		!strings.Contains(stdout.String(), "Usage: billing dlq replay") || !strings.Contains(stdout.String(), "-dry-run") {
		t.Errorf("dlq replay -h: %v\n%s", err, stdout.String())
	}
}
