package main

import (
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/config"
	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/testenv/apachekafka"
	"example.com/billing/internal/testenv/dbtest"
	"example.com/billing/internal/testenv/kafkatest"
	"example.com/billing/internal/testenv/testpki"
)

// newPKI is a throwaway certificate authority of the test's own.
func newPKI(t *testing.T) *testpki.PKI {
	t.Helper()
	p, err := testpki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// newSecureHarness is newHarness for a broker whose listener l speaks TLS
// and/or requires SASL (mechanism). The harness's environ carries the
// broker's credentials; the test's own client is built from the very same
// variables through billing's config and kafka packages, so it
// authenticates exactly as serve does.
func newSecureHarness(t *testing.T, l apachekafka.Listener, mechanism string, opts ...kafkatest.Option) *harness {
	t.Helper()
	h := &harness{t: t, broker: kafkatest.StartSecure(t, l, mechanism, 1, opts...)}
	h.client = secureClient(t, h.broker.Env())
	h.db, h.dsn = dbtest.New(t)
	h.psp = fakepsp.New(fakepsp.Options{Seed: 1})
	srv := httptest.NewServer(h.psp)
	t.Cleanup(srv.Close)
	h.pspURL = srv.URL
	return h
}

// secureClient returns a sarama client configured from kafkaEnv by
// billing's own code, with the producer settings kafkatest uses.
func secureClient(t *testing.T, kafkaEnv map[string]string) sarama.Client {
	t.Helper()
	env := map[string]string{"KAFKA_CLIENT_ID": "transport-test"}
	maps.Copy(env, kafkaEnv)
	var k config.Kafka
	if err := config.Load(env, &k); err != nil {
		t.Fatal(err)
	}
	cfg, err := kafka.NewConfig(k)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Idempotent = true
	cfg.Net.MaxOpenRequests = 1
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	c, err := sarama.NewClient(k.Brokers, cfg)
	if err != nil {
		t.Fatalf("test client with %v: %v", redactedKeys(kafkaEnv), err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// redactedKeys lists the variable names of env, for messages that must not
// print a password.
func redactedKeys(env map[string]string) []string {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	return keys
}

// environWith is h.environ with every variable of extra applied, then the
// overrides (name, value, name, value...).
func (h *harness) environWith(extra map[string]string, overrides ...string) map[string]string {
	env := h.environ()
	for k, v := range extra {
		env[k] = v
	}
	for i := 0; i+1 < len(overrides); i += 2 {
		env[overrides[i]] = overrides[i+1]
	}
	return env
}

// staysUnready requires /readyz to answer 503 naming the consumer group
// session for the whole of d, while /healthz answers 200.
func staysUnready(t *testing.T, addr string, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		code, body := get(addr, "/readyz")
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "consumer group session") {
			t.Fatalf("/readyz = %d %s, want 503 naming the consumer group session", code, body)
		}
		if code, _ := get(addr, "/healthz"); code != http.StatusOK {
			t.Fatalf("/healthz = %d while waiting for the broker, want 200", code)
		}
	}
}
