package config_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"example.com/billing/internal/config"
)

// minimalEnv is the smallest environment serve starts with: the two
// required variables. overrides are "NAME=value" pairs; "NAME" alone (no
// "=") removes the variable.
func minimalEnv(t *testing.T, overrides ...string) map[string]string {
	t.Helper()
	environ := map[string]string{
		"DATABASE_URL":     "postgres://billing@db.internal:5432/billing?sslmode=disable",
		"PAYMENT_BASE_URL": "https://psp.example.com",
	}
	for _, kv := range overrides {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			delete(environ, k)
			continue
		}
		environ[k] = v
	}
	return environ
}

// load runs config.Load into a fresh Serve.
func load(t *testing.T, environ map[string]string) (config.Serve, error) {
	t.Helper()
	var cfg config.Serve
	err := config.Load(maps.Clone(environ), &cfg)
	return cfg, err
}

// mustLoad is load for environments that must be accepted.
func mustLoad(t *testing.T, environ map[string]string) config.Serve {
	t.Helper()
	cfg, err := load(t, environ)
	if err != nil {
		t.Fatalf("Load: unexpected error: %v", err)
	}
	return cfg
}

// tempFile creates an empty file and returns its path.
func tempFile(t *testing.T, name string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte("-----BEGIN CERTIFICATE-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// setting is one contract variable and where Load puts it.
type setting struct {
	name string
	get  func(c config.Serve) any
}

// settings lists every variable of serve's contract.
var settings = []setting{
	{"KAFKA_BROKERS", func(c config.Serve) any { return c.Kafka.Brokers }},
	{"KAFKA_TOPIC", func(c config.Serve) any { return c.Kafka.Topic }},
	{"KAFKA_GROUP_ID", func(c config.Serve) any { return c.Kafka.GroupID }},
	{"KAFKA_DLQ_TOPIC", func(c config.Serve) any { return c.Kafka.DLQTopic }},
	{"KAFKA_OUTCOME_TOPIC", func(c config.Serve) any { return c.Kafka.OutcomeTopic }},
	{"KAFKA_CLIENT_ID", func(c config.Serve) any { return c.Kafka.ClientID }},
	{"KAFKA_INSTANCE_ID", func(c config.Serve) any { return c.Kafka.InstanceID }},
	{"KAFKA_VERSION", func(c config.Serve) any { return c.Kafka.Version }},
	{"KAFKA_TLS_ENABLED", func(c config.Serve) any { return c.Kafka.TLSEnabled }},
	{"KAFKA_TLS_CA_FILE", func(c config.Serve) any { return c.Kafka.TLSCAFile }},
	{"KAFKA_TLS_CERT_FILE", func(c config.Serve) any { return c.Kafka.TLSCertFile }},
	{"KAFKA_TLS_KEY_FILE", func(c config.Serve) any { return c.Kafka.TLSKeyFile }},
	{"KAFKA_SASL_MECHANISM", func(c config.Serve) any { return c.Kafka.SASLMechanism }},
	{"KAFKA_SASL_USERNAME", func(c config.Serve) any { return c.Kafka.SASLUsername }},
	{"KAFKA_SASL_PASSWORD", func(c config.Serve) any { return c.Kafka.SASLPassword }},
	{"DATABASE_URL", func(c config.Serve) any { return c.Database.URL }},
	{"DATABASE_MAX_CONNS", func(c config.Serve) any { return c.Database.MaxConns }},
	{"PAYMENT_BASE_URL", func(c config.Serve) any { return c.Payment.BaseURL }},
	{"PAYMENT_API_KEY", func(c config.Serve) any { return c.Payment.APIKey }},
	{"PAYMENT_TIMEOUT", func(c config.Serve) any { return c.Payment.Timeout }},
	{"PAYMENT_MAX_CONCURRENCY", func(c config.Serve) any { return c.Payment.MaxConcurrency }},
	{"PAYMENT_MAX_RPS", func(c config.Serve) any { return c.Payment.MaxRPS }},
	{"PAYMENT_ACCOUNT_MAX_RPS", func(c config.Serve) any { return c.Fleet.AccountMaxRPS }},
	{"PAYMENT_IDEMPOTENCY_WINDOW", func(c config.Serve) any { return c.Payment.IdempotencyWindow }},
	{"PAYMENT_RECOVER_AFTER", func(c config.Serve) any { return c.Payment.RecoverAfter }},
	{"PAYMENT_PROVIDER", func(c config.Serve) any { return c.Payment.Provider }},
	{"PAYMENT_RESOLVE_AFTER", func(c config.Serve) any { return c.Payment.ResolveAfter }},
	{"WEBHOOK_ADDR", func(c config.Serve) any { return c.Webhooks.Addr }},
	{"PAYMENT_WEBHOOK_SECRET", func(c config.Serve) any { return c.Webhooks.Secrets }},
	{"OUTBOX_RETENTION", func(c config.Serve) any { return c.Outbox.Retention }},
	{"HTTP_ADDR", func(c config.Serve) any { return c.HTTPAddr }},
	{"DEBUG_PPROF_ADDR", func(c config.Serve) any { return c.PprofAddr }},
	{"DEDUP_RETENTION", func(c config.Serve) any { return c.Dedup.Retention }},
	{"DEDUP_ALLOW_SHORT_RETENTION", func(c config.Serve) any { return c.Dedup.AllowShortRetention }},
	{"LOG_LEVEL", func(c config.Serve) any { return c.Log.Level }},
	{"LOG_FORMAT", func(c config.Serve) any { return c.Log.Format }},
	{"MAX_IN_FLIGHT", func(c config.Serve) any { return c.Consumer.MaxInFlight }},
	{"DRAIN_TIMEOUT", func(c config.Serve) any { return c.Consumer.DrainTimeout }},
}

// checkSettings compares every contract setting of got with want (variable
// name → value); a variable missing from want must not be in settings.
func checkSettings(t *testing.T, got config.Serve, want map[string]any) {
	t.Helper()
	for _, s := range settings {
		w, ok := want[s.name]
		if !ok {
			t.Fatalf("test table lacks %s", s.name)
		}
		if g := s.get(got); !reflect.DeepEqual(g, w) {
			t.Errorf("%s: got %#v, want %#v", s.name, g, w)
		}
	}
}

func TestLoad_Defaults(t *testing.T) {
	t.Parallel()
	t.Run("OK_Defaults", func(t *testing.T) {
		t.Parallel()
		env := minimalEnv(t)
		checkSettings(t, mustLoad(t, env), map[string]any{
			"KAFKA_BROKERS":               []string{"localhost:9092"},
			"KAFKA_TOPIC":                 "orders.confirmed",
			"KAFKA_GROUP_ID":              "billing-order-confirmed",
			"KAFKA_DLQ_TOPIC":             "orders.confirmed.dlq",
			"KAFKA_OUTCOME_TOPIC":         "payments.settled",
			"KAFKA_CLIENT_ID":             "billing",
			"KAFKA_INSTANCE_ID":           "",
			"KAFKA_VERSION":               "3.6.0",
			"KAFKA_TLS_ENABLED":           false,
			"KAFKA_TLS_CA_FILE":           "",
			"KAFKA_TLS_CERT_FILE":         "",
			"KAFKA_TLS_KEY_FILE":          "",
			"KAFKA_SASL_MECHANISM":        "",
			"KAFKA_SASL_USERNAME":         "",
			"KAFKA_SASL_PASSWORD":         "",
			"DATABASE_URL":                env["DATABASE_URL"],
			"DATABASE_MAX_CONNS":          16,
			"PAYMENT_BASE_URL":            env["PAYMENT_BASE_URL"],
			"PAYMENT_API_KEY":             "",
			"PAYMENT_TIMEOUT":             10 * time.Second,
			"PAYMENT_MAX_CONCURRENCY":     1024,
			"PAYMENT_MAX_RPS":             0.0,
			"PAYMENT_ACCOUNT_MAX_RPS":     0.0,
			"PAYMENT_IDEMPOTENCY_WINDOW":  24 * time.Hour,
			"PAYMENT_RECOVER_AFTER":       time.Minute, // the longer of 1m and 2 × PAYMENT_TIMEOUT
			"PAYMENT_PROVIDER":            "contract",
			"PAYMENT_RESOLVE_AFTER":       10 * time.Minute,
			"WEBHOOK_ADDR":                ":8090",
			"PAYMENT_WEBHOOK_SECRET":      []string(nil),
			"OUTBOX_RETENTION":            72 * time.Hour,
			"HTTP_ADDR":                   ":8080",
			"DEBUG_PPROF_ADDR":            "", // no profiles
			"DEDUP_RETENTION":             168 * time.Hour,
			"DEDUP_ALLOW_SHORT_RETENTION": false,
			"LOG_LEVEL":                   slog.LevelInfo,
			"LOG_FORMAT":                  "json",
			"MAX_IN_FLIGHT":               2 * 1024, // 2 × PAYMENT_MAX_CONCURRENCY
			"DRAIN_TIMEOUT":               10 * time.Second,
		})
	})
}

func TestLoad_Values(t *testing.T) {
	t.Parallel()
	ca, cert, key := tempFile(t, "ca.pem"), tempFile(t, "cert.pem"), tempFile(t, "key.pem")

	t.Run("OK_EveryVariable", func(t *testing.T) {
		t.Parallel()
		want := map[string]any{
			"KAFKA_BROKERS":               []string{"kafka-0:9092", "kafka-1:9093"},
			"KAFKA_TOPIC":                 "orders.v2",
			"KAFKA_GROUP_ID":              "billing-2",
			"KAFKA_DLQ_TOPIC":             "orders.v2.dlq",
			"KAFKA_OUTCOME_TOPIC":         "payments.v2",
			"KAFKA_CLIENT_ID":             "billing-pod-1",
			"KAFKA_INSTANCE_ID":           "pod-1",
			"KAFKA_VERSION":               "2.8.0",
			"KAFKA_TLS_ENABLED":           true,
			"KAFKA_TLS_CA_FILE":           ca,
			"KAFKA_TLS_CERT_FILE":         cert,
			"KAFKA_TLS_KEY_FILE":          key,
			"KAFKA_SASL_MECHANISM":        "SCRAM-SHA-512",
			"KAFKA_SASL_USERNAME":         "billing",
			"KAFKA_SASL_PASSWORD":         "pw",
			"DATABASE_URL":                "host=db dbname=billing",
			"DATABASE_MAX_CONNS":          4,
			"PAYMENT_BASE_URL":            "http://psp:8080/api/",
			"PAYMENT_API_KEY":             "key",
			"PAYMENT_TIMEOUT":             3 * time.Second,
			"PAYMENT_MAX_CONCURRENCY":     64,
			"PAYMENT_MAX_RPS":             100.0,
			"PAYMENT_ACCOUNT_MAX_RPS":     25.0,
			"PAYMENT_IDEMPOTENCY_WINDOW":  48 * time.Hour,
			"PAYMENT_RECOVER_AFTER":       30 * time.Second,
			"PAYMENT_PROVIDER":            "contract",
			"PAYMENT_RESOLVE_AFTER":       2 * time.Minute,
			"WEBHOOK_ADDR":                "127.0.0.1:9090",
			"PAYMENT_WEBHOOK_SECRET":      []string{"old", "new"},
			"OUTBOX_RETENTION":            96 * time.Hour,
			"HTTP_ADDR":                   "127.0.0.1:9000",
			"DEBUG_PPROF_ADDR":            "127.0.0.1:6060",
			"DEDUP_RETENTION":             720 * time.Hour,
			"DEDUP_ALLOW_SHORT_RETENTION": true,
			"LOG_LEVEL":                   slog.LevelDebug,
			"LOG_FORMAT":                  "text",
			"MAX_IN_FLIGHT":               7,
			"DRAIN_TIMEOUT":               time.Minute,
		}
		env := map[string]string{
			"KAFKA_BROKERS":               "kafka-0:9092,kafka-1:9093",
			"KAFKA_TLS_ENABLED":           "true",
			"PAYMENT_TIMEOUT":             "3s",
			"PAYMENT_IDEMPOTENCY_WINDOW":  "48h",
			"PAYMENT_RECOVER_AFTER":       "30s",
			"PAYMENT_RESOLVE_AFTER":       "2m",
			"PAYMENT_WEBHOOK_SECRET":      "old,new",
			"OUTBOX_RETENTION":            "96h",
			"DEDUP_RETENTION":             "720h",
			"DEDUP_ALLOW_SHORT_RETENTION": "true",
			"LOG_LEVEL":                   "debug",
			"DRAIN_TIMEOUT":               "1m",
		}
		for name, v := range want {
			if _, ok := env[name]; !ok {
				env[name] = fmt.Sprint(v)
			}
		}
		checkSettings(t, mustLoad(t, env), want)
	})

	tests := []struct {
		name  string
		env   []string
		check func(t *testing.T, cfg config.Serve)
	}{
		{"OK_MaxInFlightDefaultsToTwiceTheProviderConcurrency", []string{"PAYMENT_MAX_CONCURRENCY=12"}, func(t *testing.T, cfg config.Serve) {
			if cfg.Consumer.MaxInFlight != 24 {
				t.Errorf("MaxInFlight = %d, want 2×12 = 24", cfg.Consumer.MaxInFlight)
			}
		}},
		{"OK_StripeDefaultsToStripesAPI", []string{"PAYMENT_PROVIDER=stripe", "PAYMENT_BASE_URL", "PAYMENT_WEBHOOK_SECRET=whsec_a,whsec_b"}, func(t *testing.T, cfg config.Serve) {
			if cfg.Payment.BaseURL != "https://api.stripe.com" || cfg.Payment.IdempotencyWindow != 24*time.Hour || len(cfg.Webhooks.Secrets) != 2 {
				t.Errorf("payment %+v, secrets %d; want Stripe's API, a 24h window and both secrets", cfg.Payment, len(cfg.Webhooks.Secrets))
			}
		}},
		{"OK_AdyenKeepsKeys31Days", []string{"PAYMENT_PROVIDER=adyen", "PAYMENT_BASE_URL=https://checkout-test.adyen.com/v71",
			"ADYEN_MERCHANT_ACCOUNT=BillingECOM", "PAYMENT_WEBHOOK_SECRET=" + adyenKey + "," + strings.ToLower(adyenKey)}, func(t *testing.T, cfg config.Serve) {
			if cfg.Payment.IdempotencyWindow != 744*time.Hour || cfg.Payment.MerchantAccount != "BillingECOM" || len(cfg.Webhooks.Secrets) != 2 {
				t.Errorf("payment %+v, secrets %d; want a 744h window, the merchant account and both keys", cfg.Payment, len(cfg.Webhooks.Secrets))
			}
		}},
		{"OK_AdyenWindowSet", []string{"PAYMENT_PROVIDER=adyen", "PAYMENT_BASE_URL=https://checkout-test.adyen.com/v71/",
			"ADYEN_MERCHANT_ACCOUNT=BillingECOM", "PAYMENT_WEBHOOK_SECRET=" + adyenKey, "PAYMENT_IDEMPOTENCY_WINDOW=168h"}, func(t *testing.T, cfg config.Serve) {
			if cfg.Payment.IdempotencyWindow != 168*time.Hour {
				t.Errorf("window %s, want the 168h set", cfg.Payment.IdempotencyWindow)
			}
		}},
		{"OK_MaxInFlightZeroMeansDefault", []string{"MAX_IN_FLIGHT=0", "PAYMENT_MAX_CONCURRENCY=5"}, func(t *testing.T, cfg config.Serve) {
			if cfg.Consumer.MaxInFlight != 10 {
				t.Errorf("MaxInFlight = %d, want 2×5 = 10", cfg.Consumer.MaxInFlight)
			}
		}},
		{"OK_RecoverAfterFollowsALongTimeout", []string{"PAYMENT_TIMEOUT=45s"}, func(t *testing.T, cfg config.Serve) {
			if cfg.Payment.RecoverAfter != 90*time.Second {
				t.Errorf("RecoverAfter = %s, want 2 × PAYMENT_TIMEOUT = 1m30s", cfg.Payment.RecoverAfter)
			}
		}},
		// "a:1, b:2" is how people write lists; sarama dials each address
		// as given and cannot resolve " b".
		{"OK_BrokersTrimmed", []string{"KAFKA_BROKERS= kafka-0:9092 , kafka-1:9092"}, func(t *testing.T, cfg config.Serve) {
			if want := []string{"kafka-0:9092", "kafka-1:9092"}; !reflect.DeepEqual(cfg.Kafka.Brokers, want) {
				t.Errorf("Brokers = %q, want %q", cfg.Kafka.Brokers, want)
			}
		}},
		{"OK_BrokerIPv6", []string{"KAFKA_BROKERS=[::1]:9092"}, func(t *testing.T, cfg config.Serve) {
			if want := []string{"[::1]:9092"}; !reflect.DeepEqual(cfg.Kafka.Brokers, want) {
				t.Errorf("Brokers = %q, want %q", cfg.Kafka.Brokers, want)
			}
		}},
		{"OK_SASLPlain", []string{"KAFKA_SASL_MECHANISM=PLAIN", "KAFKA_SASL_USERNAME=u", "KAFKA_SASL_PASSWORD=p"}, nil},
		{"OK_SASLScram256", []string{"KAFKA_SASL_MECHANISM=SCRAM-SHA-256", "KAFKA_SASL_USERNAME=u", "KAFKA_SASL_PASSWORD=p"}, nil},
		{"OK_TLSWithoutFiles", []string{"KAFKA_TLS_ENABLED=true"}, nil},
		{"OK_DatabaseKeyValueForm", []string{"DATABASE_URL=host=db port=5432 dbname=billing sslmode=disable"}, nil},
		{"OK_PaymentHTTPWithPathPrefix", []string{"PAYMENT_BASE_URL=http://psp:8080/api/"}, nil},
		{"OK_HTTPAddrAnyHost", []string{"HTTP_ADDR=:0"}, nil},
		{"OK_PprofAddrAnotherPort", []string{"DEBUG_PPROF_ADDR=127.0.0.1:6060"}, nil},
		{"OK_PprofAddrSamePortOtherHost", []string{"HTTP_ADDR=10.0.0.1:8080", "DEBUG_PPROF_ADDR=127.0.0.1:8080"}, nil},
		{"OK_PprofAddrBothFreePorts", []string{"HTTP_ADDR=127.0.0.1:0", "DEBUG_PPROF_ADDR=127.0.0.1:0"}, nil},
		{"OK_RetentionOneDay", []string{"DEDUP_RETENTION=24h"}, nil},
		{"OK_LogLevelUpperCase", []string{"LOG_LEVEL=WARN"}, func(t *testing.T, cfg config.Serve) {
			if cfg.Log.Level != slog.LevelWarn {
				t.Errorf("Log.Level = %v, want WARN", cfg.Log.Level)
			}
		}},
		{"OK_LimitsAtBounds", []string{"DATABASE_MAX_CONNS=1000", "MAX_IN_FLIGHT=100000", "PAYMENT_TIMEOUT=5m"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := mustLoad(t, minimalEnv(t, tt.env...))
			if tt.check != nil {
				tt.check(t, cfg)
			}
		})
	}
}

func TestLoad_Errors(t *testing.T) {
	t.Parallel()
	existing := tempFile(t, "exists.pem")
	missing := filepath.Join(t.TempDir(), "missing.pem")

	tests := []struct {
		name    string
		env     []string
		wantVar string
		// alsoNames is another variable the message must mention.
		alsoNames string
	}{
		{"ErrBrokersSetButEmpty", []string{"KAFKA_BROKERS="}, "KAFKA_BROKERS", ""},
		{"ErrBrokersBlank", []string{"KAFKA_BROKERS=  "}, "KAFKA_BROKERS", ""},
		{"ErrBrokersEmptyElement", []string{"KAFKA_BROKERS=kafka:9092,"}, "KAFKA_BROKERS", ""},
		{"ErrBrokersNoPort", []string{"KAFKA_BROKERS=kafka"}, "KAFKA_BROKERS", ""},
		{"ErrBrokersNoHost", []string{"KAFKA_BROKERS=:9092"}, "KAFKA_BROKERS", ""},
		{"ErrBrokersSecondBad", []string{"KAFKA_BROKERS=kafka-0:9092,kafka-1"}, "KAFKA_BROKERS", ""},
		{"ErrBrokersPortNotNumber", []string{"KAFKA_BROKERS=kafka:http"}, "KAFKA_BROKERS", ""},
		{"ErrBrokersPortZero", []string{"KAFKA_BROKERS=kafka:0"}, "KAFKA_BROKERS", ""},
		{"ErrBrokersPortTooBig", []string{"KAFKA_BROKERS=kafka:65536"}, "KAFKA_BROKERS", ""},
		{"ErrTopicSlash", []string{"KAFKA_TOPIC=orders/confirmed"}, "KAFKA_TOPIC", ""},
		{"ErrTopicSpace", []string{"KAFKA_TOPIC=orders confirmed"}, "KAFKA_TOPIC", ""},
		{"ErrTopicTooLong", []string{"KAFKA_TOPIC=" + strings.Repeat("t", 250)}, "KAFKA_TOPIC", ""},
		{"ErrDLQTopicInvalid", []string{"KAFKA_DLQ_TOPIC=dlq!"}, "KAFKA_DLQ_TOPIC", ""},
		{"ErrDLQTopicEqualsTopic", []string{"KAFKA_TOPIC=orders", "KAFKA_DLQ_TOPIC=orders"}, "KAFKA_DLQ_TOPIC", "KAFKA_TOPIC"},
		{"ErrDLQTopicEqualsDefaultTopic", []string{"KAFKA_DLQ_TOPIC=orders.confirmed"}, "KAFKA_DLQ_TOPIC", ""},
		{"ErrGroupIDBlank", []string{"KAFKA_GROUP_ID=  "}, "KAFKA_GROUP_ID", ""},
		{"ErrClientIDBlank", []string{"KAFKA_CLIENT_ID=  "}, "KAFKA_CLIENT_ID", ""},
		{"ErrVersionNotVersion", []string{"KAFKA_VERSION=latest"}, "KAFKA_VERSION", ""},
		{"ErrVersionTooShort", []string{"KAFKA_VERSION=3"}, "KAFKA_VERSION", ""},
		{"ErrTLSEnabledNotBool", []string{"KAFKA_TLS_ENABLED=maybe"}, "KAFKA_TLS_ENABLED", ""},
		{"ErrTLSCAFileWithoutTLS", []string{"KAFKA_TLS_CA_FILE=" + existing}, "KAFKA_TLS_CA_FILE", "KAFKA_TLS_ENABLED"},
		{"ErrTLSCertFileWithoutTLS", []string{"KAFKA_TLS_ENABLED=false", "KAFKA_TLS_CERT_FILE=" + existing}, "KAFKA_TLS_CERT_FILE", "KAFKA_TLS_ENABLED"},
		{"ErrTLSKeyFileWithoutTLS", []string{"KAFKA_TLS_KEY_FILE=" + existing}, "KAFKA_TLS_KEY_FILE", "KAFKA_TLS_ENABLED"},
		{"ErrTLSCertWithoutKey", []string{"KAFKA_TLS_ENABLED=true", "KAFKA_TLS_CERT_FILE=" + existing}, "KAFKA_TLS_CERT_FILE", "KAFKA_TLS_KEY_FILE"},
		{"ErrTLSKeyWithoutCert", []string{"KAFKA_TLS_ENABLED=true", "KAFKA_TLS_KEY_FILE=" + existing}, "KAFKA_TLS_CERT_FILE", "KAFKA_TLS_KEY_FILE"},
		{"ErrTLSCAFileMissing", []string{"KAFKA_TLS_ENABLED=true", "KAFKA_TLS_CA_FILE=" + missing}, "KAFKA_TLS_CA_FILE", ""},
		{"ErrTLSCertFileMissing", []string{"KAFKA_TLS_ENABLED=true", "KAFKA_TLS_CERT_FILE=" + missing, "KAFKA_TLS_KEY_FILE=" + existing}, "KAFKA_TLS_CERT_FILE", ""},
		{"ErrTLSKeyFileMissing", []string{"KAFKA_TLS_ENABLED=true", "KAFKA_TLS_CERT_FILE=" + existing, "KAFKA_TLS_KEY_FILE=" + missing}, "KAFKA_TLS_KEY_FILE", ""},
		{"ErrSASLMechanismUnknown", []string{"KAFKA_SASL_MECHANISM=GSSAPI", "KAFKA_SASL_USERNAME=u", "KAFKA_SASL_PASSWORD=p"}, "KAFKA_SASL_MECHANISM", ""},
		{"ErrSASLMechanismLowerCase", []string{"KAFKA_SASL_MECHANISM=plain", "KAFKA_SASL_USERNAME=u", "KAFKA_SASL_PASSWORD=p"}, "KAFKA_SASL_MECHANISM", ""},
		{"ErrSASLUsernameMissing", []string{"KAFKA_SASL_MECHANISM=PLAIN", "KAFKA_SASL_PASSWORD=p"}, "KAFKA_SASL_USERNAME", "KAFKA_SASL_MECHANISM"},
		{"ErrSASLPasswordMissing", []string{"KAFKA_SASL_MECHANISM=SCRAM-SHA-256", "KAFKA_SASL_USERNAME=u"}, "KAFKA_SASL_PASSWORD", "KAFKA_SASL_MECHANISM"},
		{"ErrSASLUsernameWithoutMechanism", []string{"KAFKA_SASL_USERNAME=u"}, "KAFKA_SASL_MECHANISM", "KAFKA_SASL_USERNAME"},
		{"ErrSASLPasswordWithoutMechanism", []string{"KAFKA_SASL_PASSWORD=p"}, "KAFKA_SASL_MECHANISM", "KAFKA_SASL_PASSWORD"},
		{"ErrDatabaseURLMissing", []string{"DATABASE_URL"}, "DATABASE_URL", ""},
		{"ErrDatabaseURLEmpty", []string{"DATABASE_URL="}, "DATABASE_URL", ""},
		{"ErrDatabaseURLBlank", []string{"DATABASE_URL= "}, "DATABASE_URL", ""},
		{"ErrDatabaseURLBadPort", []string{"DATABASE_URL=postgres://billing@db:port/billing"}, "DATABASE_URL", ""},
		{"ErrDatabaseURLBadEscape", []string{"DATABASE_URL=postgres://billing@db/%zz"}, "DATABASE_URL", ""},
		{"ErrDatabaseURLNotKeyValue", []string{"DATABASE_URL=db.internal"}, "DATABASE_URL", ""},
		{"ErrDatabaseURLUnterminatedQuote", []string{"DATABASE_URL=host=db password='abc"}, "DATABASE_URL", ""},
		{"ErrDatabaseMaxConnsZero", []string{"DATABASE_MAX_CONNS=0"}, "DATABASE_MAX_CONNS", ""},
		{"ErrDatabaseMaxConnsNegative", []string{"DATABASE_MAX_CONNS=-1"}, "DATABASE_MAX_CONNS", ""},
		{"ErrDatabaseMaxConnsTooMany", []string{"DATABASE_MAX_CONNS=1001"}, "DATABASE_MAX_CONNS", ""},
		{"ErrDatabaseMaxConnsNotNumber", []string{"DATABASE_MAX_CONNS=many"}, "DATABASE_MAX_CONNS", ""},
		{"ErrPaymentBaseURLMissing", []string{"PAYMENT_BASE_URL"}, "PAYMENT_BASE_URL", ""},
		{"ErrPaymentMaxConcurrencyZero", []string{"PAYMENT_MAX_CONCURRENCY=0"}, "PAYMENT_MAX_CONCURRENCY", ""},
		{"ErrPaymentMaxRPSNegative", []string{"PAYMENT_MAX_RPS=-1"}, "PAYMENT_MAX_RPS", ""},
		{"ErrPaymentAccountMaxRPSNegative", []string{"PAYMENT_ACCOUNT_MAX_RPS=-1"}, "PAYMENT_ACCOUNT_MAX_RPS", ""},
		{"ErrPaymentAccountMaxRPSNotNumber", []string{"PAYMENT_ACCOUNT_MAX_RPS=lots"}, "PAYMENT_ACCOUNT_MAX_RPS", ""},
		{"ErrPaymentWindowTooShort", []string{"PAYMENT_IDEMPOTENCY_WINDOW=10m"}, "PAYMENT_IDEMPOTENCY_WINDOW", ""},
		{"ErrPaymentRecoverBeforeTheTimeout", []string{"PAYMENT_TIMEOUT=30s", "PAYMENT_RECOVER_AFTER=20s"}, "PAYMENT_RECOVER_AFTER", "PAYMENT_TIMEOUT"},
		{"ErrPaymentProviderUnknown", []string{"PAYMENT_PROVIDER=paypal"}, "PAYMENT_PROVIDER", ""},
		{"ErrStripeWithoutWebhookSecret", []string{"PAYMENT_PROVIDER=stripe"}, "PAYMENT_WEBHOOK_SECRET", "PAYMENT_PROVIDER"},
		{"ErrAdyenWithoutMerchantAccount", adyenEnv("ADYEN_MERCHANT_ACCOUNT"), "ADYEN_MERCHANT_ACCOUNT", "PAYMENT_PROVIDER"},
		{"ErrAdyenWithoutBaseURL", adyenEnv("PAYMENT_BASE_URL"), "PAYMENT_BASE_URL", "PAYMENT_PROVIDER"},
		{"ErrAdyenBaseURLWithoutVersion", adyenEnv("PAYMENT_BASE_URL=https://checkout-test.adyen.com"), "PAYMENT_BASE_URL", "v71"},
		{"ErrAdyenBaseURLOfPayments", adyenEnv("PAYMENT_BASE_URL=https://checkout-test.adyen.com/v71/payments"), "PAYMENT_BASE_URL", "v71"},
		{"ErrAdyenWithoutWebhookSecret", adyenEnv("PAYMENT_WEBHOOK_SECRET"), "PAYMENT_WEBHOOK_SECRET", "PAYMENT_PROVIDER"},
		{"ErrAdyenWebhookSecretNotHex", adyenEnv("PAYMENT_WEBHOOK_SECRET=" + adyenKey + ",whsec_stripes"), "PAYMENT_WEBHOOK_SECRET", "key 2 of 2"},
		{"ErrMerchantAccountWithoutAdyen", []string{"ADYEN_MERCHANT_ACCOUNT=BillingECOM"}, "ADYEN_MERCHANT_ACCOUNT", "PAYMENT_PROVIDER"},
		{"ErrPaymentResolveAfterZero", []string{"PAYMENT_RESOLVE_AFTER=0"}, "PAYMENT_RESOLVE_AFTER", ""},
		{"ErrPaymentResolveAfterTooLong", []string{"PAYMENT_RESOLVE_AFTER=25h"}, "PAYMENT_RESOLVE_AFTER", ""},
		{"ErrWebhookAddrNotHostPort", []string{"WEBHOOK_ADDR=8090"}, "WEBHOOK_ADDR", ""},
		{"ErrWebhookAddrIsHTTPAddr", []string{"WEBHOOK_ADDR=:8080", "HTTP_ADDR=:8080"}, "WEBHOOK_ADDR", "HTTP_ADDR"},
		{"ErrWebhookSecretEmptyItem", []string{"PAYMENT_WEBHOOK_SECRET=a,,b"}, "PAYMENT_WEBHOOK_SECRET", ""},
		{"ErrOutcomeTopicEqualsDLQ", []string{"KAFKA_OUTCOME_TOPIC=orders.confirmed.dlq"}, "KAFKA_OUTCOME_TOPIC", ""},
		{"ErrOutboxRetentionTooShort", []string{"OUTBOX_RETENTION=2h"}, "OUTBOX_RETENTION", ""},
		{"ErrPaymentBaseURLEmpty", []string{"PAYMENT_BASE_URL="}, "PAYMENT_BASE_URL", ""},
		{"ErrPaymentBaseURLFTP", []string{"PAYMENT_BASE_URL=ftp://psp.example.com"}, "PAYMENT_BASE_URL", ""},
		{"ErrPaymentBaseURLNoScheme", []string{"PAYMENT_BASE_URL=psp.example.com"}, "PAYMENT_BASE_URL", ""},
		{"ErrPaymentBaseURLHostPortNoScheme", []string{"PAYMENT_BASE_URL=psp:8080"}, "PAYMENT_BASE_URL", ""},
		{"ErrPaymentBaseURLNoHost", []string{"PAYMENT_BASE_URL=http://"}, "PAYMENT_BASE_URL", ""},
		{"ErrPaymentBaseURLUnparsable", []string{"PAYMENT_BASE_URL=http://psp:port"}, "PAYMENT_BASE_URL", ""},
		{"ErrPaymentBaseURLCredentials", []string{"PAYMENT_BASE_URL=https://user:pw@psp.example.com"}, "PAYMENT_BASE_URL", "PAYMENT_API_KEY"},
		{"ErrPaymentBaseURLUserOnly", []string{"PAYMENT_BASE_URL=https://user@psp.example.com"}, "PAYMENT_BASE_URL", ""},
		{"ErrPaymentTimeoutUnparsable", []string{"PAYMENT_TIMEOUT=ten"}, "PAYMENT_TIMEOUT", ""},
		{"ErrPaymentTimeoutNoUnit", []string{"PAYMENT_TIMEOUT=10"}, "PAYMENT_TIMEOUT", ""},
		{"ErrPaymentTimeoutZero", []string{"PAYMENT_TIMEOUT=0s"}, "PAYMENT_TIMEOUT", ""},
		{"ErrPaymentTimeoutNegative", []string{"PAYMENT_TIMEOUT=-1s"}, "PAYMENT_TIMEOUT", ""},
		{"ErrPaymentTimeoutTooLong", []string{"PAYMENT_TIMEOUT=6m"}, "PAYMENT_TIMEOUT", ""},
		{"ErrHTTPAddrNoPort", []string{"HTTP_ADDR=8080"}, "HTTP_ADDR", ""},
		{"ErrHTTPAddrHostOnly", []string{"HTTP_ADDR=localhost"}, "HTTP_ADDR", ""},
		{"ErrPprofAddrNoPort", []string{"DEBUG_PPROF_ADDR=6060"}, "DEBUG_PPROF_ADDR", ""},
		{"ErrPprofAddrHTTPAddrsListener", []string{"DEBUG_PPROF_ADDR=:8080"}, "DEBUG_PPROF_ADDR", "HTTP_ADDR"},
		{"ErrPprofAddrHTTPAddrsPortOnEveryHost", []string{"HTTP_ADDR=127.0.0.1:9000", "DEBUG_PPROF_ADDR=:9000"}, "DEBUG_PPROF_ADDR", "HTTP_ADDR"},
		{"ErrDedupRetentionTooShort", []string{"DEDUP_RETENTION=23h59m"}, "DEDUP_RETENTION", ""},
		{"ErrDedupRetentionZero", []string{"DEDUP_RETENTION=0s"}, "DEDUP_RETENTION", ""},
		{"ErrDedupRetentionUnparsable", []string{"DEDUP_RETENTION=7d"}, "DEDUP_RETENTION", ""},
		{"ErrDedupAllowShortRetentionNotBool", []string{"DEDUP_ALLOW_SHORT_RETENTION=yes please"}, "DEDUP_ALLOW_SHORT_RETENTION", ""},
		{"ErrLogLevelUnknown", []string{"LOG_LEVEL=verbose"}, "LOG_LEVEL", ""},
		{"ErrLogFormatUnknown", []string{"LOG_FORMAT=logfmt"}, "LOG_FORMAT", ""},
		{"ErrLogFormatUpperCase", []string{"LOG_FORMAT=JSON"}, "LOG_FORMAT", ""},
		{"ErrMaxInFlightNegative", []string{"MAX_IN_FLIGHT=-1"}, "MAX_IN_FLIGHT", ""},
		{"ErrMaxInFlightTooMany", []string{"MAX_IN_FLIGHT=100001"}, "MAX_IN_FLIGHT", ""},
		{"ErrMaxInFlightNotNumber", []string{"MAX_IN_FLIGHT=lots"}, "MAX_IN_FLIGHT", ""},
		{"ErrDrainTimeoutZero", []string{"DRAIN_TIMEOUT=0s"}, "DRAIN_TIMEOUT", ""},
		{"ErrDrainTimeoutNegative", []string{"DRAIN_TIMEOUT=-5s"}, "DRAIN_TIMEOUT", ""},
		{"ErrDrainTimeoutUnparsable", []string{"DRAIN_TIMEOUT=soon"}, "DRAIN_TIMEOUT", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := load(t, minimalEnv(t, tt.env...))
			if err == nil {
				t.Fatalf("Load accepted %q", tt.env)
			}
			ve := varError(t, err, tt.wantVar)
			if !strings.Contains(err.Error(), tt.wantVar) {
				t.Errorf("error %q does not name %s", err, tt.wantVar)
			}
			if tt.alsoNames != "" && !strings.Contains(ve.Error(), tt.alsoNames) {
				t.Errorf("error %q does not mention %s", ve, tt.alsoNames)
			}
		})
	}
}

// adyenKey is an Adyen HMAC key, hex.
const adyenKey = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056"

// adyenEnv is the environment of a serve for Adyen, with overrides (a
// name alone unsets it).
func adyenEnv(overrides ...string) []string {
	return append([]string{"PAYMENT_PROVIDER=adyen", "PAYMENT_BASE_URL=https://checkout-test.adyen.com/v71",
		"ADYEN_MERCHANT_ACCOUNT=BillingECOM", "PAYMENT_WEBHOOK_SECRET=" + adyenKey}, overrides...)
}

// varError returns the error about variable name among err's, failing the
// test when err is not a config.Errors that names it.
func varError(t *testing.T, err error, name string) *config.VarError {
	t.Helper()
	var errs config.Errors
	if !errors.As(err, &errs) {
		t.Fatalf("error %q (%T) is not a config.Errors", err, err)
	}
	for _, ve := range errs {
		if ve.Var == name {
			return ve
		}
	}
	t.Fatalf("error names %q, want %s among them (error: %v)", errs.Vars(), name, err)
	return nil
}

// TestLoad_EveryProblemAtOnce: an operator fixing a configuration learns
// of every bad variable in one start, in the order of the configuration,
// each named once.
func TestLoad_EveryProblemAtOnce(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"ErrNothingSet", map[string]string{}, []string{"DATABASE_URL", "PAYMENT_BASE_URL"}},
		{"ErrSeveralBad", minimalEnv(t, "KAFKA_BROKERS=", "KAFKA_TOPIC=a b", "DATABASE_MAX_CONNS=0",
			"PAYMENT_TIMEOUT=ten", "DRAIN_TIMEOUT=soon", "LOG_FORMAT=xml", "HTTP_ADDR=8080"),
			[]string{"KAFKA_BROKERS", "KAFKA_TOPIC", "DATABASE_MAX_CONNS", "PAYMENT_TIMEOUT", "DRAIN_TIMEOUT", "HTTP_ADDR", "LOG_FORMAT"}},
		// A value that cannot be read is reported as such, not a second
		// time for the zero it leaves behind.
		{"ErrUnreadableReportedOnce", minimalEnv(t, "MAX_IN_FLIGHT=eight"), []string{"MAX_IN_FLIGHT"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := load(t, tt.env)
			var errs config.Errors
			if !errors.As(err, &errs) {
				t.Fatalf("error %v (%T) is not a config.Errors", err, err)
			}
			if got := errs.Vars(); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("variables at fault = %q, want %q\n%v", got, tt.want, err)
			}
			for _, name := range tt.want {
				if !strings.Contains(err.Error(), name) {
					t.Errorf("message does not name %s:\n%v", name, err)
				}
			}
		})
	}
}

