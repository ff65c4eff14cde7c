package main

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/dlq"
	"example.com/billing/internal/testenv/kafkatest"
	"example.com/billing/internal/testenv/wait"
)

func TestServe_ChargesEveryEventOnce(t *testing.T) {
	h := newHarness(t, 3)
	s := h.serve(h.environ())

	const n = 60
	want := map[int64]fakepsp.Charge{}
	for i := range int64(n) {
		orderID := 100 + i
		currency, minor := "EUR", 1000+i
		if i%3 == 1 {
			currency, minor = "JPY", 500+i
		}
		if i%3 == 2 {
			currency, minor = "KWD", 12345+i
		}
		_, value := event(t, orderID, minor, currency)
		h.publish(int32(i%3), strconv.FormatInt(orderID, 10), value)
		want[orderID] = fakepsp.Charge{OrderID: orderID, CustomerID: 1000 + orderID, Amount: minor, Currency: currency}
	}
	h.waitCaughtUp()

	charges := h.psp.Charges()
	if len(charges) != n {
		t.Fatalf("provider charges = %d, want %d", len(charges), n)
	}
	for _, c := range charges {
		w := want[c.OrderID]
		if c.Amount != w.Amount || c.Currency != w.Currency || c.CustomerID != w.CustomerID {
			t.Errorf("order %d charged %d %s to customer %d, want %d %s to %d", c.OrderID, c.Amount, c.Currency, c.CustomerID, w.Amount, w.Currency, w.CustomerID)
		}
	}
	if got := h.count(`SELECT count(*) FROM charge WHERE status = 'succeeded'`); got != n {
		t.Errorf("succeeded charge rows = %d, want %d", got, n)
	}
	if got := h.count(`SELECT count(*) FROM processed_event`); got != n {
		t.Errorf("processed_event rows = %d, want %d", got, n)
	}
	var rows []struct {
		OrderID  int64  `db:"order_id"`
		Amount   int64  `db:"amount_minor"`
		Currency string `db:"currency"`
	}
	if err := h.db.Select(&rows, `SELECT order_id, amount_minor, currency FROM charge`); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if w := want[r.OrderID]; r.Amount != w.Amount || r.Currency != w.Currency {
			t.Errorf("charge row of order %d: %d %s, want %d %s", r.OrderID, r.Amount, r.Currency, w.Amount, w.Currency)
		}
	}
	wait.For(t, 5*time.Second, "charged metric", func() bool {
		return s.metric(t, `billing_events_total{outcome="charged"}`) == n
	})
	if got := s.metric(t, `billing_payment_requests_total{result="charged"}`); got != n {
		t.Errorf("payment charged requests = %v, want %d", got, n)
	}
	if got := len(kafkatest.ReadAll(t, h.client, h.broker.DLQTopic)); got != 0 {
		t.Errorf("DLQ holds %d messages, want 0", got)
	}
}

func TestServe_DuplicatesInOneAndInDifferentPartitionsAreSkipped(t *testing.T) {
	h := newHarness(t, 3)
	h.psp.SetOptions(fakepsp.Options{Latency: 20 * time.Millisecond, Seed: 1})
	s := h.serve(h.environ())

	const orders = 20
	for i := range int64(orders) {
		orderID := 500 + i
		_, value := event(t, orderID, 2500, "EUR")
		key := []byte(strconv.FormatInt(orderID, 10))
		// The same bytes three times: twice in one partition, once in
		// another, as a redelivering producer or a replay would.
		kafkatest.Produce(t, h.client, h.broker.Topic,
			kafkatest.Message{Partition: 0, Key: key, Value: value},
			kafkatest.Message{Partition: 0, Key: key, Value: value},
			kafkatest.Message{Partition: 1 + int32(i%2), Key: key, Value: value},
		)
	}
	h.waitCaughtUp()

	st := h.psp.Stats()
	if st.ChargesCreated != orders || st.OrdersChargedTwice != 0 {
		t.Fatalf("provider created %d charges (%d orders twice), want %d and 0", st.ChargesCreated, st.OrdersChargedTwice, orders)
	}
	// The partition-0 duplicate never reaches the provider: it has the
	// first copy's key, so the consumer hands it to billing only once the
	// first copy is finished, and its claim finds the event processed. The
	// copy racing from another partition is skipped, or, meeting the first
	// copy's attempt still pending, asks again under the same key (answered
	// from the provider's store or with 409 while in flight): never a
	// second charge.
	if extra := st.Requests - orders; extra > st.Conflicts+st.Replays || st.Replays+st.Conflicts > orders*2 {
		t.Errorf("provider saw %d requests for %d orders (%d replays, %d conflicts): duplicates reached it", st.Requests, orders, st.Replays, st.Conflicts)
	}
	wait.For(t, 5*time.Second, "metrics", func() bool {
		return s.metric(t, `billing_events_total{outcome="charged"}`) == orders &&
			s.metric(t, `billing_events_total{outcome="duplicate"}`) == 2*orders
	})
	if got := h.count(`SELECT count(*) FROM charge`); got != orders {
		t.Errorf("charge rows = %d, want %d", got, orders)
	}
}

