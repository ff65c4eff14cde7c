// Package config reads billing's settings from the environment, once, at
// start. A missing or bad value stops the process with an error that names
// the variable; secrets are masked whenever a configuration is logged.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/caarlos0/env/v11"
	"github.com/lib/pq"

	"example.com/billing/internal/postgres"
)

// Kafka holds the broker connection and topic settings.
type Kafka struct {
	Brokers  []string `env:"KAFKA_BROKERS" envDefault:"localhost:9092" envSeparator:"," notEmpty:"true"`
	Topic    string   `env:"KAFKA_TOPIC" envDefault:"orders.confirmed" notEmpty:"true"`
	GroupID  string   `env:"KAFKA_GROUP_ID" envDefault:"billing-order-confirmed" notEmpty:"true"`
	DLQTopic string   `env:"KAFKA_DLQ_TOPIC" envDefault:"orders.confirmed.dlq" notEmpty:"true"`
	// OutcomeTopic receives the payment outcome events (the outbox relay).
	OutcomeTopic string `env:"KAFKA_OUTCOME_TOPIC" envDefault:"payments.settled" notEmpty:"true"`
	ClientID     string `env:"KAFKA_CLIENT_ID" envDefault:"billing" notEmpty:"true"`
	InstanceID   string `env:"KAFKA_INSTANCE_ID"` // static group membership, e.g. the pod name
	Version      string `env:"KAFKA_VERSION" envDefault:"3.6.0"`

	TLSEnabled  bool   `env:"KAFKA_TLS_ENABLED" envDefault:"false"`
	TLSCAFile   string `env:"KAFKA_TLS_CA_FILE"`
	TLSCertFile string `env:"KAFKA_TLS_CERT_FILE"`
	TLSKeyFile  string `env:"KAFKA_TLS_KEY_FILE"`

	SASLMechanism string `env:"KAFKA_SASL_MECHANISM"`
	SASLUsername  string `env:"KAFKA_SASL_USERNAME"`
	SASLPassword  string `env:"KAFKA_SASL_PASSWORD"`
}

// Database holds the PostgreSQL settings.
type Database struct {
	URL string `env:"DATABASE_URL,required" notEmpty:"true"`
	// MaxConns bounds the pool. No transaction spans a provider call, so
	// this bounds the short claim and settle transactions in flight, not
	// the charges.
	MaxConns int `env:"DATABASE_MAX_CONNS" envDefault:"16"`
}

// Payment holds the payment provider settings.
type Payment struct {
	BaseURL string        `env:"PAYMENT_BASE_URL,required" notEmpty:"true"`
	APIKey  string        `env:"PAYMENT_API_KEY"`
	Timeout time.Duration `env:"PAYMENT_TIMEOUT" envDefault:"10s"`
	// MaxConcurrency bounds the provider requests in flight, whole process.
	// Sized for a provider answering in 500 ms: 1,024 in flight carry about
	// 2,000 charges a second.
	MaxConcurrency int `env:"PAYMENT_MAX_CONCURRENCY" envDefault:"1024"`
	// MaxRPS bounds the provider requests per second, whole process (a
	// token bucket); 0 is unlimited. Set it to what the provider allows
	// (Stripe's live mode: 100 by default).
	MaxRPS float64 `env:"PAYMENT_MAX_RPS" envDefault:"0"`
	// IdempotencyWindow is how long the provider keeps an idempotency key.
	// A charge attempt older than that is never retried blindly: asking
	// again could charge twice. It is reported for a human.
	IdempotencyWindow time.Duration `env:"PAYMENT_IDEMPOTENCY_WINDOW" envDefault:"24h"`
	// RecoverAfter is how long a charge attempt may stay pending with
	// nobody working on it (a crash between claim and settle) before
	// maintenance completes it. 0 means the longer of 1m and twice
	// PAYMENT_TIMEOUT: a request still in flight is not asked again.
	RecoverAfter time.Duration `env:"PAYMENT_RECOVER_AFTER" envDefault:"0"`
}

