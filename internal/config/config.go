// Package config reads billing's settings from the environment, once, at
// start.
//
// Each setting is a struct field whose tags say everything about it: its
// variable (env), default (envDefault) and meaning (help). `billing <command>
// -h` and docs/configuration.md are generated from these tags, so that they
// cannot drift from what the commands read. Load reports every missing or
// bad variable at once, each by name, without the secrets; secrets are masked
// whenever a configuration is logged.
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
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/caarlos0/env/v11"
	"github.com/lib/pq"

	"example.com/billing/internal/redact"
)

// Kafka holds the broker connection and topic settings.
type Kafka struct {
	Brokers  []string `env:"KAFKA_BROKERS" envDefault:"localhost:9092" envSeparator:"," notEmpty:"true" help:"comma-separated host:port of the brokers to start from; set but empty is an error"`
	Topic    string   `env:"KAFKA_TOPIC" envDefault:"orders.confirmed" notEmpty:"true" help:"topic of the order.confirmed.v1 events"`
	GroupID  string   `env:"KAFKA_GROUP_ID" envDefault:"billing-order-confirmed" notEmpty:"true" help:"consumer group, also the dedup namespace; a new group starts from the oldest offset of the topic"`
	DLQTopic string   `env:"KAFKA_DLQ_TOPIC" envDefault:"orders.confirmed.dlq" notEmpty:"true" help:"dead-letter topic: where messages that can never be processed are parked"`
	// OutcomeTopic receives the payment outcome events (the outbox relay).
	OutcomeTopic string `env:"KAFKA_OUTCOME_TOPIC" envDefault:"payments.settled" notEmpty:"true" help:"topic of the payment outcome events (payment.succeeded.v1, payment.declined.v1, payment.failed.v1)"`
	ClientID     string `env:"KAFKA_CLIENT_ID" envDefault:"billing" notEmpty:"true" help:"client id the brokers see"`
	InstanceID   string `env:"KAFKA_INSTANCE_ID" help:"static group membership, e.g. the pod name: a restart within the session timeout keeps the partitions"`
	Version      string `env:"KAFKA_VERSION" envDefault:"3.6.0" help:"protocol version of the brokers"`

	TLSEnabled  bool   `env:"KAFKA_TLS_ENABLED" envDefault:"false" help:"TLS to the brokers"`
	TLSCAFile   string `env:"KAFKA_TLS_CA_FILE" help:"CA bundle (PEM) of the brokers' certificates; default: the system's"`
	TLSCertFile string `env:"KAFKA_TLS_CERT_FILE" help:"client certificate (PEM) for mutual TLS, with KAFKA_TLS_KEY_FILE"`
	TLSKeyFile  string `env:"KAFKA_TLS_KEY_FILE" help:"client key (PEM) for mutual TLS, with KAFKA_TLS_CERT_FILE"`

	SASLMechanism string `env:"KAFKA_SASL_MECHANISM" help:"PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; empty: no SASL"`
	SASLUsername  string `env:"KAFKA_SASL_USERNAME" help:"SASL user"`
	SASLPassword  string `env:"KAFKA_SASL_PASSWORD" help:"SASL password; never logged"`
}

// Topics are the order topic, its dead-letter topic and the outcome topic,
// the ones `billing devkafka` creates: Kafka's variables of the same names,
// with the same defaults.
type Topics struct {
	Topic        string `env:"KAFKA_TOPIC" envDefault:"orders.confirmed" notEmpty:"true" help:"topic of the order.confirmed.v1 events"`
	DLQTopic     string `env:"KAFKA_DLQ_TOPIC" envDefault:"orders.confirmed.dlq" notEmpty:"true" help:"dead-letter topic: where messages that can never be processed are parked"`
	OutcomeTopic string `env:"KAFKA_OUTCOME_TOPIC" envDefault:"payments.settled" notEmpty:"true" help:"topic of the payment outcome events (payment.succeeded.v1, payment.declined.v1, payment.failed.v1)"`
}

// Database is the PostgreSQL database a command works on.
type Database struct {
	URL string `env:"DATABASE_URL,required" notEmpty:"true" help:"postgres://user:password@host:5432/db?sslmode=verify-full (or key=value form); lib/pq's PG* variables fill in what it leaves out"`
}

