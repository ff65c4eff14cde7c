package config

import (
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/lib/pq"

	"example.com/billing/internal/redact"
)

// This file holds what each setting accepts (Validate), what it derives
// (normalize) and how it is logged without its secrets (LogValue).

// topicName is what Kafka accepts as a topic name.
var topicName = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

// normalize trims the broker addresses: "kafka-0:9092, kafka-1:9092" is a
// natural way to write the list, and sarama dials each address as given,
// so " kafka-1" would never resolve.
func (k *Kafka) normalize() {
	for i, b := range k.Brokers {
		k.Brokers[i] = strings.TrimSpace(b)
	}
}

// Validate checks the Kafka settings.
func (k *Kafka) Validate() error {
	var errs Errors
	for _, b := range k.Brokers {
		host, port, err := net.SplitHostPort(b)
		if err != nil || host == "" {
			errs.add("KAFKA_BROKERS", "%q is not host:port", b)
			break
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			errs.add("KAFKA_BROKERS", "%q has no valid port", b)
			break
		}
	}
	errs = append(errs, checkTopics(k.Topic, k.DLQTopic)...)
	if !topicName.MatchString(k.OutcomeTopic) {
		errs.add("KAFKA_OUTCOME_TOPIC", "%q is not a valid topic name", k.OutcomeTopic)
	} else if k.OutcomeTopic == k.Topic || k.OutcomeTopic == k.DLQTopic {
		errs.add("KAFKA_OUTCOME_TOPIC", "must differ from KAFKA_TOPIC and KAFKA_DLQ_TOPIC")
	}
	if strings.TrimSpace(k.GroupID) == "" {
		errs.add("KAFKA_GROUP_ID", "must not be empty")
	}
	if strings.TrimSpace(k.ClientID) == "" {
		errs.add("KAFKA_CLIENT_ID", "must not be empty")
	}
	if _, err := sarama.ParseKafkaVersion(k.Version); err != nil {
		errs.add("KAFKA_VERSION", "%q is not a Kafka version", k.Version)
	}
	files := []struct{ name, path string }{
		{"KAFKA_TLS_CA_FILE", k.TLSCAFile}, {"KAFKA_TLS_CERT_FILE", k.TLSCertFile}, {"KAFKA_TLS_KEY_FILE", k.TLSKeyFile},
	}
	for _, f := range files {
		switch {
		case f.path == "":
		case !k.TLSEnabled:
			errs.add(f.name, "is set but KAFKA_TLS_ENABLED is false")
		default:
			if _, err := os.Stat(f.path); err != nil {
				errs.add(f.name, "%w", err)
			}
		}
	}
	if (k.TLSCertFile == "") != (k.TLSKeyFile == "") {
		errs.add("KAFKA_TLS_CERT_FILE", "KAFKA_TLS_CERT_FILE and KAFKA_TLS_KEY_FILE go together")
	}
	switch k.SASLMechanism {
	case "":
		if k.SASLUsername != "" || k.SASLPassword != "" {
			errs.add("KAFKA_SASL_MECHANISM", "is required when KAFKA_SASL_USERNAME or KAFKA_SASL_PASSWORD is set")
		}
	case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
		if k.SASLUsername == "" {
			errs.add("KAFKA_SASL_USERNAME", "is required with KAFKA_SASL_MECHANISM=%s", k.SASLMechanism)
		}
		if k.SASLPassword == "" {
			errs.add("KAFKA_SASL_PASSWORD", "is required with KAFKA_SASL_MECHANISM=%s", k.SASLMechanism)
		}
	default:
		errs.add("KAFKA_SASL_MECHANISM", "%q is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512", k.SASLMechanism)
	}
	return errs.err()
}