// TestLoad_ErrorsKeepSecrets: the start-up error is printed to the log, so
// it must not repeat the secret that was in the bad value.
func TestLoad_ErrorsKeepSecrets(t *testing.T) {
	t.Parallel()
	const secret = "Sup3rSecretPw"
	tests := []struct {
		name    string
		env     []string
		wantVar string
	}{
		{"ErrDatabaseURLBadPort", []string{"DATABASE_URL=postgres://billing:" + secret + "@db:port/billing"}, "DATABASE_URL"},
		{"ErrDatabaseURLBadEscape", []string{"DATABASE_URL=postgres://billing:" + secret + "@db/%zz"}, "DATABASE_URL"},
		{"ErrDatabaseURLKeyValueBroken", []string{"DATABASE_URL=password=" + secret + " host='db"}, "DATABASE_URL"},
		{"ErrPaymentBaseURLCredentials", []string{"PAYMENT_BASE_URL=https://user:" + secret + "@psp.example.com"}, "PAYMENT_BASE_URL"},
		{"ErrPaymentBaseURLCredentialsBadScheme", []string{"PAYMENT_BASE_URL=ftp://user:" + secret + "@psp.example.com"}, "PAYMENT_BASE_URL"},
		{"ErrPaymentBaseURLCredentialsBadPort", []string{"PAYMENT_BASE_URL=https://user:" + secret + "@psp:port"}, "PAYMENT_BASE_URL"},
		{"ErrSASLPasswordWithoutMechanism", []string{"KAFKA_SASL_PASSWORD=" + secret}, "KAFKA_SASL_MECHANISM"},
		{"ErrAdyenWebhookSecretNotHex", adyenEnv("PAYMENT_WEBHOOK_SECRET=" + adyenKey + "," + secret), "PAYMENT_WEBHOOK_SECRET"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := load(t, minimalEnv(t, tt.env...))
			varError(t, err, tt.wantVar)
			if strings.Contains(err.Error(), secret) {
				t.Errorf("error reveals the secret: %q", err)
			}
		})
	}
}