// Pool is serve's database: the URL and the size of its connection pool.
type Pool struct {
	Database
	// MaxConns bounds the pool. No transaction spans a provider call, so
	// this bounds the short claim and settle transactions in flight, not
	// the charges.
	MaxConns int `env:"DATABASE_MAX_CONNS" envDefault:"16" help:"connection pool size; bounds the short claim and settle transactions (no transaction waits for the provider)"`
}

// Payment holds the payment provider settings.
type Payment struct {
	BaseURL string `env:"PAYMENT_BASE_URL,required" notEmpty:"true" help:"the provider's base URL; billing calls POST {base}/v1/charges"`
	PaymentLimits
}

// PaymentLimits are the provider settings besides its address, which
// maintain shares with serve.
type PaymentLimits struct {
	APIKey  string        `env:"PAYMENT_API_KEY" help:"sent as Authorization: Bearer <key>; never logged"`
	Timeout time.Duration `env:"PAYMENT_TIMEOUT" envDefault:"10s" help:"timeout of one provider request"`
	// MaxConcurrency bounds the provider requests in flight, whole process.
	// Sized for a provider answering in 500 ms: 1,024 in flight carry about
	// 2,000 charges a second.
	MaxConcurrency int `env:"PAYMENT_MAX_CONCURRENCY" envDefault:"1024" help:"provider requests in flight, whole process (sized for a provider at 500 ms: ~2,000 charges/s)"`
	// MaxRPS bounds the provider requests per second, whole process (a
	// token bucket); 0 is unlimited.
	MaxRPS float64 `env:"PAYMENT_MAX_RPS" envDefault:"0" help:"provider requests per second, whole process (token bucket); 0 is unlimited; set it to the provider's limit (Stripe: 100)"`
	// IdempotencyWindow is how long the provider keeps an idempotency key.
	// A charge attempt older than that is never retried blindly: asking
	// again could charge twice. It is reported for a human.
	IdempotencyWindow time.Duration `env:"PAYMENT_IDEMPOTENCY_WINDOW" envDefault:"24h" help:"how long the provider keeps an idempotency key; a pending charge attempt older than that is reported, never retried blindly"`
	// RecoverAfter is how long a charge attempt may stay pending with
	// nobody working on it (a crash between claim and settle) before
	// maintenance completes it. 0 means the longer of 1m and twice
	// PAYMENT_TIMEOUT (Load fills it in): a request still in flight is not
	// asked again.
	RecoverAfter time.Duration `env:"PAYMENT_RECOVER_AFTER" envDefault:"0" help:"how long a charge attempt may stay pending with nobody working on it before maintenance completes it; 0: the longer of 1m and 2 × PAYMENT_TIMEOUT"`
}

// OptionalPayment is maintain's provider: with PAYMENT_BASE_URL set it
// completes the charge attempts left pending, without it only reports them.
type OptionalPayment struct {
	BaseURL string `env:"PAYMENT_BASE_URL" help:"the provider's base URL; when set, maintain completes the charge attempts left pending, else it only reports them"`
	PaymentLimits
}

// Consumer tunes the consumer's concurrency.
type Consumer struct {
	// MaxInFlight bounds the messages taken off partitions and not yet
	// finished, per instance. 0 means 2 × PAYMENT_MAX_CONCURRENCY (Load
	// fills it in).
	MaxInFlight int `env:"MAX_IN_FLIGHT" envDefault:"0" help:"messages taken off partitions and not yet finished, per instance; 0: 2 × PAYMENT_MAX_CONCURRENCY"`
	// Lanes is the number of key-ordered lanes per partition: messages with
	// different keys run concurrently, messages with one key in order. A
	// lane waits for the provider with its batch, so lanes × batch per
	// partition is what one partition can have in flight.
	Lanes int `env:"CONSUMER_LANES" envDefault:"16" help:"key-ordered lanes per partition: different keys run concurrently, one key in order"`
	// BatchMax is the most events of one lane claimed and settled together.
	BatchMax int `env:"CONSUMER_BATCH_MAX" envDefault:"16" help:"most events of one lane claimed and settled together"`
	// DrainTimeout bounds how long in-flight work may run after a partition
	// is revoked or SIGTERM arrives; what is unfinished then is abandoned
	// (rolled back, not marked) and redelivered to the next owner.
	DrainTimeout time.Duration `env:"DRAIN_TIMEOUT" envDefault:"10s" help:"how long in-flight work may finish after a revocation or SIGTERM; serve exits within DRAIN_TIMEOUT + 5s"`
	// CommitEveryMessage commits offsets synchronously after every finished
	// message instead of once a second: the seed design's behaviour, kept
	// for the benchmark baseline.
	CommitEveryMessage bool `env:"KAFKA_COMMIT_EVERY_MESSAGE" envDefault:"false" help:"commit offsets synchronously after each message (the seed's behaviour; for benchmarks)"`
}