// checkTopics checks the names of the order topic and its dead-letter topic.
func checkTopics(topic, dlq string) Errors {
	var errs Errors
	if !topicName.MatchString(topic) {
		errs.add("KAFKA_TOPIC", "%q is not a valid topic name", topic)
	}
	if !topicName.MatchString(dlq) {
		errs.add("KAFKA_DLQ_TOPIC", "%q is not a valid topic name", dlq)
	} else if dlq == topic {
		errs.add("KAFKA_DLQ_TOPIC", "must differ from KAFKA_TOPIC")
	}
	return errs
}

// Validate checks the topic names.
func (t *Topics) Validate() error { return checkTopics(t.Topic, t.DLQTopic).err() }

// LogValue masks the SASL password.
func (k Kafka) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Any("brokers", k.Brokers),
		slog.String("topic", k.Topic),
		slog.String("group_id", k.GroupID),
		slog.String("dlq_topic", k.DLQTopic),
		slog.String("outcome_topic", k.OutcomeTopic),
		slog.String("client_id", k.ClientID),
		slog.String("instance_id", k.InstanceID),
		slog.String("version", k.Version),
		slog.Bool("tls", k.TLSEnabled),
		slog.String("sasl_mechanism", k.SASLMechanism),
		slog.String("sasl_username", k.SASLUsername),
		slog.String("sasl_password", mask(k.SASLPassword)),
	)
}

// Validate checks the database URL.
func (d *Database) Validate() error {
	var errs Errors
	if _, err := pq.NewConfig(d.URL); err != nil {
		// The parser's message can quote the URL; keep the password out.
		errs.add("DATABASE_URL", "cannot be parsed: %s", redact.DSN(err.Error()))
	}
	return errs.err()
}

// LogValue masks the password in the URL.
func (d Database) LogValue() slog.Value {
	return slog.GroupValue(slog.String("url", redact.DSN(d.URL)))
}

// Validate checks the database URL and the pool size.
func (p *Pool) Validate() error {
	var errs Errors
	if p.MaxConns < 1 || p.MaxConns > 1000 {
		errs.add("DATABASE_MAX_CONNS", "%d is outside 1..1000", p.MaxConns)
	}
	return errors.Join(p.Database.Validate(), errs.err())
}

// LogValue masks the password in the URL.
func (p Pool) LogValue() slog.Value {
	return slog.GroupValue(slog.String("url", redact.DSN(p.URL)), slog.Int("max_conns", p.MaxConns))
}

// normalize fills in the provider's address and idempotency window.
func (p *Payment) normalize() {
	p.BaseURL = providerBaseURL(p.Provider, p.BaseURL)
	p.IdempotencyWindow = providerWindow(p.Provider, p.IdempotencyWindow)
}

// Validate checks the payment provider settings.
func (p *Payment) Validate() error {
	errs := checkProvider(p.Provider)
	if p.BaseURL == "" {
		errs.add("PAYMENT_BASE_URL", "is required with PAYMENT_PROVIDER=%s", p.Provider)
	} else {
		errs = append(errs, checkBaseURL(p.Provider, p.BaseURL)...)
	}
	errs = append(errs, checkMerchantAccount(p.Provider, p.MerchantAccount, true)...)
	return errors.Join(errs.err(), p.PaymentLimits.Validate())
}

// checkMerchantAccount checks ADYEN_MERCHANT_ACCOUNT: required with adyen
// when billing speaks to Adyen (required), meaningless with another
// provider.
func checkMerchantAccount(provider, account string, required bool) Errors {
	var errs Errors
	switch {
	case provider != ProviderAdyen && account != "":
		errs.add("ADYEN_MERCHANT_ACCOUNT", "is set but PAYMENT_PROVIDER is %s", provider)
	case provider == ProviderAdyen && required && strings.TrimSpace(account) == "":
		errs.add("ADYEN_MERCHANT_ACCOUNT", "is required with PAYMENT_PROVIDER=adyen")
	}
	return errs
}

