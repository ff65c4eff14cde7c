package main

import (
	"context"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/testenv/apachekafka"
	"example.com/billing/internal/testenv/kafkatest"
	"example.com/billing/internal/testenv/wait"
)

// The tests in this file prove billing's secure transport end to end: the
// broker speaks TLS (optionally requiring a client certificate) and/or
// requires SASL, `billing serve` runs through run() configured only by the
// contract's KAFKA_TLS_* and KAFKA_SASL_* variables, and an event published
// by a client that must authenticate too is charged, while an invalid one is
// parked by the dead-letter producer over the same secured connection.

func TestServe_KafkaMutualTLS(t *testing.T) {
	h := newSecureHarness(t, apachekafka.MutualTLS, "")
	chargesAndParks(t, h, h.environ())
}

func TestServe_KafkaTLSRefusedWithoutTheRightCertificates(t *testing.T) {
	other := newPKI(t)
	h := newSecureHarness(t, apachekafka.MutualTLS, "")
	cases := []struct {
		name string
		env  map[string]string
	}{
		{"no client certificate", map[string]string{
			"KAFKA_TLS_ENABLED": "true",
			"KAFKA_TLS_CA_FILE": h.broker.Creds.CAFile,
		}},
		{"broker signed by an unknown CA", map[string]string{
			"KAFKA_TLS_ENABLED":   "true",
			"KAFKA_TLS_CA_FILE":   other.CAFile,
			"KAFKA_TLS_CERT_FILE": h.broker.Creds.CertFile,
			"KAFKA_TLS_KEY_FILE":  h.broker.Creds.KeyFile,
		}},
		{"plaintext to a TLS listener", map[string]string{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := h.environ("HTTP_ADDR", freeAddr(t))
			for k := range h.broker.Creds.Env() {
				delete(env, k)
			}
			maps.Copy(env, c.env)
			neverGetsASession(t, h, env)
		})
	}
}

func TestServe_KafkaSASL(t *testing.T) {
	cases := []struct {
		name      string
		listener  apachekafka.Listener
		mechanism string
	}{
		{"PLAIN over TLS", apachekafka.SASLOverTLS, "PLAIN"},
		{"SCRAM-SHA-256 over TLS", apachekafka.SASLOverTLS, "SCRAM-SHA-256"},
		{"SCRAM-SHA-512 over TLS", apachekafka.SASLOverTLS, "SCRAM-SHA-512"},
		{"SCRAM-SHA-512 without TLS", apachekafka.SASLPlaintext, "SCRAM-SHA-512"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newSecureHarness(t, c.listener, c.mechanism)
			chargesAndParks(t, h, h.environ())
		})
	}
}

func TestServe_KafkaSASLWrongPasswordGetsNoSession(t *testing.T) {
	for _, mechanism := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		t.Run(mechanism, func(t *testing.T) {
			h := newSecureHarness(t, apachekafka.SASLOverTLS, mechanism)
			neverGetsASession(t, h, h.environ("KAFKA_SASL_PASSWORD", "wrong-password-e41b"))
		})
	}
}