// logConfig logs cfg the way serve does, through a JSON handler.
func logConfig(t *testing.T, cfg any) string {
	t.Helper()
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("billing starting", "config", cfg)
	return buf.String()
}

func TestServe_LogValue(t *testing.T) {
	t.Parallel()
	const (
		apiKey   = "psp-Key-S3cret"
		saslPass = "sasl-Pass-S3cret"
		dbPass   = "db-Pass-S3cret"
		whSecret = "whsec_S3cret"
	)
	tests := []struct {
		name  string
		dbURL string
		// dbShown are non-secret parts of DATABASE_URL the log must keep.
		dbShown []string
	}{
		{"OK_URLForm", "postgres://billing:" + dbPass + "@db.internal:5432/billing?sslmode=require", []string{"db.internal:5432/billing", "sslmode=require"}},
		{"OK_URLQueryForm", "postgres://billing@db.internal:5432/billing?password=" + dbPass + "&sslmode=require", []string{"db.internal:5432/billing", "sslmode=require"}},
		{"OK_KeyValueForm", "host=db.internal password=" + dbPass + " dbname=billing", []string{"host=db.internal", "dbname=billing"}},
		{"OK_KeyValueQuotedForm", "host=db.internal password='" + dbPass + " x' dbname=billing", []string{"host=db.internal", "dbname=billing"}},
		{"OK_KeyValueSpacedForm", "host=db.internal password = " + dbPass + " dbname=billing", []string{"host=db.internal", "dbname=billing"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := mustLoad(t, minimalEnv(t,
				"DATABASE_URL="+tt.dbURL,
				"PAYMENT_API_KEY="+apiKey,
				"KAFKA_SASL_MECHANISM=SCRAM-SHA-256",
				"KAFKA_SASL_USERNAME=billing-user",
				"KAFKA_SASL_PASSWORD="+saslPass,
				"KAFKA_BROKERS=kafka-0.internal:9092",
				"PAYMENT_BASE_URL=https://psp.example.com/api",
				"PAYMENT_WEBHOOK_SECRET=whsec_old,"+whSecret,
			))
			for _, how := range []struct {
				name string
				v    any
			}{{"value", cfg}, {"pointer", &cfg}} {
				out := logConfig(t, how.v)
				for _, s := range []string{apiKey, saslPass, dbPass, whSecret, "whsec_old"} {
					if strings.Contains(out, s) {
						t.Errorf("logged %s config reveals %q:\n%s", how.name, s, out)
					}
				}
				shown := append([]string{
					"kafka-0.internal:9092", "orders.confirmed.dlq", "billing-order-confirmed",
					"SCRAM-SHA-256", "billing-user", "https://psp.example.com/api", ":8080", "max_conns",
				}, tt.dbShown...)
				for _, s := range shown {
					if !strings.Contains(out, s) {
						t.Errorf("logged %s config lacks %q:\n%s", how.name, s, out)
					}
				}
			}
		})
	}
}