// normalize fills in the provider's idempotency window, and Stripe's
// address when its key is set.
func (p *OptionalPayment) normalize() {
	if p.Provider != ProviderStripe || p.APIKey != "" {
		p.BaseURL = providerBaseURL(p.Provider, p.BaseURL)
	}
	p.IdempotencyWindow = providerWindow(p.Provider, p.IdempotencyWindow)
}

// Validate checks maintain's provider settings: the address only when set.
func (p *OptionalPayment) Validate() error {
	errs := checkProvider(p.Provider)
	if p.BaseURL != "" {
		errs = append(errs, checkBaseURL(p.Provider, p.BaseURL)...)
	}
	errs = append(errs, checkMerchantAccount(p.Provider, p.MerchantAccount, p.BaseURL != "")...)
	return errors.Join(errs.err(), p.PaymentLimits.Validate())
}

func checkProvider(name string) Errors {
	var errs Errors
	switch name {
	case ProviderContract, ProviderStripe, ProviderAdyen:
	default:
		errs.add("PAYMENT_PROVIDER", "%q is not one of contract, stripe, adyen", name)
	}
	return errs
}

// providerBaseURL is base, or the provider's public API when base is
// unset and the provider has one.
func providerBaseURL(provider, base string) string {
	if base == "" && provider == ProviderStripe {
		return StripeBaseURL
	}
	return base
}

// providerWindow is window, or, when it is 0, how long the provider keeps
// an idempotency key: Stripe prunes keys after at least 24 hours, and the
// contract follows it; Adyen keeps them at least 31 days after the first
// request (its "API idempotency" page; earlier versions of it said 7 to
// 14 days: an operator sets the window to the floor Adyen documents when
// it changes).
func providerWindow(provider string, window time.Duration) time.Duration {
	switch {
	case window != 0:
		return window
	case provider == ProviderAdyen:
		return 31 * 24 * time.Hour
	}
	return 24 * time.Hour
}

// Validate checks the webhook settings; whether a secret is required
// depends on the provider (Serve.Validate).
func (w *Webhooks) Validate() error {
	var errs Errors
	if _, _, err := net.SplitHostPort(w.Addr); err != nil {
		errs.add("WEBHOOK_ADDR", "%q is not [host]:port", w.Addr)
	}
	for _, s := range w.Secrets {
		if strings.TrimSpace(s) == "" {
			errs.add("PAYMENT_WEBHOOK_SECRET", "holds an empty secret")
			break
		}
	}
	return errs.err()
}

// LogValue masks the secrets.
func (w Webhooks) LogValue() slog.Value {
	return slog.GroupValue(slog.String("addr", w.Addr), slog.Int("secrets", len(w.Secrets)))
}

// checkoutVersion is the end of the path of Adyen's Checkout API root: its
// version, /v71.
var checkoutVersion = regexp.MustCompile(`/v[0-9]+/?$`)

func checkBaseURL(provider, base string) Errors {
	var errs Errors
	u, err := url.Parse(base)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		// An operator who put credentials in the URL must not find them
		// in the log.
		errs.add("PAYMENT_BASE_URL", "%q is not an http(s) URL", redact.DSN(base))
	case u.User != nil:
		errs.add("PAYMENT_BASE_URL", "must not carry credentials; use PAYMENT_API_KEY")
	case provider == ProviderAdyen && !checkoutVersion.MatchString(u.Path):
		// Without the version every charge would meet a 404, retried
		// for ever.
		errs.add("PAYMENT_BASE_URL", "%q is not Adyen's Checkout API root with its version (e.g. https://checkout-test.adyen.com/v71)", redact.DSN(base))
	}
	return errs
}

// normalize derives PAYMENT_RECOVER_AFTER's default from the timeout.
func (p *PaymentLimits) normalize() {
	if p.RecoverAfter == 0 {
		p.RecoverAfter = max(time.Minute, 2*p.Timeout)
	}
}