func TestServe_RedeliveryAfterCrashBeforeOffsetCommitIsSkipped(t *testing.T) {
	h := newHarness(t, 2)
	s := h.serve(h.environ())
	const n = 10
	for i := range int64(n) {
		_, value := event(t, 700+i, 990, "EUR")
		h.publish(int32(i%2), strconv.FormatInt(700+i, 10), value)
	}
	h.waitCaughtUp()
	s.stop(t)
	requests := h.psp.Stats().Requests

	// The charges are committed in PostgreSQL; now lose the offset commits,
	// as a crash between the database commit and the offset commit would.
	kafkatest.ResetOffsets(t, h.client, h.broker.Group, h.broker.Topic, 0)

	s2 := h.serve(h.environ())
	h.waitCaughtUp()
	if got := h.psp.Stats().Requests; got != requests {
		t.Errorf("redelivered events made %d more provider calls, want 0", got-requests)
	}
	if got := s2.metric(t, `billing_events_total{outcome="duplicate"}`); got != n {
		t.Errorf("duplicates = %v, want %d", got, n)
	}
	if got := h.count(`SELECT count(*) FROM charge`); got != n {
		t.Errorf("charge rows = %d, want %d", got, n)
	}
}

func TestServe_ProviderOutageIsRetriedWithTheSameKey(t *testing.T) {
	h := newHarness(t, 1)
	h.psp.SetOptions(fakepsp.Options{FailRate: 1, Seed: 1})
	s := h.serve(h.environ())
	ev, value := event(t, 42, 1999, "EUR")
	h.publish(0, "42", value)

	wait.For(t, 10*time.Second, "failed attempts", func() bool { return h.psp.Stats().InjectedFailures >= 2 })
	// The claim and its pending attempt are the recovery point; the retries
	// resume that attempt under the same key.
	if got := h.count(`SELECT count(*) FROM charge WHERE event_id = $1 AND status = 'pending' AND requests >= 1`, ev.ID); got != 1 {
		t.Fatalf("the failing event's attempt is not recorded as pending")
	}
	if c := kafkatest.Committed(t, h.client, h.broker.Group, h.broker.Topic); c[0] > 0 {
		t.Fatalf("offset committed past an unfinished message: %v", c)
	}
	h.psp.SetOptions(fakepsp.Options{Seed: 1})
	h.waitCaughtUp()

	charges := h.psp.Charges()
	if len(charges) != 1 || charges[0].IdempotencyKey != ev.ID.String() {
		t.Fatalf("charges = %+v, want one with key %s", charges, ev.ID)
	}
	if got := s.metric(t, `billing_payment_requests_total{result="server_error"}`); got < 2 {
		t.Errorf("server_error requests = %v, want >= 2", got)
	}
	if got := len(kafkatest.ReadAll(t, h.client, h.broker.DLQTopic)); got != 0 {
		t.Errorf("an outage sent %d messages to the DLQ", got)
	}
}