// TestVars: every variable a command reads is explained, and Vars reports
// what the struct tags say, so that help and docs/configuration.md, which
// are generated from it, are right.
func TestVars(t *testing.T) {
	t.Parallel()
	for _, cfg := range []any{&config.Serve{}, &config.Migrate{}, &config.Maintain{}, &config.Kafka{}, &config.Topics{}, &config.Resolve{}} {
		seen := map[string]bool{}
		for _, v := range config.Vars(cfg) {
			if v.Help == "" {
				t.Errorf("%T: %s has no help tag", cfg, v.Name)
			}
			if seen[v.Name] {
				t.Errorf("%T: %s is declared twice", cfg, v.Name)
			}
			seen[v.Name] = true
			if v.Required && v.Default != "" {
				t.Errorf("%T: %s is required and has a default", cfg, v.Name)
			}
		}
	}

	byName := map[string]config.Var{}
	for _, v := range config.Vars(config.Serve{}) {
		byName[v.Name] = v
	}
	tests := []struct {
		name string
		want config.Var
	}{
		{"OK_Default", config.Var{Name: "KAFKA_BROKERS", Default: "localhost:9092"}},
		{"OK_Required", config.Var{Name: "DATABASE_URL", Required: true}},
		{"OK_NoDefault", config.Var{Name: "KAFKA_INSTANCE_ID"}},
		{"OK_Embedded", config.Var{Name: "PARTITIONS_AHEAD", Default: "3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := byName[tt.want.Name]
			if !ok {
				t.Fatalf("Vars(Serve) lacks %s", tt.want.Name)
			}
			got.Help = ""
			if got != tt.want {
				t.Errorf("Vars: %+v, want %+v", got, tt.want)
			}
		})
	}
	// Serve reads what its contract lists, and every one of them is tested
	// above.
	for _, s := range settings {
		if _, ok := byName[s.name]; !ok {
			t.Errorf("Vars(Serve) lacks %s", s.name)
		}
	}
}