// Validate checks the provider's limits.
func (p *PaymentLimits) Validate() error {
	errs := checkSending(p.Timeout, p.IdempotencyWindow, p.RecoverAfter)
	if p.MaxConcurrency < 1 || p.MaxConcurrency > 100000 {
		errs.add("PAYMENT_MAX_CONCURRENCY", "%d is outside 1..100000", p.MaxConcurrency)
	}
	if p.MaxRPS < 0 || p.MaxRPS > 1e6 {
		errs.add("PAYMENT_MAX_RPS", "%v is outside 0..1000000 (0 is unlimited)", p.MaxRPS)
	}
	if p.ResolveAfter < time.Second || p.ResolveAfter > 24*time.Hour {
		errs.add("PAYMENT_RESOLVE_AFTER", "%s is outside [1s, 24h]", p.ResolveAfter)
	}
	return errs.err()
}

// checkSending checks the settings that say how long a request may be in
// flight and when an attempt is never sent again.
func checkSending(timeout, window, recoverAfter time.Duration) Errors {
	var errs Errors
	if timeout <= 0 || timeout > 5*time.Minute {
		errs.add("PAYMENT_TIMEOUT", "%s is outside (0, 5m]", timeout)
	}
	if window < time.Hour {
		errs.add("PAYMENT_IDEMPOTENCY_WINDOW", "%s is shorter than 1h; set it to how long the provider keeps an idempotency key (Stripe: 24h), or 0 for the provider's", window)
	}
	if recoverAfter <= timeout || recoverAfter >= window {
		errs.add("PAYMENT_RECOVER_AFTER", "%s must be longer than PAYMENT_TIMEOUT (%s) and shorter than PAYMENT_IDEMPOTENCY_WINDOW (%s)", recoverAfter, timeout, window)
	}
	return errs
}

// LogValue masks the API key.
func (p Payment) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("provider", p.Provider),
		slog.String("base_url", p.BaseURL),
		slog.String("merchant_account", p.MerchantAccount),
		slog.String("api_key", mask(p.APIKey)),
		slog.Duration("timeout", p.Timeout),
		slog.Int("max_concurrency", p.MaxConcurrency),
		slog.Float64("max_rps", p.MaxRPS),
		slog.Duration("idempotency_window", p.IdempotencyWindow),
		slog.Duration("recover_after", p.RecoverAfter),
		slog.Duration("resolve_after", p.ResolveAfter),
	)
}

// Validate checks the shared budget.
func (f *Fleet) Validate() error {
	var errs Errors
	if f.AccountMaxRPS < 0 || f.AccountMaxRPS > 1e6 {
		errs.add("PAYMENT_ACCOUNT_MAX_RPS", "%v is outside 0..1000000 (0 is none)", f.AccountMaxRPS)
	}
	return errs.err()
}

// Validate checks the consumer settings.
func (c *Consumer) Validate() error {
	var errs Errors
	if c.MaxInFlight < 0 || c.MaxInFlight > 100000 {
		errs.add("MAX_IN_FLIGHT", "%d is outside 0..100000", c.MaxInFlight)
	}
	if c.MaxInFlightBytes < 1<<20 || c.MaxInFlightBytes > 64<<30 {
		errs.add("MAX_IN_FLIGHT_BYTES", "%d is outside 1 MiB..64 GiB", c.MaxInFlightBytes)
	}
	if c.DrainTimeout <= 0 {
		errs.add("DRAIN_TIMEOUT", "must be positive")
	}
	return errs.err()
}

// LogValue lists the consumer settings.
func (c Consumer) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Int("max_in_flight", c.MaxInFlight),
		slog.Int64("max_in_flight_bytes", c.MaxInFlightBytes),
		slog.Duration("drain_timeout", c.DrainTimeout),
	)
}

// Validate checks the dedup store's retention.
func (d *DedupRetention) Validate() error {
	var errs Errors
	if d.Retention < 24*time.Hour {
		errs.add("DEDUP_RETENTION", "%s is shorter than 24h (partitions are daily)", d.Retention)
	}
	return errs.err()
}

