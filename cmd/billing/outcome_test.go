package main

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/order"
	"example.com/billing/internal/testenv/kafkatest"
	"example.com/billing/internal/testenv/wait"
)

// outcomeEvent is a payments.settled value as the order service reads it.
type outcomeEvent struct {
	EventID          string          `json:"eventId"`
	EventType        string          `json:"eventType"`
	OccurredAt       time.Time       `json:"occurredAt"`
	CausationID      string          `json:"causationId"`
	OrderID          int64           `json:"orderId"`
	CustomerID       int64           `json:"customerId"`
	TotalAmount      json.RawMessage `json:"totalAmount"`
	Currency         string          `json:"currency"`
	ProviderChargeID string          `json:"providerChargeId"`
	DeclineCode      string          `json:"declineCode"`
	Reason           string          `json:"reason"`
}

// outcomes waits until n outcome events are on h's outcome topic and
// returns them by causation id, with their records.
func (h *harness) outcomes(n int) (map[string]outcomeEvent, []*sarama.ConsumerMessage) {
	h.t.Helper()
	var msgs []*sarama.ConsumerMessage
	wait.For(h.t, 30*time.Second, strconv.Itoa(n)+" outcome events", func() bool {
		msgs = kafkatest.ReadAll(h.t, h.client, h.broker.OutcomeTopic)
		return len(msgs) >= n
	})
	out := map[string]outcomeEvent{}
	for _, m := range msgs {
		var o outcomeEvent
		dec := json.NewDecoder(strings.NewReader(string(m.Value)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&o); err != nil {
			h.t.Fatalf("outcome value %s: %v", m.Value, err)
		}
		if prev, dup := out[o.CausationID]; dup && prev.EventID != o.EventID {
			h.t.Errorf("two outcome events for order event %s: %s and %s", o.CausationID, prev.EventID, o.EventID)
		}
		if string(m.Key) != strconv.FormatInt(o.OrderID, 10) {
			h.t.Errorf("outcome of order %d keyed %q", o.OrderID, m.Key)
		}
		out[o.CausationID] = o
	}
	if len(msgs) != n {
		h.t.Errorf("%d outcome events published, want %d", len(msgs), n)
	}
	return out, msgs
}

// Every settled order event yields one payment outcome event on
// payments.settled, keyed by the order id, with the contract's fields: the
// charged ones succeeded with the provider's charge id, the declined ones
// declined with the provider's code, an event parked after it was decoded
// failed with the reason; invalid and duplicate messages yield none.
func TestServe_PublishesOneOutcomeEventPerSettledEvent(t *testing.T) {
	h := newHarness(t, 2)
	h.psp.SetOptions(fakepsp.Options{DeclineEvery: 5, Seed: 1})
	s := h.serve(h.environ())

	type sent struct {
		ev      order.Event
		outcome string
	}
	// The order events carry their producer's trace: the outcome continues it.
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	trace := []sarama.RecordHeader{{Key: []byte("traceparent"), Value: []byte("00-" + traceID + "-00f067aa0ba902b7-01")}}
	var events []sent
	for i := range int64(10) {
		ev, value := event(t, 40+i, 1000+i, []string{"EUR", "JPY", "KWD"}[i%3])
		key := []byte(strconv.FormatInt(ev.OrderID, 10))
		kafkatest.Produce(t, h.client, h.broker.Topic,
			kafkatest.Message{Partition: int32(i % 2), Key: key, Value: value, Headers: trace},
			kafkatest.Message{Partition: int32((i + 1) % 2), Key: key, Value: value, Headers: trace}) // a duplicate elsewhere
		typ := "payment.succeeded.v1"
		if ev.OrderID%5 == 0 {
			typ = "payment.declined.v1"
		}
		events = append(events, sent{ev, typ})
	}
	// Decoded but older than the dedup retention: parked, announced failed.
	stale, staleValue := event(t, 77, 500, "EUR")
	id, err := order.NewIDAt(time.Now().Add(-8 * 24 * time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	staleValue = []byte(strings.Replace(string(staleValue), stale.ID.String(), id.String(), 1))
	stale.ID = id
	h.publish(0, "77", staleValue)
	h.publish(0, "78", []byte("{not an event"))
	h.waitCaughtUp()

	got, msgs := h.outcomes(len(events) + 1)
	charges := map[string]string{}
	for _, c := range h.psp.Charges() {
		charges[c.IdempotencyKey] = c.ID
	}
	for _, e := range events {
		o, ok := got[e.ev.ID.String()]
		if !ok {
			t.Errorf("no outcome event for order event %s", e.ev.ID)
			continue
		}
		if o.EventType != e.outcome || o.OrderID != e.ev.OrderID || o.CustomerID != e.ev.CustomerID ||
			string(o.TotalAmount) != e.ev.Amount.Decimal() || o.Currency != e.ev.Amount.Currency {
			t.Errorf("outcome %+v (amount %s), want %s of order %d for %s %s", o, o.TotalAmount, e.outcome, e.ev.OrderID, e.ev.Amount.Decimal(), e.ev.Amount.Currency)
		}
		switch e.outcome {
		case "payment.succeeded.v1":
			if o.ProviderChargeID == "" || o.ProviderChargeID != charges[e.ev.ID.String()] {
				t.Errorf("succeeded outcome carries charge %q, the provider made %q", o.ProviderChargeID, charges[e.ev.ID.String()])
			}
		case "payment.declined.v1":
			if o.DeclineCode != "generic_decline" {
				t.Errorf("declined outcome carries decline code %q, want the provider's", o.DeclineCode)
			}
		}
		if time.Since(o.OccurredAt) > time.Minute || o.OccurredAt.After(time.Now()) {
			t.Errorf("occurredAt %s is not when it settled", o.OccurredAt)
		}
	}
	if o := got[stale.ID.String()]; o.EventType != "payment.failed.v1" || o.Reason != "stale-event" || o.OrderID != 77 {
		t.Errorf("stale event's outcome %+v, want payment.failed.v1 with reason stale-event", o)
	}
	for _, m := range msgs {
		if string(m.Key) == "77" {
			continue // published without a trace
		}
		if tp := kafkatest.Header(m, "traceparent"); !strings.Contains(tp, traceID) {
			t.Errorf("outcome of order %s has traceparent %q, want the order event's trace %s", m.Key, tp, traceID)
		}
	}
	if got := h.count(`SELECT count(*) FROM outbox`); got != 0 {
		t.Errorf("%d outbox rows left once every outcome is published, want 0 (the relay deletes what the broker acknowledged)", got)
	}
	wait.For(t, 10*time.Second, "outbox metrics", func() bool {
		return s.metric(t, `billing_outbox_published_total{event_type="payment.succeeded.v1"}`) == 8 &&
			s.metric(t, `billing_outbox_published_total{event_type="payment.declined.v1"}`) == 2 &&
			s.metric(t, `billing_outbox_published_total{event_type="payment.failed.v1"}`) == 1 &&
			s.metric(t, `billing_outbox_pending`) == 0
	})
	if code, _ := get(s.addr, "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz = %d", code)
	}
}