// TestDefaultRetentions: the constants maintain compares the retentions
// with are the variables' defaults.
func TestDefaultRetentions(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		cfg  any
		name string
		want time.Duration
	}{
		{&config.DedupRetention{}, "DEDUP_RETENTION", config.DefaultDedupRetention},
		{&config.Outbox{}, "OUTBOX_RETENTION", config.DefaultOutboxRetention},
	} {
		vars := config.Vars(tt.cfg)
		if len(vars) != 1 || vars[0].Name != tt.name {
			t.Fatalf("Vars(%T) = %+v, want %s alone", tt.cfg, vars, tt.name)
		}
		if d, err := time.ParseDuration(vars[0].Default); err != nil || d != tt.want {
			t.Errorf("%s defaults to %q, the constant says %s", tt.name, vars[0].Default, tt.want)
		}
	}
}

// TestValidate_ChangesNothing: Validate only judges; defaults and tidying
// happen in Load, so a configuration checked twice is checked the same.
func TestValidate_ChangesNothing(t *testing.T) {
	t.Parallel()
	cfg := mustLoad(t, minimalEnv(t))
	cfg.Kafka.Brokers = []string{" kafka-0:9092"}
	cfg.Consumer.MaxInFlight = 0
	before := cfg
	before.Kafka.Brokers = slices.Clone(cfg.Kafka.Brokers)
	_ = cfg.Validate()
	if !reflect.DeepEqual(cfg, before) {
		t.Errorf("Validate changed the configuration:\n got %+v\nwant %+v", cfg, before)
	}
}