// Consumer tunes the consumer's concurrency.
type Consumer struct {
	// MaxInFlight bounds the messages taken off partitions and not yet
	// finished, per instance. 0 means 2 × PAYMENT_MAX_CONCURRENCY.
	MaxInFlight int `env:"MAX_IN_FLIGHT" envDefault:"0"`
	// Lanes is the number of key-ordered lanes per partition: messages with
	// different keys run concurrently, messages with one key in order. A
	// lane waits for the provider with its batch, so lanes × batch per
	// partition is what one partition can have in flight.
	Lanes int `env:"CONSUMER_LANES" envDefault:"16"`
	// BatchMax is the most events of one lane settled in one transaction.
	BatchMax int `env:"CONSUMER_BATCH_MAX" envDefault:"16"`
	// DrainTimeout bounds how long in-flight work may run after a partition
	// is revoked or SIGTERM arrives; what is unfinished then is abandoned
	// (rolled back, not marked) and redelivered to the next owner.
	DrainTimeout time.Duration `env:"DRAIN_TIMEOUT" envDefault:"10s"`
	// CommitEveryMessage commits offsets synchronously after every finished
	// message instead of once a second: the seed design's behaviour, kept
	// for the benchmark baseline.
	CommitEveryMessage bool `env:"KAFKA_COMMIT_EVERY_MESSAGE" envDefault:"false"`
}

// Serve is the configuration of `billing serve`.
type Serve struct {
	Kafka    Kafka
	Database Database
	Payment  Payment
	Consumer Consumer

	Dedup Dedup

	HTTPAddr string     `env:"HTTP_ADDR" envDefault:":8080"`
	LogLevel slog.Level `env:"LOG_LEVEL" envDefault:"info"`
}

// Dedup holds the settings of the processed_event store's retention.
type Dedup struct {
	// Retention is how long processed_event remembers an event. 720h is
	// advised for topics that are replayed from a DLQ.
	Retention time.Duration `env:"DEDUP_RETENTION" envDefault:"168h"`
	// AllowShortRetention starts serve even when Retention is shorter than
	// what the broker can still redeliver.
	AllowShortRetention bool `env:"DEDUP_ALLOW_SHORT_RETENTION" envDefault:"false"`
	// PartitionsAhead is how many days of partitions exist ahead of today.
	PartitionsAhead int `env:"DEDUP_PARTITIONS_AHEAD" envDefault:"3"`
	// MaintenanceInterval is how often serve creates and drops partitions.
	MaintenanceInterval time.Duration `env:"DEDUP_MAINTENANCE_INTERVAL" envDefault:"1h"`
	// MaxFutureSkew bounds how far ahead of this clock an event id's time
	// may be; beyond it the event is dead-lettered.
	MaxFutureSkew time.Duration `env:"DEDUP_MAX_FUTURE_SKEW" envDefault:"1h"`
	// OutboxRetention is how long published payment outcome events stay in
	// the outbox table (for an operator's look), by whole days; the
	// maintenance that keeps processed_event drops them.
	OutboxRetention time.Duration `env:"OUTBOX_RETENTION" envDefault:"72h"`
}

// Validate checks the retention settings.
func (d *Dedup) Validate() error {
	if d.Retention < 24*time.Hour {
		return bad("DEDUP_RETENTION", "%s is shorter than 24h (partitions are daily)", d.Retention)
	}
	if d.PartitionsAhead < 1 || d.PartitionsAhead > 60 {
		return bad("DEDUP_PARTITIONS_AHEAD", "%d is outside 1..60", d.PartitionsAhead)
	}
	if d.MaintenanceInterval < time.Minute || d.MaintenanceInterval > 24*time.Hour {
		return bad("DEDUP_MAINTENANCE_INTERVAL", "%s is outside [1m, 24h]", d.MaintenanceInterval)
	}
	if d.MaxFutureSkew < time.Second || d.MaxFutureSkew > 24*time.Hour {
		return bad("DEDUP_MAX_FUTURE_SKEW", "%s is outside [1s, 24h]", d.MaxFutureSkew)
	}
	if d.OutboxRetention < 24*time.Hour {
		return bad("OUTBOX_RETENTION", "%s is shorter than 24h (partitions are daily)", d.OutboxRetention)
	}
	return nil
}

// LogValue shows durations as text.
func (d Dedup) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("retention", d.Retention.String()),
		slog.Bool("allow_short_retention", d.AllowShortRetention),
		slog.Int("partitions_ahead", d.PartitionsAhead),
		slog.String("maintenance_interval", d.MaintenanceInterval.String()),
		slog.String("max_future_skew", d.MaxFutureSkew.String()),
		slog.String("outbox_retention", d.OutboxRetention.String()),
	)
}

// Maintain is the configuration of `billing maintain`.
type Maintain struct {
	Database Database
	Dedup    Dedup
	// Payment is optional: with PAYMENT_BASE_URL set, maintain also
	// completes the charge attempts left pending; without it, it only
	// reports them.
	Payment MaintainPayment
}