func TestServe_LostProviderAnswerIsDeduplicatedByTheProvider(t *testing.T) {
	h := newHarness(t, 1)
	h.psp.SetOptions(fakepsp.Options{ResetRate: 1, Seed: 1})
	s := h.serve(h.environ())
	ev, value := event(t, 43, 500, "EUR")
	h.publish(0, "43", value)

	wait.For(t, 10*time.Second, "a reset after charging", func() bool { return h.psp.Stats().Resets >= 1 })
	h.psp.SetOptions(fakepsp.Options{Seed: 1})
	h.waitCaughtUp()

	st := h.psp.Stats()
	if st.ChargesCreated != 1 || st.Replays < 1 {
		t.Fatalf("provider stats %+v: want 1 charge created and the retry replayed", st)
	}
	var providerID string
	if err := h.db.Get(&providerID, `SELECT provider_charge_id FROM charge WHERE event_id = $1`, ev.ID); err != nil {
		t.Fatal(err)
	}
	if providerID != h.psp.Charges()[0].ID {
		t.Errorf("recorded charge %s, provider created %s", providerID, h.psp.Charges()[0].ID)
	}
	if got := s.metric(t, `billing_events_total{outcome="charged"}`); got != 1 {
		t.Errorf("charged = %v, want 1", got)
	}
}

func TestServe_DeclineIsRecordedAndNotRetried(t *testing.T) {
	h := newHarness(t, 1)
	h.psp.SetOptions(fakepsp.Options{DeclineEvery: 7, Seed: 1})
	s := h.serve(h.environ())
	_, value := event(t, 70, 1500, "EUR")
	h.publish(0, "70", value)
	h.waitCaughtUp()

	if got := h.count(`SELECT count(*) FROM charge WHERE status = 'declined' AND order_id = 70 AND provider_charge_id IS NULL`); got != 1 {
		t.Errorf("declined rows = %d, want 1", got)
	}
	if st := h.psp.Stats(); st.Requests != 1 || st.ChargesCreated != 0 {
		t.Errorf("provider stats %+v: want exactly one request, no charge", st)
	}
	wait.For(t, 5*time.Second, "declined metric", func() bool {
		return s.metric(t, `billing_events_total{outcome="declined"}`) == 1
	})
}