// DedupPartitions are the settings of processed_event's daily partitions
// that both serve and maintain keep: how long an event is remembered and
// how many days are created ahead.
type DedupPartitions struct {
	// Retention is how long processed_event remembers an event. 720h is
	// advised for topics that are replayed from a DLQ.
	Retention time.Duration `env:"DEDUP_RETENTION" envDefault:"168h" help:"how long processed_event remembers an event (720h for topics replayed from a DLQ); at least 24h"`
	// PartitionsAhead is how many days of partitions exist ahead of today.
	PartitionsAhead int `env:"DEDUP_PARTITIONS_AHEAD" envDefault:"3" help:"days of processed_event partitions created ahead of today"`
}

// Dedup holds the settings of the processed_event store.
type Dedup struct {
	DedupPartitions
	// AllowShortRetention starts serve even when Retention is shorter than
	// what the broker can still redeliver.
	AllowShortRetention bool `env:"DEDUP_ALLOW_SHORT_RETENTION" envDefault:"false" help:"start even when DEDUP_RETENTION is shorter than the topic's retention"`
	// MaintenanceInterval is how often serve creates and drops partitions.
	MaintenanceInterval time.Duration `env:"DEDUP_MAINTENANCE_INTERVAL" envDefault:"1h" help:"how often serve creates and drops processed_event partitions"`
	// MaxFutureSkew bounds how far ahead of this clock an event id's time
	// may be; beyond it the event is dead-lettered.
	MaxFutureSkew time.Duration `env:"DEDUP_MAX_FUTURE_SKEW" envDefault:"1h" help:"how far ahead of this clock an eventId's time may be; later events are dead-lettered"`
}

// Outbox is the retention of published payment outcome events, which
// serve's maintenance and maintain keep.
type Outbox struct {
	// Retention is how long published outcomes stay in the outbox table
	// (for an operator's look), by whole days.
	Retention time.Duration `env:"OUTBOX_RETENTION" envDefault:"72h" help:"how long published payment outcome events stay in the outbox table; at least 24h (partitions are daily)"`
}

// Validate checks the outbox's retention.
func (o *Outbox) Validate() error {
	var errs Errors
	if o.Retention < 24*time.Hour {
		errs.add("OUTBOX_RETENTION", "%s is shorter than 24h (partitions are daily)", o.Retention)
	}
	return errs.err()
}

// Log is how a command writes its log lines (to stderr).
type Log struct {
	Level slog.Level `env:"LOG_LEVEL" envDefault:"info" help:"debug, info, warn or error"`
	// Format is json for log pipelines, text for a terminal.
	Format string `env:"LOG_FORMAT" envDefault:"json" help:"json (one object per line, for log pipelines) or text (key=value, for people)"`
}

// Serve is the configuration of `billing serve`.
type Serve struct {
	Kafka    Kafka
	Database Pool
	Payment  Payment
	Consumer Consumer
	Dedup    Dedup
	Outbox   Outbox

	HTTPAddr string `env:"HTTP_ADDR" envDefault:":8080" help:"address of /healthz, /readyz and /metrics"`
	Log      Log
}

// Migrate is the configuration of `billing migrate`.
type Migrate struct {
	Database Database
	Log      Log
}

// Maintain is the configuration of `billing maintain`.
type Maintain struct {
	Database Database
	Dedup    DedupPartitions
	Outbox   Outbox
	Payment  OptionalPayment
	Log      Log
}