// TestTopics_AsKafka: devkafka creates the topics serve consumes unless
// told otherwise, so Topics must read the same variables as Kafka, with the
// same defaults.
func TestTopics_AsKafka(t *testing.T) {
	t.Parallel()
	kafka := map[string]config.Var{}
	for _, v := range config.Vars(config.Kafka{}) {
		kafka[v.Name] = v
	}
	for _, v := range config.Vars(config.Topics{}) {
		if v != kafka[v.Name] {
			t.Errorf("Topics reads %+v, Kafka %+v", v, kafka[v.Name])
		}
	}
	var topics config.Topics
	if err := config.Load(map[string]string{"KAFKA_DLQ_TOPIC": "orders.confirmed"}, &topics); err == nil {
		t.Error("Topics accepted a dead-letter topic equal to the topic")
	}
}

// A retired variable still set does not stop the process: it is named,
// with what replaced it, so that nobody tunes a knob that turns nothing.
func TestRetired(t *testing.T) {
	t.Parallel()
	env := minimalEnv(t, "CONSUMER_LANES=32", "CONSUMER_BATCH_MAX=32", "KAFKA_COMMIT_EVERY_MESSAGE=true")
	if _, err := load(t, env); err != nil {
		t.Fatalf("a retired variable stopped the process: %v", err)
	}
	got := config.Retired(env)
	if len(got) != 3 || !strings.HasPrefix(got[0], "CONSUMER_BATCH_MAX is set but no longer read: ") ||
		!strings.HasPrefix(got[1], "CONSUMER_LANES is set but no longer read: ") || !strings.Contains(got[1], "MAX_IN_FLIGHT") ||
		!strings.HasPrefix(got[2], "KAFKA_COMMIT_EVERY_MESSAGE is set but no longer read: ") {
		t.Errorf("Retired = %q", got)
	}
	if got := config.Retired(minimalEnv(t)); len(got) != 0 {
		t.Errorf("Retired without them = %q", got)
	}
}