func TestServe_InvalidAndRejectedEventsAreParkedWithReasons(t *testing.T) {
	h := newHarness(t, 2)
	s := h.serve(h.environ())

	// The provider already holds this event's key with another body: its
	// answer will be 422.
	rejected, value := event(t, 88, 1000, "EUR")
	req, _ := http.NewRequest(http.MethodPost, h.pspURL+"/v1/charges",
		strings.NewReader(`{"orderId":88,"customerId":1088,"amount":999,"currency":"EUR"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", rejected.ID.String())
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("seed provider: %v %v", resp, err)
	}

	v4 := strings.Replace(string(mustEvent(t, 90)), `"eventId":"`, `"eventId":"6ba7b810-9dad-41d1-80b4-00c04fd430c8","x":"`, 1)
	bad := []struct {
		name, value, reason string
	}{
		{"tombstone", "", "invalid-event: "},
		{"not json", "{oops", "invalid-event: "},
		{"string amount", strings.Replace(string(mustEvent(t, 89)), `"totalAmount":19.99`, `"totalAmount":"19.99"`, 1), "invalid-event: totalAmount"},
		{"uuid v4", v4, "invalid-event: eventId"},
		{"unknown currency", strings.Replace(string(mustEvent(t, 91)), `"currency":"EUR"`, `"currency":"ZZZ"`, 1), "invalid-event: currency"},
		{"too precise", strings.Replace(string(mustEvent(t, 92)), `"totalAmount":19.99`, `"totalAmount":19.999`, 1), "invalid-event: totalAmount"},
	}
	for i, b := range bad {
		var v []byte
		if b.value != "" {
			v = []byte(b.value)
		}
		kafkatest.Produce(t, h.client, h.broker.Topic, kafkatest.Message{Partition: int32(i % 2), Key: []byte("k" + strconv.Itoa(i)), Value: v})
	}
	h.publish(1, "88", value)
	h.waitCaughtUp()

	parked := kafkatest.ReadAll(t, h.client, h.broker.DLQTopic)
	if len(parked) != len(bad)+1 {
		t.Fatalf("DLQ holds %d messages, want %d", len(parked), len(bad)+1)
	}
	byValue := map[string]string{}
	for _, m := range parked {
		for _, hdr := range []string{dlq.HeaderOriginalTopic, dlq.HeaderOriginalPartition, dlq.HeaderOriginalOffset, dlq.HeaderConsumerGroup} {
			if kafkatest.Header(m, hdr) == "" {
				t.Errorf("parked message lacks header %s", hdr)
			}
		}
		if got := kafkatest.Header(m, dlq.HeaderOriginalTopic); got != h.broker.Topic {
			t.Errorf("x-original-topic = %q", got)
		}
		if got := kafkatest.Header(m, dlq.HeaderConsumerGroup); got != h.broker.Group {
			t.Errorf("x-consumer-group = %q", got)
		}
		byValue[string(m.Value)] = kafkatest.Header(m, dlq.HeaderReason)
	}
	for _, b := range bad {
		reason, ok := byValue[b.value]
		if !ok {
			t.Errorf("%s: not parked unchanged", b.name)
			continue
		}
		if !strings.HasPrefix(reason, b.reason) {
			t.Errorf("%s: reason %q, want prefix %q", b.name, reason, b.reason)
		}
	}
	if reason := byValue[string(value)]; !strings.HasPrefix(reason, "provider-rejected: ") {
		t.Errorf("422 event reason %q, want provider-rejected", reason)
	}
	// Invalid events leave nothing behind. The refused event's claim pins
	// its first payload, and its attempt is recorded as rejected, with the
	// provider's answer: a replay asks again, a tampered copy is a mismatch.
	if got := h.count(`SELECT count(*) FROM charge WHERE status = 'rejected' AND event_id = $1 AND last_error LIKE '%422%'`, rejected.ID); got != 1 {
		t.Errorf("the refused attempt is not recorded as rejected with its answer")
	}
	if got := h.count(`SELECT count(*) FROM charge`); got != 1 {
		t.Errorf("charge rows = %d, want only the rejected attempt", got)
	}
	if got := h.count(`SELECT count(*) FROM processed_event`); got != 1 {
		t.Errorf("processed_event rows = %d, want the rejected event's claim only: invalid events are not processed", got)
	}
	wait.For(t, 5*time.Second, "invalid metric", func() bool {
		return s.metric(t, `billing_events_total{outcome="invalid"}`) == float64(len(bad)+1) &&
			s.metric(t, `billing_dlq_messages_total{reason="invalid-event"}`) == float64(len(bad)) &&
			s.metric(t, `billing_dlq_messages_total{reason="provider-rejected"}`) == 1
	})
}

func TestServe_TwoEventsForOneOrderChargeItOnce(t *testing.T) {
	h := newHarness(t, 4)
	h.psp.SetOptions(fakepsp.Options{Latency: 30 * time.Millisecond, Seed: 1})
	s := h.serve(h.environ())

	const orders = 10
	for i := range int64(orders) {
		orderID := 900 + i
		// Two different events confirming the same order, on different
		// partitions, at the same moment.
		var msgs []kafkatest.Message
		for p := range int32(4) {
			_, value := event(t, orderID, 3000, "EUR")
			msgs = append(msgs, kafkatest.Message{Partition: p, Key: []byte(strconv.FormatInt(orderID, 10)), Value: value})
		}
		kafkatest.Produce(t, h.client, h.broker.Topic, msgs...)
	}
	h.waitCaughtUp()

	if st := h.psp.Stats(); st.ChargesCreated != orders || st.OrdersChargedTwice != 0 {
		t.Fatalf("provider stats %+v: want %d charges, no order twice", st, orders)
	}
	if got := h.count(`SELECT count(*) FROM charge WHERE status = 'succeeded'`); got != orders {
		t.Errorf("succeeded charges = %d, want %d", got, orders)
	}
	if got := h.count(`SELECT count(*) FROM processed_event`); got != 4*orders {
		t.Errorf("processed events = %d, want %d", got, 4*orders)
	}
	wait.For(t, 5*time.Second, "already_charged metric", func() bool {
		return s.metric(t, `billing_events_total{outcome="already_charged"}`) == 3*orders
	})
}

func TestServe_BadConfigurationStopsWithTheVariableNamed(t *testing.T) {
	h := newHarness(t, 1)
	cases := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"unparsable DATABASE_URL", h.environ("DATABASE_URL", "postgres://a b@%zz"), "DATABASE_URL"},
		{"unknown database", h.environ("DATABASE_URL", strings.Replace(h.dsn, "billing_test_", "nope_", 1)), "DATABASE_URL"},
		{"missing DATABASE_URL", without(h.environ(), "DATABASE_URL"), "DATABASE_URL"},
		{"empty KAFKA_BROKERS", h.environ("KAFKA_BROKERS", ""), "KAFKA_BROKERS"},
		{"bad PAYMENT_TIMEOUT", h.environ("PAYMENT_TIMEOUT", "soon"), "PAYMENT_TIMEOUT"},
		{"bad PAYMENT_BASE_URL", h.environ("PAYMENT_BASE_URL", "ftp://x"), "PAYMENT_BASE_URL"},
		{"bad SASL mechanism", h.environ("KAFKA_SASL_MECHANISM", "GSSAPI"), "KAFKA_SASL_MECHANISM"},
		{"bad LOG_LEVEL", h.environ("LOG_LEVEL", "loud"), "LOG_LEVEL"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			done := make(chan error, 1)
			var logs syncBuffer
			go func() { done <- run(t.Context(), []string{"billing", "serve"}, c.env, nil, &logs, &logs) }()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("serve returned %v, want an error naming %s", err, c.want)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("serve kept running with a bad %s", c.want)
			}
		})
	}
}

func TestServe_SecretsStayOutOfLogsAndMetrics(t *testing.T) {
	h := newHarness(t, 1)
	h.psp.SetOptions(fakepsp.Options{APIKey: "sk_live_topsecret", Seed: 1})
	env := h.environ("PAYMENT_API_KEY", "sk_live_topsecret", "DATABASE_URL", withPassword(h.dsn, "dbpass_topsecret"))
	s := h.serve(env)
	_, value := event(t, 5, 100, "EUR")
	h.publish(0, "5", value)
	h.waitCaughtUp()
	if h.psp.Stats().ChargesCreated != 1 {
		t.Fatalf("the API key was not sent: %+v", h.psp.Stats())
	}
	_, metricsText := get(s.addr, "/metrics")
	for _, secret := range []string{"sk_live_topsecret", "dbpass_topsecret"} {
		if strings.Contains(s.logs.String(), secret) {
			t.Errorf("logs contain %s", secret)
		}
		if strings.Contains(metricsText, secret) {
			t.Errorf("/metrics contains %s", secret)
		}
	}
}

func TestServe_ReadyzNamesWhatIsMissing(t *testing.T) {
	h := newHarness(t, 1)
	s := h.serve(h.environ())
	code, body := get(s.addr, "/readyz")
	if code != http.StatusOK {
		t.Fatalf("/readyz = %d %s", code, body)
	}
	if code, _ := get(s.addr, "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz = %d", code)
	}
	s.stop(t)

	// A service that cannot reach its broker is alive but not ready.
	env := h.environ("KAFKA_BROKERS", freeAddr(t))
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { done <- run(ctx, []string{"billing", "serve"}, env, nil, &bytes.Buffer{}, &syncBuffer{}) }()
	wait.For(t, 10*time.Second, "/healthz", func() bool { c, _ := get(env["HTTP_ADDR"], "/healthz"); return c == http.StatusOK })
	code, body = get(env["HTTP_ADDR"], "/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "consumer group session") {
		t.Errorf("/readyz = %d %s, want 503 naming the consumer group session", code, body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("serve exited with %v", err)
	}
}

func mustEvent(t *testing.T, orderID int64) []byte {
	t.Helper()
	_, b := event(t, orderID, 1999, "EUR")
	return b
}

func without(env map[string]string, key string) map[string]string {
	delete(env, key)
	return env
}

func withPassword(dsn, password string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		panic(err)
	}
	u.User = url.UserPassword(u.User.Username(), password)
	return u.String()
}