// MaintainPayment is Payment without a required PAYMENT_BASE_URL.
type MaintainPayment struct {
	BaseURL           string        `env:"PAYMENT_BASE_URL"`
	APIKey            string        `env:"PAYMENT_API_KEY"`
	Timeout           time.Duration `env:"PAYMENT_TIMEOUT" envDefault:"10s"`
	MaxConcurrency    int           `env:"PAYMENT_MAX_CONCURRENCY" envDefault:"1024"`
	MaxRPS            float64       `env:"PAYMENT_MAX_RPS" envDefault:"0"`
	IdempotencyWindow time.Duration `env:"PAYMENT_IDEMPOTENCY_WINDOW" envDefault:"24h"`
	RecoverAfter      time.Duration `env:"PAYMENT_RECOVER_AFTER" envDefault:"0"`
}

// Payment returns the settings as serve's, for the payment client.
func (m MaintainPayment) Payment() Payment {
	return Payment(m)
}

// Validate checks every setting of maintain.
func (m *Maintain) Validate() error {
	if err := m.Database.Validate(); err != nil {
		return err
	}
	if err := m.Dedup.Validate(); err != nil {
		return err
	}
	p := m.Payment.Payment()
	if p.BaseURL != "" {
		if err := p.validateURL(); err != nil {
			return err
		}
	}
	if err := p.validateLimits(); err != nil {
		return err
	}
	m.Payment.RecoverAfter = p.RecoverAfter
	return nil
}

// Validator is a configuration that can check its own values.
type Validator interface {
	Validate() error
}

// Load fills cfg from environ (variable name → value) and validates it.
func Load(environ map[string]string, cfg Validator) error {
	if err := emptyButSet(environ, cfg); err != nil {
		return err
	}
	if err := env.ParseWithOptions(cfg, env.Options{Environment: environ}); err != nil {
		return nameVariables(err, cfg)
	}
	return cfg.Validate()
}

// Environ returns the process environment as a map, for Load.
func Environ() map[string]string {
	m := make(map[string]string)
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// VarError is a bad configuration value; it names the variable.
type VarError struct {
	Var string
	Err error
}

func (e *VarError) Error() string { return "config: " + e.Var + ": " + e.Err.Error() }
func (e *VarError) Unwrap() error { return e.Err }

func bad(name, format string, args ...any) error {
	return &VarError{Var: name, Err: fmt.Errorf(format, args...)}
}

// emptyButSet rejects a variable marked notEmpty that is set to "". The env
// library would quietly use the default, but an operator who wrote
// KAFKA_BROKERS= made a mistake worth stopping for.
func emptyButSet(environ map[string]string, cfg any) error {
	var err error
	walkFields(reflect.TypeOf(cfg), func(f reflect.StructField, name string) {
		if v, ok := environ[name]; ok && strings.TrimSpace(v) == "" && f.Tag.Get("notEmpty") == "true" && err == nil {
			err = bad(name, "is set but empty")
		}
	})
	return err
}

// nameVariables rewrites the env library's errors, which name Go fields, so
// that they name the environment variable the operator must fix.
func nameVariables(err error, cfg any) error {
	byField := map[string]string{}
	walkFields(reflect.TypeOf(cfg), func(f reflect.StructField, name string) { byField[f.Name] = name })
	var agg env.AggregateError
	if !errors.As(err, &agg) || len(agg.Errors) == 0 {
		return fmt.Errorf("config: %w", err)
	}
	first := agg.Errors[0]
	var pe env.ParseError
	if errors.As(first, &pe) {
		return &VarError{Var: byField[pe.Name], Err: pe.Err}
	}
	var ns env.VarIsNotSetError
	if errors.As(first, &ns) {
		return bad(ns.Key, "is required")
	}
	return fmt.Errorf("config: %w", first)
}

func walkFields(t reflect.Type, fn func(f reflect.StructField, name string)) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Type.Kind() == reflect.Struct && f.Tag.Get("env") == "" && f.Type != reflect.TypeOf(time.Time{}) {
			walkFields(f.Type, fn)
			continue
		}
		if name, _, _ := strings.Cut(f.Tag.Get("env"), ","); name != "" {
			fn(f, name)
		}
	}
}

var topicName = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