// A variable released under an earlier name keeps working by that name,
// and the process names the new one; the new name wins when both are set,
// and an error in a value set by the earlier name names that one.
func TestRenamed(t *testing.T) {
	t.Parallel()
	t.Run("OK_EarlierNames", func(t *testing.T) {
		t.Parallel()
		env := minimalEnv(t, "DEDUP_PARTITIONS_AHEAD=5", "DEDUP_MAINTENANCE_INTERVAL=10m")
		cfg := mustLoad(t, env)
		if cfg.Maintenance.Ahead != 5 || cfg.Maintenance.Interval != 10*time.Minute {
			t.Errorf("serve read %+v, want 5 days ahead every 10m", cfg.Maintenance)
		}
		var m config.Maintain
		if err := config.Load(maps.Clone(env), &m); err != nil || m.Partitions.Ahead != 5 {
			t.Errorf("maintain read %+v, %v; want 5 days ahead", m.Partitions, err)
		}
		got := config.Renamed(env)
		if len(got) != 2 || !strings.HasPrefix(got[0], "DEDUP_MAINTENANCE_INTERVAL is an earlier name of PARTITION_MAINTENANCE_INTERVAL") ||
			!strings.HasPrefix(got[1], "DEDUP_PARTITIONS_AHEAD is an earlier name of PARTITIONS_AHEAD") {
			t.Errorf("Renamed = %q", got)
		}
	})
	t.Run("OK_NewNameWins", func(t *testing.T) {
		t.Parallel()
		env := minimalEnv(t, "DEDUP_PARTITIONS_AHEAD=5", "PARTITIONS_AHEAD=7")
		if cfg := mustLoad(t, env); cfg.Maintenance.Ahead != 7 {
			t.Errorf("PARTITIONS_AHEAD = %d, want 7", cfg.Maintenance.Ahead)
		}
		if got := config.Renamed(env); len(got) != 1 || !strings.HasPrefix(got[0], "DEDUP_PARTITIONS_AHEAD is set but ignored: PARTITIONS_AHEAD") {
			t.Errorf("Renamed = %q", got)
		}
	})
	t.Run("ErrNamesTheEarlierName", func(t *testing.T) {
		t.Parallel()
		_, err := load(t, minimalEnv(t, "DEDUP_PARTITIONS_AHEAD=0", "DEDUP_MAINTENANCE_INTERVAL=soon"))
		var errs config.Errors
		if !errors.As(err, &errs) || !slices.Equal(errs.Vars(), []string{"DEDUP_PARTITIONS_AHEAD", "DEDUP_MAINTENANCE_INTERVAL"}) {
			t.Errorf("Load: %v; want DEDUP_PARTITIONS_AHEAD and DEDUP_MAINTENANCE_INTERVAL named", err)
		}
	})
	if got := config.Renamed(minimalEnv(t)); len(got) != 0 {
		t.Errorf("Renamed without them = %q", got)
	}
}