// Validator is a configuration that can check its own values. Validate
// reports every problem it finds, each a *VarError (an Errors, or several
// joined with errors.Join), and changes nothing.
type Validator interface {
	Validate() error
}

// normalizer is a configuration that fills in derived defaults and tidies
// what was read; Load calls it on every part of a configuration before
// Validate.
type normalizer interface {
	normalize()
}

// Load fills cfg from environ (variable name → value), fills in the derived
// defaults and validates the result. It reports every missing or bad
// variable at once, as an Errors.
func Load(environ map[string]string, cfg Validator) error {
	errs := emptyButSet(environ, cfg)
	if err := env.ParseWithOptions(cfg, env.Options{Environment: environ}); err != nil {
		errs = append(errs, nameVariables(err, cfg)...)
	}
	normalize(reflect.ValueOf(cfg))
	invalid := cfg.Validate()
	more, ok := flatten(invalid)
	if !ok {
		return fmt.Errorf("config: %w", invalid)
	}
	return append(errs, more...).tidy(cfg)
}

// flatten returns the VarErrors of err's tree (a Validate's answer: an
// Errors, or several joined with errors.Join), in order. ok is false when
// the tree holds an error that names no variable.
func flatten(err error) (errs Errors, ok bool) {
	var ve *VarError
	switch e := err.(type) {
	case nil:
		return nil, true
	case interface{ Unwrap() []error }:
		for _, inner := range e.Unwrap() {
			more, ok := flatten(inner)
			if !ok {
				return nil, false
			}
			errs = append(errs, more...)
		}
		return errs, true
	default:
		if errors.As(err, &ve) {
			return Errors{ve}, true
		}
		return nil, false
	}
}

// normalize calls normalize on v and on every struct within it, innermost
// first, so that a configuration can rely on its parts being normalized.
func normalize(v reflect.Value) {
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return
	}
	for i := range v.NumField() {
		if f := v.Field(i); f.CanSet() && f.Kind() == reflect.Struct {
			normalize(f.Addr())
		}
	}
	if n, ok := v.Addr().Interface().(normalizer); ok {
		n.normalize()
	}
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

// Errors is every bad variable of a configuration, at most one error per
// variable.
type Errors []*VarError

// Error lists the variables one per line, so that an operator fixes them
// all in one go.
func (e Errors) Error() string {
	if len(e) == 1 {
		return e[0].Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "config: %d variables are missing or bad:", len(e))
	for _, v := range e {
		b.WriteString("\n  " + v.Var + ": " + v.Err.Error())
	}
	return b.String()
}

// Unwrap gives errors.As and errors.Is each variable's error.
func (e Errors) Unwrap() []error {
	errs := make([]error, len(e))
	for i, v := range e {
		errs[i] = v
	}
	return errs
}

// Vars returns the names of the variables at fault, in order.
func (e Errors) Vars() []string {
	names := make([]string, len(e))
	for i, v := range e {
		names[i] = v.Var
	}
	return names
}

// tidy keeps the first error of each variable, in the order cfg declares
// them, and returns nil when there is none. A value that could not be read
// leaves its field zero, which Validate would report a second time.
func (e Errors) tidy(cfg any) error {
	if len(e) == 0 {
		return nil
	}
	order := map[string]int{}
	for i, v := range Vars(cfg) {
		order[v.Name] = i
	}
	rank := func(name string) int {
		if i, ok := order[name]; ok {
			return i
		}
		return len(order) // a variable Validate names that cfg does not read
	}
	seen := map[string]bool{}
	var out Errors
	for _, v := range e {
		if !seen[v.Var] {
			seen[v.Var] = true
			out = append(out, v)
		}
	}
	slices.SortStableFunc(out, func(a, b *VarError) int { return rank(a.Var) - rank(b.Var) })
	return out
}

// add records a problem with variable name.
func (e *Errors) add(name, format string, args ...any) {
	*e = append(*e, &VarError{Var: name, Err: fmt.Errorf(format, args...)})
}

// err returns the problems as an error, nil when there are none.
func (e Errors) err() error {
	if len(e) == 0 {
		return nil
	}
	return e
}

