package main

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"example.com/billing/internal/testenv/wait"
)

// TestServe_Walk runs docs/architecture.md's walk so that coverage can
// count it (make walk): one serve on one partition for walkFor, either
// idle (BILLING_WALK=idle) or charging one valid event through the
// contract provider, from its publication to its published outcome
// (BILLING_WALK=event). The statements the second run executes and the
// first does not are the event's path. Skipped without BILLING_WALK.
func TestServe_Walk(t *testing.T) {
	mode := os.Getenv("BILLING_WALK")
	switch mode {
	case "":
		t.Skip("BILLING_WALK is not set (make walk sets it)")
	case "idle", "event":
	default:
		t.Fatalf("BILLING_WALK=%q: want idle or event", mode)
	}
	const walkFor = 4 * time.Second
	h := newHarness(t, 1)
	s := h.serve(h.environ("LOG_LEVEL", "info"))
	started := time.Now()
	want := 0
	if mode == "event" {
		// Written by hand, not by order.New: the test's own calls into
		// production code would count as the path.
		value := fmt.Appendf(nil, `{"eventId":%q,"eventType":"order.confirmed.v1","occurredAt":%q,"orderId":1001,"customerId":42,"totalAmount":12.34,"currency":"EUR"}`,
			uuid.Must(uuid.NewV7()).String(), time.Now().UTC().Format(time.RFC3339Nano))
		h.publish(0, "1001", value)
		want = 1
	}
	// Both runs make the same probes (they call billing's kafka package
	// too), so that the difference is the event's.
	wait.For(t, walkFor, "the outcomes published", func() bool { return h.published() == want })
	h.waitCaughtUp()
	if n := len(h.psp.Charges()); n != want {
		t.Fatalf("the provider charged %d times, want %d", n, want)
	}
	if took := time.Since(started); took > walkFor {
		t.Fatalf("the run took %s, longer than the walk's %s: the idle run would not be as long", took, walkFor)
	}
	time.Sleep(time.Until(started.Add(walkFor)))
	s.stop(t)
}