// TestServe_SecretsNeverReachLogsOrMetrics runs serve at debug level with
// all three secrets of the contract set — PAYMENT_API_KEY, the SASL password
// and the database password — through a working pipeline and through the
// failure paths whose errors are logged (provider 401, SASL refused,
// database unreachable, unparsable DATABASE_URL), and requires that none of
// them appears in the logs, in /metrics, in /readyz or in serve's error.
func TestServe_SecretsNeverReachLogsOrMetrics(t *testing.T) {
	const (
		apiKey     = "sk_live_apikey-5f2e9b71"
		dbPassword = "db-password-3a6e0fc4"
	)
	var secrets []string
	requireNoSecrets := func(t *testing.T, where, text string) {
		t.Helper()
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("%s contains the secret %q", where, s)
			}
		}
	}
	requireNoSecretsServed := func(t *testing.T, addr string) {
		t.Helper()
		for _, path := range []string{"/metrics", "/readyz", "/healthz"} {
			_, body := get(addr, path)
			requireNoSecrets(t, path, body)
		}
	}

	h := newSecureHarness(t, apachekafka.SASLOverTLS, "SCRAM-SHA-512")
	h.psp.SetOptions(fakepsp.Options{APIKey: apiKey, Seed: 1})
	saslPassword := h.broker.Creds.Password
	secrets = []string{apiKey, saslPassword, dbPassword}
	env := h.environ("PAYMENT_API_KEY", apiKey, "DATABASE_URL", withPassword(h.dsn, dbPassword))
	if env["LOG_LEVEL"] != "debug" {
		t.Fatalf("LOG_LEVEL = %q, want debug", env["LOG_LEVEL"])
	}

	t.Run("charging", func(t *testing.T) {
		s := h.serve(env)
		_, value := event(t, 11, 1250, "EUR")
		h.publish(0, "11", value)
		h.publish(0, "bad", []byte("{oops"))
		h.waitCaughtUp()
		if st := h.psp.Stats(); st.ChargesCreated != 1 || st.Unauthorized != 0 {
			t.Fatalf("provider stats %+v: want one charge made with the API key", st)
		}
		requireNoSecretsServed(t, s.addr)
		s.stop(t)
		logs := s.logs.String()
		requireNoSecrets(t, "logs", logs)
		// The masking, not an accident of what was logged, keeps them out:
		// the configuration is logged with its secrets replaced.
		for _, masked := range []string{`"api_key":"xxxxx"`, `"sasl_password":"xxxxx"`} {
			if !strings.Contains(logs, masked) {
				t.Errorf("start-up configuration lacks %s", masked)
			}
		}
	})

	t.Run("provider refuses the key", func(t *testing.T) {
		h.psp.SetOptions(fakepsp.Options{APIKey: "sk_live_another-key", Seed: 1})
		defer h.psp.SetOptions(fakepsp.Options{APIKey: apiKey, Seed: 1})
		s := h.serve(env)
		_, value := event(t, 12, 990, "EUR")
		h.publish(0, "12", value)
		wait.For(t, 20*time.Second, "a 401 from the provider", func() bool {
			return s.metric(t, `billing_payment_requests_total{result="unauthorized"}`) >= 1
		})
		requireNoSecretsServed(t, s.addr)
		s.stop(t)
		requireNoSecrets(t, "logs", s.logs.String())
	})

	t.Run("SASL refused", func(t *testing.T) {
		wrong := h.environWith(env, "KAFKA_SASL_PASSWORD", saslPassword+"-wrong", "HTTP_ADDR", freeAddr(t))
		b := startServe(t, wrong)
		b.waitLog(t, "kafka unreachable")
		requireNoSecretsServed(t, wrong["HTTP_ADDR"])
		b.stop(t)
		requireNoSecrets(t, "logs", b.logs.String())
	})

	t.Run("database unreachable", func(t *testing.T) {
		away := h.environWith(env,
			"DATABASE_URL", "postgres://billing:"+dbPassword+"@"+freeAddr(t)+"/billing?sslmode=disable",
			"HTTP_ADDR", freeAddr(t))
		b := startServe(t, away)
		b.waitLog(t, "database unreachable")
		requireNoSecretsServed(t, away["HTTP_ADDR"])
		b.stop(t)
		requireNoSecrets(t, "logs", b.logs.String())
	})

	t.Run("unparsable DATABASE_URL", func(t *testing.T) {
		bad := h.environWith(env, "DATABASE_URL", "postgres://billing:"+dbPassword+"@db:port/billing")
		var logs syncBuffer
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		err := run(ctx, []string{"billing", "serve"}, bad, nil, &logs, &logs)
		if err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
			t.Fatalf("serve returned %v, want an error naming DATABASE_URL", err)
		}
		requireNoSecrets(t, "the error", err.Error())
		requireNoSecrets(t, "logs", logs.String())
	})
}

// chargesAndParks publishes a valid and an invalid event through h's
// (secured) client and requires serve, configured by env, to charge the
// first and park the second in the dead-letter topic.
func chargesAndParks(t *testing.T, h *harness, env map[string]string) {
	t.Helper()
	s := h.serve(env)
	ev, value := event(t, 31, 4200, "EUR")
	h.publish(0, "31", value)
	h.publish(0, "bad", []byte("{oops"))
	h.waitCaughtUp()

	charges := h.psp.Charges()
	if len(charges) != 1 || charges[0].IdempotencyKey != ev.ID.String() || charges[0].Amount != 4200 {
		t.Fatalf("provider charges = %+v, want one of 4200 with key %s", charges, ev.ID)
	}
	if got := h.count(`SELECT count(*) FROM charge WHERE status = 'succeeded'`); got != 1 {
		t.Errorf("succeeded charge rows = %d, want 1", got)
	}
	if parked := kafkatest.ReadAll(t, h.client, h.broker.DLQTopic); len(parked) != 1 || string(parked[0].Value) != "{oops" {
		t.Errorf("DLQ holds %d messages, want the invalid one", len(parked))
	}
	wait.For(t, 5*time.Second, "metrics", func() bool {
		return s.metric(t, `billing_events_total{outcome="charged"}`) == 1 &&
			s.metric(t, `billing_events_total{outcome="invalid"}`) == 1
	})
}