// maintain, reconcile's provider and the import read Adyen's settings too.
func TestLoad_AdyenBeyondServe(t *testing.T) {
	t.Parallel()
	const db = "postgres://billing@db.internal:5432/billing"
	t.Run("MaintainWithoutAProviderOnlyReports", func(t *testing.T) {
		var m config.Maintain
		if err := config.Load(map[string]string{"DATABASE_URL": db, "PAYMENT_PROVIDER": "adyen"}, &m); err != nil {
			t.Fatal(err)
		}
		if m.Payment.BaseURL != "" || m.Payment.IdempotencyWindow != 744*time.Hour {
			t.Errorf("payment %+v: want no provider, Adyen's 744h window", m.Payment)
		}
	})
	t.Run("MaintainAsksAdyenForItsMerchantAccount", func(t *testing.T) {
		var m config.Maintain
		err := config.Load(map[string]string{"DATABASE_URL": db, "PAYMENT_PROVIDER": "adyen",
			"PAYMENT_BASE_URL": "https://checkout-test.adyen.com/v71"}, &m)
		varError(t, err, "ADYEN_MERCHANT_ACCOUNT")
		m = config.Maintain{}
		if err := config.Load(map[string]string{"DATABASE_URL": db, "PAYMENT_PROVIDER": "adyen",
			"PAYMENT_BASE_URL": "https://checkout-test.adyen.com/v71", "ADYEN_MERCHANT_ACCOUNT": "BillingECOM"}, &m); err != nil {
			t.Fatal(err)
		}
		if api := m.Payment.API(); api.MerchantAccount != "BillingECOM" || api.Provider != "adyen" || api.IdempotencyWindow != 744*time.Hour {
			t.Errorf("API() = %+v", api)
		}
	})
	t.Run("ImportForAdyen", func(t *testing.T) {
		var p config.PaymentMethods
		if err := config.Load(map[string]string{"DATABASE_URL": db, "PAYMENT_PROVIDER": "adyen"}, &p); err != nil {
			t.Fatal(err)
		}
	})
}