// Validate checks the dedup store's settings.
func (d *Dedup) Validate() error {
	var errs Errors
	if d.MaxFutureSkew < time.Second || d.MaxFutureSkew > 24*time.Hour {
		errs.add("DEDUP_MAX_FUTURE_SKEW", "%s is outside [1s, 24h]", d.MaxFutureSkew)
	}
	return errors.Join(d.DedupRetention.Validate(), errs.err())
}

// Validate checks how many days of partitions are created ahead.
func (p *Partitions) Validate() error {
	var errs Errors
	if p.Ahead < 1 || p.Ahead > 60 {
		errs.add("PARTITIONS_AHEAD", "%d is outside 1..60", p.Ahead)
	}
	return errs.err()
}

// Validate checks serve's maintenance schedule.
func (m *Maintenance) Validate() error {
	var errs Errors
	if m.Interval < time.Minute || m.Interval > 24*time.Hour {
		errs.add("PARTITION_MAINTENANCE_INTERVAL", "%s is outside [1m, 24h]", m.Interval)
	}
	return errors.Join(m.Partitions.Validate(), errs.err())
}

// LogValue lists the dedup store's settings.
func (d Dedup) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Duration("retention", d.Retention),
		slog.Bool("allow_short_retention", d.AllowShortRetention),
		slog.Duration("max_future_skew", d.MaxFutureSkew),
	)
}

// Log formats.
const (
	LogJSON = "json"
	LogText = "text"
)

// Validate checks the log format; the env library has checked the level.
func (l *Log) Validate() error {
	var errs Errors
	if l.Format != LogJSON && l.Format != LogText {
		errs.add("LOG_FORMAT", "%q is not json or text", l.Format)
	}
	return errs.err()
}

// normalize derives MAX_IN_FLIGHT's default from the provider's
// concurrency: every provider slot busy and as many messages taken behind
// them, so that the claim and settle writers find many events waiting,
// which is what makes a transaction carry many events.
func (s *Serve) normalize() {
	if s.Consumer.MaxInFlight == 0 {
		s.Consumer.MaxInFlight = 2 * s.Payment.MaxConcurrency
	}
}

// Validate checks every setting of serve.
func (s *Serve) Validate() error {
	var errs Errors
	if _, _, err := net.SplitHostPort(s.HTTPAddr); err != nil {
		errs.add("HTTP_ADDR", "%q is not [host]:port", s.HTTPAddr)
	}
	if s.PprofAddr != "" {
		if _, _, err := net.SplitHostPort(s.PprofAddr); err != nil {
			errs.add("DEBUG_PPROF_ADDR", "%q is not [host]:port", s.PprofAddr)
		} else if sameListener(s.PprofAddr, s.HTTPAddr) {
			errs.add("DEBUG_PPROF_ADDR", "%q is HTTP_ADDR's listener; profiles are served on a port of their own", s.PprofAddr)
		}
	}
	if _, _, err := net.SplitHostPort(s.Webhooks.Addr); err == nil && sameListener(s.Webhooks.Addr, s.HTTPAddr) {
		errs.add("WEBHOOK_ADDR", "%q is HTTP_ADDR's listener; the provider-facing listener is apart from the internal one", s.Webhooks.Addr)
	}
	switch {
	case s.Payment.Provider == ProviderStripe && len(s.Webhooks.Secrets) == 0:
		errs.add("PAYMENT_WEBHOOK_SECRET", "is required with PAYMENT_PROVIDER=%s (the webhook endpoint's signing secret, whsec_...)", s.Payment.Provider)
	case s.Payment.Provider == ProviderAdyen && len(s.Webhooks.Secrets) == 0:
		errs.add("PAYMENT_WEBHOOK_SECRET", "is required with PAYMENT_PROVIDER=%s (the webhook endpoint's HMAC key, in hex)", s.Payment.Provider)
	case s.Payment.Provider == ProviderAdyen:
		for i, secret := range s.Webhooks.Secrets {
			// Never the key itself in the message: it is a secret.
			if b, err := hex.DecodeString(strings.TrimSpace(secret)); err != nil || len(b) == 0 {
				errs.add("PAYMENT_WEBHOOK_SECRET", "key %d of %d is not hex (Adyen's HMAC keys are shown in hex in its Customer Area)", i+1, len(s.Webhooks.Secrets))
			}
		}
	}
	return errors.Join(s.Kafka.Validate(), s.Database.Validate(), s.Payment.Validate(), s.Webhooks.Validate(), s.Fleet.Validate(), s.Consumer.Validate(),
		s.Dedup.Validate(), s.Outbox.Validate(), s.Maintenance.Validate(), s.Log.Validate(), errs.err())
}