// Validate checks the Kafka settings.
func (k *Kafka) Validate() error {
	for i, b := range k.Brokers {
		// "kafka-0:9092, kafka-1:9092" is a natural way to write the list,
		// and sarama dials each address as given: " kafka-1" never resolves.
		b = strings.TrimSpace(b)
		k.Brokers[i] = b
		host, port, err := net.SplitHostPort(b)
		if err != nil || host == "" {
			return bad("KAFKA_BROKERS", "%q is not host:port", b)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return bad("KAFKA_BROKERS", "%q has no valid port", b)
		}
	}
	if !topicName.MatchString(k.Topic) {
		return bad("KAFKA_TOPIC", "%q is not a valid topic name", k.Topic)
	}
	if !topicName.MatchString(k.DLQTopic) {
		return bad("KAFKA_DLQ_TOPIC", "%q is not a valid topic name", k.DLQTopic)
	}
	if k.DLQTopic == k.Topic {
		return bad("KAFKA_DLQ_TOPIC", "must differ from KAFKA_TOPIC")
	}
	if !topicName.MatchString(k.OutcomeTopic) {
		return bad("KAFKA_OUTCOME_TOPIC", "%q is not a valid topic name", k.OutcomeTopic)
	}
	if k.OutcomeTopic == k.Topic || k.OutcomeTopic == k.DLQTopic {
		return bad("KAFKA_OUTCOME_TOPIC", "must differ from KAFKA_TOPIC and KAFKA_DLQ_TOPIC")
	}
	if strings.TrimSpace(k.GroupID) == "" {
		return bad("KAFKA_GROUP_ID", "must not be empty")
	}
	if strings.TrimSpace(k.ClientID) == "" {
		return bad("KAFKA_CLIENT_ID", "must not be empty")
	}
	if _, err := sarama.ParseKafkaVersion(k.Version); err != nil {
		return bad("KAFKA_VERSION", "%q is not a Kafka version", k.Version)
	}
	if !k.TLSEnabled {
		for name, v := range map[string]string{"KAFKA_TLS_CA_FILE": k.TLSCAFile, "KAFKA_TLS_CERT_FILE": k.TLSCertFile, "KAFKA_TLS_KEY_FILE": k.TLSKeyFile} {
			if v != "" {
				return bad(name, "is set but KAFKA_TLS_ENABLED is false")
			}
		}
	}
	if (k.TLSCertFile == "") != (k.TLSKeyFile == "") {
		return bad("KAFKA_TLS_CERT_FILE", "KAFKA_TLS_CERT_FILE and KAFKA_TLS_KEY_FILE go together")
	}
	for name, path := range map[string]string{"KAFKA_TLS_CA_FILE": k.TLSCAFile, "KAFKA_TLS_CERT_FILE": k.TLSCertFile, "KAFKA_TLS_KEY_FILE": k.TLSKeyFile} {
		if path == "" {
			continue
		}
		if _, err := os.Stat(path); err != nil {
			return bad(name, "%w", err)
		}
	}
	switch k.SASLMechanism {
	case "":
		if k.SASLUsername != "" || k.SASLPassword != "" {
			return bad("KAFKA_SASL_MECHANISM", "is required when KAFKA_SASL_USERNAME or KAFKA_SASL_PASSWORD is set")
		}
	case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
		if k.SASLUsername == "" {
			return bad("KAFKA_SASL_USERNAME", "is required with KAFKA_SASL_MECHANISM=%s", k.SASLMechanism)
		}
		if k.SASLPassword == "" {
			return bad("KAFKA_SASL_PASSWORD", "is required with KAFKA_SASL_MECHANISM=%s", k.SASLMechanism)
		}
	default:
		return bad("KAFKA_SASL_MECHANISM", "%q is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512", k.SASLMechanism)
	}
	return nil
}

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

// Validate checks the database settings.
func (d *Database) Validate() error {
	if _, err := pq.NewConfig(d.URL); err != nil {
		// The parser's message can quote the URL; keep the password out.
		return bad("DATABASE_URL", "cannot be parsed: %s", postgres.Redact(err.Error()))
	}
	if d.MaxConns < 1 || d.MaxConns > 1000 {
		return bad("DATABASE_MAX_CONNS", "%d is outside 1..1000", d.MaxConns)
	}
	return nil
}

// LogValue masks the password in the URL.
func (d Database) LogValue() slog.Value {
	return slog.GroupValue(slog.String("url", postgres.Redact(d.URL)), slog.Int("max_conns", d.MaxConns))
}

// Validate checks the payment provider settings.
func (p *Payment) Validate() error {
	if err := p.validateURL(); err != nil {
		return err
	}
	return p.validateLimits()
}

func (p *Payment) validateURL() error {
	u, err := url.Parse(p.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		// An operator who put credentials in the URL must not find them
		// in the log.
		return bad("PAYMENT_BASE_URL", "%q is not an http(s) URL", postgres.Redact(p.BaseURL))
	}
	if u.User != nil {
		return bad("PAYMENT_BASE_URL", "must not carry credentials; use PAYMENT_API_KEY")
	}
	return nil
}