// Var is one environment variable of a configuration, as its struct tags
// describe it.
type Var struct {
	Name string
	// Default is the value used when the variable is not set; "" for none.
	Default string
	// Required variables have no default: a command does not start
	// without them.
	Required bool
	// Help is the one-line meaning.
	Help string
}

// Vars lists the variables cfg (a configuration struct or a pointer to one)
// reads, in the order of its fields.
func Vars(cfg any) []Var {
	var vars []Var
	walkFields(reflect.TypeOf(cfg), func(f reflect.StructField, name string) {
		_, opts, _ := strings.Cut(f.Tag.Get("env"), ",")
		vars = append(vars, Var{
			Name:     name,
			Default:  f.Tag.Get("envDefault"),
			Required: slices.Contains(strings.Split(opts, ","), "required"),
			Help:     f.Tag.Get("help"),
		})
	})
	return vars
}

// emptyButSet rejects a variable marked notEmpty that is set to "". The env
// library would quietly use the default, but an operator who wrote
// KAFKA_BROKERS= made a mistake worth stopping for.
func emptyButSet(environ map[string]string, cfg any) Errors {
	var errs Errors
	walkFields(reflect.TypeOf(cfg), func(f reflect.StructField, name string) {
		if v, ok := environ[name]; ok && strings.TrimSpace(v) == "" && f.Tag.Get("notEmpty") == "true" {
			errs.add(name, "is set but empty")
		}
	})
	return errs
}

// nameVariables rewrites the env library's errors, which name Go fields, so
// that they name the environment variable the operator must fix.
func nameVariables(err error, cfg any) Errors {
	byField := map[string]string{}
	walkFields(reflect.TypeOf(cfg), func(f reflect.StructField, name string) { byField[f.Name] = name })
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		agg.Errors = []error{err}
	}
	var errs Errors
	for _, e := range agg.Errors {
		var pe env.ParseError
		var ns env.VarIsNotSetError
		switch {
		case errors.As(e, &pe):
			errs = append(errs, &VarError{Var: byField[pe.Name], Err: pe.Err})
		case errors.As(e, &ns):
			errs.add(ns.Key, "is required")
		default:
			errs.add("?", "%w", e)
		}
	}
	return errs
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

// Validate checks the payment provider settings.
func (p *Payment) Validate() error {
	return errors.Join(checkBaseURL(p.BaseURL).err(), p.PaymentLimits.Validate())
}

// Validate checks maintain's provider settings: the address only when set.
func (p *OptionalPayment) Validate() error {
	var errs Errors
	if p.BaseURL != "" {
		errs = checkBaseURL(p.BaseURL)
	}
	return errors.Join(errs.err(), p.PaymentLimits.Validate())
}

func checkBaseURL(base string) Errors {
	var errs Errors
	u, err := url.Parse(base)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		// An operator who put credentials in the URL must not find them
		// in the log.
		errs.add("PAYMENT_BASE_URL", "%q is not an http(s) URL", redact.DSN(base))
	case u.User != nil:
		errs.add("PAYMENT_BASE_URL", "must not carry credentials; use PAYMENT_API_KEY")
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
	var errs Errors
	if p.Timeout <= 0 || p.Timeout > 5*time.Minute {
		errs.add("PAYMENT_TIMEOUT", "%s is outside (0, 5m]", p.Timeout)
	}
	if p.MaxConcurrency < 1 || p.MaxConcurrency > 100000 {
		errs.add("PAYMENT_MAX_CONCURRENCY", "%d is outside 1..100000", p.MaxConcurrency)
	}
	if p.MaxRPS < 0 || p.MaxRPS > 1e6 {
		errs.add("PAYMENT_MAX_RPS", "%v is outside 0..1000000 (0 is unlimited)", p.MaxRPS)
	}
	if p.IdempotencyWindow < time.Hour {
		errs.add("PAYMENT_IDEMPOTENCY_WINDOW", "%s is shorter than 1h; set it to how long the provider keeps an idempotency key (Stripe: 24h)", p.IdempotencyWindow)
	}
	if p.RecoverAfter <= p.Timeout || p.RecoverAfter >= p.IdempotencyWindow {
		errs.add("PAYMENT_RECOVER_AFTER", "%s must be longer than PAYMENT_TIMEOUT (%s) and shorter than PAYMENT_IDEMPOTENCY_WINDOW (%s)", p.RecoverAfter, p.Timeout, p.IdempotencyWindow)
	}
	return errs.err()
}