// neverGetsASession runs serve with env, which the broker must refuse, and
// requires that it stays alive but unready, and that an event published
// meanwhile by h's (accepted) client is not consumed.
func neverGetsASession(t *testing.T, h *harness, env map[string]string) {
	t.Helper()
	b := startServe(t, env)
	b.waitLog(t, "kafka unreachable")
	_, value := event(t, 51, 700, "EUR")
	h.publish(0, "51", value)
	staysUnready(t, env["HTTP_ADDR"], 3*time.Second)
	if st := h.psp.Stats(); st.Requests != 0 {
		t.Errorf("provider saw %d requests from a service the broker refused", st.Requests)
	}
	if members := groupMembers(t, h); members != 0 {
		t.Errorf("the consumer group has %d members, want none", members)
	}
	if code, _ := get(env["HTTP_ADDR"], "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d, want 200", code)
	}
	b.stop(t)
	if pw := env["KAFKA_SASL_PASSWORD"]; pw != "" && strings.Contains(b.logs.String(), pw) {
		t.Errorf("logs contain the SASL password")
	}
}

// groupMembers is the number of members of billing's consumer group, as
// the broker sees it; 0 when the group does not exist.
func groupMembers(t *testing.T, h *harness) int {
	t.Helper()
	// Not closed: closing the admin would close the shared client.
	admin, err := sarama.NewClusterAdminFromClient(h.client)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := admin.DescribeConsumerGroups([]string{h.broker.Group})
	if err != nil {
		t.Fatalf("describe group: %v", err)
	}
	n := 0
	for _, g := range groups {
		if g.Err != sarama.ErrNoError && g.Err != sarama.ErrGroupIDNotFound {
			t.Fatalf("describe group %s: %v", g.GroupId, g.Err)
		}
		n += len(g.Members)
	}
	return n
}

// TestServe_DatabaseSSLModePassesThrough shows that DATABASE_URL's sslmode
// (and sslrootcert) reach lib/pq unchanged: with sslmode=require every
// connection serve holds is encrypted, and with sslmode=verify-full and a
// CA that did not sign the server's certificate serve never reaches the
// database. It needs a test server that offers TLS (Debian's PostgreSQL does,
// with its snakeoil certificate).
func TestServe_DatabaseSSLModePassesThrough(t *testing.T) {
	h := newHarness(t, 1)
	var ssl string
	if err := h.db.Get(&ssl, `SHOW ssl`); err != nil || ssl != "on" {
		t.Skipf("the test PostgreSQL server does not offer TLS (ssl=%q, %v)", ssl, err)
	}

	t.Run("require", func(t *testing.T) {
		dsn := withParams(t, h.dsn, "sslmode", "require", "application_name", "billing-ssl-test")
		s := h.serve(h.environ("DATABASE_URL", dsn))
		_, value := event(t, 61, 800, "EUR")
		h.publish(0, "61", value)
		h.waitCaughtUp()
		if got := s.metric(t, `billing_events_total{outcome="charged"}`); got != 1 {
			t.Errorf("charged = %v, want 1", got)
		}
		const conns = `SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
			WHERE a.datname = current_database() AND a.application_name = 'billing-ssl-test' AND s.ssl = $1`
		if n := h.count(conns, true); n == 0 {
			t.Errorf("serve holds no encrypted connection")
		}
		if n := h.count(conns, false); n != 0 {
			t.Errorf("serve holds %d unencrypted connections with sslmode=require", n)
		}
	})

	t.Run("verify-full with a foreign CA", func(t *testing.T) {
		pki := newPKI(t)
		dsn := withParams(t, h.dsn, "sslmode", "verify-full", "sslrootcert", pki.CAFile)
		env := h.environ("DATABASE_URL", dsn)
		b := startServe(t, env)
		b.waitLog(t, "tls: failed to verify certificate")
		code, body := get(env["HTTP_ADDR"], "/readyz")
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "database") {
			t.Errorf("/readyz = %d %s, want 503 naming the database", code, body)
		}
	})
}

// withParams sets query parameters of a database URL.
func withParams(t *testing.T, dsn string, kv ...string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}