func (p *Payment) validateLimits() error {
	if p.Timeout <= 0 || p.Timeout > 5*time.Minute {
		return bad("PAYMENT_TIMEOUT", "%s is outside (0, 5m]", p.Timeout)
	}
	if p.MaxConcurrency < 1 || p.MaxConcurrency > 100000 {
		return bad("PAYMENT_MAX_CONCURRENCY", "%d is outside 1..100000", p.MaxConcurrency)
	}
	if p.MaxRPS < 0 || p.MaxRPS > 1e6 {
		return bad("PAYMENT_MAX_RPS", "%v is outside 0..1000000 (0 is unlimited)", p.MaxRPS)
	}
	if p.IdempotencyWindow < time.Hour {
		return bad("PAYMENT_IDEMPOTENCY_WINDOW", "%s is shorter than 1h; set it to how long the provider keeps an idempotency key (Stripe: 24h)", p.IdempotencyWindow)
	}
	if p.RecoverAfter == 0 {
		p.RecoverAfter = max(time.Minute, 2*p.Timeout)
	}
	if p.RecoverAfter <= p.Timeout || p.RecoverAfter >= p.IdempotencyWindow {
		return bad("PAYMENT_RECOVER_AFTER", "%s must be longer than PAYMENT_TIMEOUT (%s) and shorter than PAYMENT_IDEMPOTENCY_WINDOW (%s)", p.RecoverAfter, p.Timeout, p.IdempotencyWindow)
	}
	return nil
}

// LogValue masks the API key.
func (p Payment) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("base_url", p.BaseURL),
		slog.String("api_key", mask(p.APIKey)),
		slog.String("timeout", p.Timeout.String()),
		slog.Int("max_concurrency", p.MaxConcurrency),
		slog.Float64("max_rps", p.MaxRPS),
		slog.String("idempotency_window", p.IdempotencyWindow.String()),
		slog.String("recover_after", p.RecoverAfter.String()),
	)
}

// LogValue shows durations as text.
func (c Consumer) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Int("max_in_flight", c.MaxInFlight),
		slog.Int("lanes", c.Lanes),
		slog.Int("batch_max", c.BatchMax),
		slog.String("drain_timeout", c.DrainTimeout.String()),
		slog.Bool("commit_every_message", c.CommitEveryMessage),
	)
}

// Validate checks the consumer settings.
func (c *Consumer) Validate() error {
	if c.MaxInFlight < 0 || c.MaxInFlight > 100000 {
		return bad("MAX_IN_FLIGHT", "%d is outside 0..100000", c.MaxInFlight)
	}
	if c.Lanes < 1 || c.Lanes > 1024 {
		return bad("CONSUMER_LANES", "%d is outside 1..1024", c.Lanes)
	}
	if c.BatchMax < 1 || c.BatchMax > 1000 {
		return bad("CONSUMER_BATCH_MAX", "%d is outside 1..1000", c.BatchMax)
	}
	if c.DrainTimeout <= 0 {
		return bad("DRAIN_TIMEOUT", "must be positive")
	}
	return nil
}

// Validate checks every setting of serve.
func (s *Serve) Validate() error {
	for _, v := range []Validator{&s.Kafka, &s.Database, &s.Payment, &s.Consumer, &s.Dedup} {
		if err := v.Validate(); err != nil {
			return err
		}
	}
	if _, _, err := net.SplitHostPort(s.HTTPAddr); err != nil {
		return bad("HTTP_ADDR", "%q is not [host]:port", s.HTTPAddr)
	}
	if s.Consumer.MaxInFlight == 0 {
		// Every provider slot busy and as many messages queued behind them:
		// lanes then find full batches waiting, which is what makes a
		// transaction carry many events.
		s.Consumer.MaxInFlight = 2 * s.Payment.MaxConcurrency
	}
	return nil
}

// LogValue lists the settings with secrets masked.
func (s Serve) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Any("kafka", s.Kafka),
		slog.Any("database", s.Database),
		slog.Any("payment", s.Payment),
		slog.Any("consumer", s.Consumer),
		slog.String("http_addr", s.HTTPAddr),
		slog.Any("dedup", s.Dedup),
		slog.String("log_level", s.LogLevel.String()),
	)
}

func mask(secret string) string {
	if secret == "" {
		return ""
	}
	return "xxxxx"
}