// LogValue masks the API key.
func (p Payment) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("base_url", p.BaseURL),
		slog.String("api_key", mask(p.APIKey)),
		slog.Duration("timeout", p.Timeout),
		slog.Int("max_concurrency", p.MaxConcurrency),
		slog.Float64("max_rps", p.MaxRPS),
		slog.Duration("idempotency_window", p.IdempotencyWindow),
		slog.Duration("recover_after", p.RecoverAfter),
	)
}

// Validate checks the consumer settings.
func (c *Consumer) Validate() error {
	var errs Errors
	if c.MaxInFlight < 0 || c.MaxInFlight > 100000 {
		errs.add("MAX_IN_FLIGHT", "%d is outside 0..100000", c.MaxInFlight)
	}
	if c.Lanes < 1 || c.Lanes > 1024 {
		errs.add("CONSUMER_LANES", "%d is outside 1..1024", c.Lanes)
	}
	if c.BatchMax < 1 || c.BatchMax > 1000 {
		errs.add("CONSUMER_BATCH_MAX", "%d is outside 1..1000", c.BatchMax)
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
		slog.Int("lanes", c.Lanes),
		slog.Int("batch_max", c.BatchMax),
		slog.Duration("drain_timeout", c.DrainTimeout),
		slog.Bool("commit_every_message", c.CommitEveryMessage),
	)
}

// Validate checks the partition settings.
func (d *DedupPartitions) Validate() error {
	var errs Errors
	if d.Retention < 24*time.Hour {
		errs.add("DEDUP_RETENTION", "%s is shorter than 24h (partitions are daily)", d.Retention)
	}
	if d.PartitionsAhead < 1 || d.PartitionsAhead > 60 {
		errs.add("DEDUP_PARTITIONS_AHEAD", "%d is outside 1..60", d.PartitionsAhead)
	}
	return errs.err()
}

// Validate checks the dedup store's settings.
func (d *Dedup) Validate() error {
	var errs Errors
	if d.MaintenanceInterval < time.Minute || d.MaintenanceInterval > 24*time.Hour {
		errs.add("DEDUP_MAINTENANCE_INTERVAL", "%s is outside [1m, 24h]", d.MaintenanceInterval)
	}
	if d.MaxFutureSkew < time.Second || d.MaxFutureSkew > 24*time.Hour {
		errs.add("DEDUP_MAX_FUTURE_SKEW", "%s is outside [1s, 24h]", d.MaxFutureSkew)
	}
	return errors.Join(d.DedupPartitions.Validate(), errs.err())
}

// LogValue lists the dedup store's settings.
func (d Dedup) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Duration("retention", d.Retention),
		slog.Bool("allow_short_retention", d.AllowShortRetention),
		slog.Int("partitions_ahead", d.PartitionsAhead),
		slog.Duration("maintenance_interval", d.MaintenanceInterval),
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
// concurrency: every provider slot busy and as many messages queued behind
// them, so that lanes find full batches waiting, which is what makes a
// transaction carry many events.
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
	return errors.Join(s.Kafka.Validate(), s.Database.Validate(), s.Payment.Validate(), s.Consumer.Validate(),
		s.Dedup.Validate(), s.Outbox.Validate(), s.Log.Validate(), errs.err())
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
		slog.Duration("outbox_retention", s.Outbox.Retention),
		slog.String("log_level", s.Log.Level.String()),
		slog.String("log_format", s.Log.Format),
	)
}

// Validate checks every setting of migrate.
func (m *Migrate) Validate() error {
	return errors.Join(m.Database.Validate(), m.Log.Validate())
}

// Validate checks every setting of maintain.
func (m *Maintain) Validate() error {
	return errors.Join(m.Database.Validate(), m.Dedup.Validate(), m.Outbox.Validate(), m.Payment.Validate(), m.Log.Validate())
}

func mask(secret string) string {
	if secret == "" {
		return ""
	}
	return "xxxxx"
}