// sameListener reports whether two [host]:port addresses would listen on
// the same port: the same port on the same host, or on every host (an
// empty host). Port 0 picks a free port, so it never clashes.
func sameListener(a, b string) bool {
	ha, pa, errA := net.SplitHostPort(a)
	hb, pb, errB := net.SplitHostPort(b)
	if errA != nil || errB != nil || pa != pb || pa == "0" {
		return false
	}
	return ha == hb || ha == "" || hb == ""
}

// LogValue lists the settings with secrets masked.
func (s Serve) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Any("kafka", s.Kafka),
		slog.Any("database", s.Database),
		slog.Any("payment", s.Payment),
		slog.Any("webhooks", s.Webhooks),
		slog.Float64("payment_account_max_rps", s.Fleet.AccountMaxRPS),
		slog.Any("consumer", s.Consumer),
		slog.String("http_addr", s.HTTPAddr),
		slog.String("debug_pprof_addr", s.PprofAddr),
		slog.Any("dedup", s.Dedup),
		slog.Duration("outbox_retention", s.Outbox.Retention),
		slog.Int("partitions_ahead", s.Maintenance.Ahead),
		slog.Duration("partition_maintenance_interval", s.Maintenance.Interval),
		slog.String("log_level", s.Log.Level.String()),
		slog.String("log_format", s.Log.Format),
	)
}

// Validate checks every setting of migrate.
func (m *Migrate) Validate() error {
	return errors.Join(m.Database.Validate(), m.Log.Validate())
}

// Validate checks pause's and resume's settings.
func (c *Charging) Validate() error {
	return errors.Join(c.Database.Validate(), c.Log.Validate())
}

// Validate checks the import's settings: a provider that charges saved
// payment methods.
func (p *PaymentMethods) Validate() error {
	errs := checkProvider(p.Provider)
	if len(errs) == 0 && p.Provider == ProviderContract {
		errs.add("PAYMENT_PROVIDER", "is contract, which charges by customer id and keeps no payment methods; set the provider whose methods these are (stripe, adyen)")
	}
	return errors.Join(p.Database.Validate(), errs.err(), p.Log.Validate())
}

// normalize fills in the provider's window and PAYMENT_RECOVER_AFTER's
// default, as serve's.
func (r *Resolve) normalize() {
	r.IdempotencyWindow = providerWindow(r.Provider, r.IdempotencyWindow)
	if r.RecoverAfter == 0 {
		r.RecoverAfter = max(time.Minute, 2*r.Timeout)
	}
}

// Validate checks resolve's settings by serve's rules.
func (r *Resolve) Validate() error {
	errs := append(checkProvider(r.Provider), checkSending(r.Timeout, r.IdempotencyWindow, r.RecoverAfter)...)
	return errors.Join(r.Database.Validate(), errs.err(), r.Log.Validate())
}

// Validate checks every setting of maintain.
func (m *Maintain) Validate() error {
	return errors.Join(m.Database.Validate(), m.Dedup.Validate(), m.Partitions.Validate(), m.Outbox.Validate(), m.Payment.Validate(), m.Log.Validate())
}

func mask(secret string) string {
	if secret == "" {
		return ""
	}
	return "xxxxx"
}
