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
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
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

// Providers billing speaks (PAYMENT_PROVIDER).
const (
	// ProviderContract is billing's own provider contract (DESIGN.md,
	// "Payment provider call"), which billing fakepsp serves.
	ProviderContract = "contract"
	// ProviderStripe is Stripe's PaymentIntents API.
	ProviderStripe = "stripe"
	// ProviderAdyen is Adyen's Checkout API.
	ProviderAdyen = "adyen"
)

// StripeBaseURL is PAYMENT_BASE_URL's default for Stripe.
const StripeBaseURL = "https://api.stripe.com"

// Payment holds the payment provider settings.
type Payment struct {
	Provider string `env:"PAYMENT_PROVIDER" envDefault:"contract" notEmpty:"true" help:"the provider's API billing speaks: contract (billing's own, POST {base}/v1/charges), stripe (PaymentIntents, off-session) or adyen (Checkout /payments, stored cards)"`
	BaseURL  string `env:"PAYMENT_BASE_URL" help:"the provider's base URL; required for contract and adyen (the Checkout API root with its version, e.g. https://checkout-test.adyen.com/v71); stripe: https://api.stripe.com when unset"`
	// MerchantAccount is the Adyen merchant account the charges are
	// made for, and whose notifications billing acts on.
	MerchantAccount string `env:"ADYEN_MERCHANT_ACCOUNT" help:"adyen: the merchant account billing charges for (required); notifications of other merchant accounts are ignored"`
	PaymentLimits
}

// API is what a provider's client is built from: which API, where, for
// which merchant account, within which limits.
type API struct {
	Provider        string
	BaseURL         string
	MerchantAccount string
	PaymentLimits
}

// API is the provider's client settings. Payment's fields are API's, tags
// aside: the conversion stops compiling should they part.
func (p Payment) API() API { return API(p) }

// PaymentLimits are the provider settings besides its address, which
// maintain shares with serve.
type PaymentLimits struct {
	APIKey  string        `env:"PAYMENT_API_KEY" help:"sent as Authorization: Bearer <key> (contract; stripe: a restricted key rk_... with PaymentIntents Write, or the secret key sk_...) or X-API-Key (adyen: the API key of a web service user with the Checkout webservice role); never logged"`
	Timeout time.Duration `env:"PAYMENT_TIMEOUT" envDefault:"10s" help:"timeout of one provider request"`
	// MaxConcurrency bounds the provider requests in flight, whole process.
	// Sized for a provider answering in 500 ms: 1,024 in flight carry about
	// 2,000 charges a second.
	MaxConcurrency int `env:"PAYMENT_MAX_CONCURRENCY" envDefault:"1024" help:"provider requests in flight, whole process (at 500 ms a provider answer, up to ~2,000 charges/s); MAX_IN_FLIGHT and PAYMENT_MAX_RPS bound them too"`
	// MaxRPS bounds the provider requests per second of this process (a
	// token bucket: each replica has its own); 0 is unlimited.
	MaxRPS float64 `env:"PAYMENT_MAX_RPS" envDefault:"0" help:"provider requests per second of this process, lookups included (a token bucket: N replicas send up to N times it; PAYMENT_ACCOUNT_MAX_RPS is the account's limit, shared by the replicas); 0 is unlimited"`
	// IdempotencyWindow is how long the provider keeps an idempotency key.
	// A charge attempt older than that is never sent again: asking again
	// could charge twice. It is looked up at the provider instead, and
	// reported for a human when the provider cannot tell. 0: the
	// provider's own (Load fills it in).
	IdempotencyWindow time.Duration `env:"PAYMENT_IDEMPOTENCY_WINDOW" envDefault:"0" help:"how long the provider keeps an idempotency key (0: the provider's, 24h for contract and stripe, 744h = 31 days for adyen); a pending charge attempt older than that is never sent again, only looked up (adyen: never asked about again, for a human)"`
	// ResolveAfter is how long a payment the provider holds without a
	// verdict (in_progress) waits for the provider's notification before
	// billing asks the provider about it; later lookups of the same
	// payment come further apart as it ages, at most an hour.
	ResolveAfter time.Duration `env:"PAYMENT_RESOLVE_AFTER" envDefault:"10m" help:"how long a payment the provider holds without a verdict (in_progress) waits for its webhook before billing looks it up; later lookups come further apart, at most hourly"`
	// RecoverAfter is how long a charge attempt may stay pending with
	// nobody working on it (a crash between claim and settle) before
	// maintenance completes it. 0 means the longer of 1m and twice
	// PAYMENT_TIMEOUT (Load fills it in): a request still in flight is not
	// asked again.
	RecoverAfter time.Duration `env:"PAYMENT_RECOVER_AFTER" envDefault:"0" help:"how long a charge attempt may stay pending with nobody working on it before maintenance completes it; 0: the longer of 1m and 2 × PAYMENT_TIMEOUT"`
}

// Fleet is what the replicas of a consumer group share through the
// database (internal/fleet): the provider account's request budget.
type Fleet struct {
	// AccountMaxRPS is the provider account's limit, in requests per
	// second, which every replica of KAFKA_GROUP_ID shares: each takes a
	// share of it in the database and sends no more than its share. 0: no
	// shared budget (each replica is bounded by PAYMENT_MAX_RPS alone).
	AccountMaxRPS float64 `env:"PAYMENT_ACCOUNT_MAX_RPS" envDefault:"0" help:"the provider account's requests per second (charges and lookups alike), shared by every replica of KAFKA_GROUP_ID through the database: the fleet never sends more in any second, a replica that dies gives its share back within 3s, and the provider's 429s shrink it for a while; 0 is none. PAYMENT_MAX_RPS still caps each replica. Stripe: 100/s live for the whole account, 25/s per endpoint (charges are one), 25/s in test mode"`
}

// OptionalPayment is maintain's provider: with PAYMENT_BASE_URL set (for
// stripe, PAYMENT_API_KEY) it completes the charge attempts left pending
// and looks up those whose outcome is unknown, without it only reports
// them.
type OptionalPayment struct {
	Provider        string `env:"PAYMENT_PROVIDER" envDefault:"contract" notEmpty:"true" help:"the provider's API billing speaks: contract, stripe or adyen"`
	BaseURL         string `env:"PAYMENT_BASE_URL" help:"the provider's base URL; when set (stripe: when PAYMENT_API_KEY is set), maintain completes the charge attempts left pending and looks up those whose outcome is unknown, else it only reports them"`
	MerchantAccount string `env:"ADYEN_MERCHANT_ACCOUNT" help:"adyen: the merchant account billing charges for; required with PAYMENT_BASE_URL"`
	PaymentLimits
}

// API is the provider's client settings (a conversion, as Payment's).
func (p OptionalPayment) API() API { return API(p) }

// Webhooks is where the provider's notifications come in.
type Webhooks struct {
	// Secrets verify the notifications' signatures: several during a
	// rotation, any one of which may verify.
	Secrets []string `env:"PAYMENT_WEBHOOK_SECRET" envSeparator:"," help:"the webhook signing secret(s), comma-separated, any one of which verifies (rotation): stripe whsec_... (required), adyen the endpoint's HMAC key in hex (required), contract an HMAC-SHA256 key (without one the contract's webhook is off); never logged"`
	// Addr is the provider-facing listener, apart from HTTP_ADDR, which
	// stays internal.
	Addr string `env:"WEBHOOK_ADDR" envDefault:":8090" help:"address of the provider-facing listener: POST /webhooks/<PAYMENT_PROVIDER>; expose it to the provider only (docs/deployment.md)"`
}

// Consumer tunes the consumer's concurrency.
type Consumer struct {
	// MaxInFlight bounds the messages taken off partitions and not yet
	// finished, per instance. Every key's oldest one is charged at once,
	// so this, PAYMENT_MAX_CONCURRENCY and PAYMENT_MAX_RPS are what bound
	// the requests in flight. 0 means 2 × PAYMENT_MAX_CONCURRENCY (Load
	// fills it in).
	MaxInFlight int `env:"MAX_IN_FLIGHT" envDefault:"0" help:"messages taken off partitions and not yet finished, per instance; 0: 2 × PAYMENT_MAX_CONCURRENCY"`
	// MaxInFlightBytes bounds the same messages in bytes (keys and
	// values): a backlog of large messages must not take more memory than
	// the deployment has. A single message larger than it is still taken,
	// alone.
	MaxInFlightBytes int64 `env:"MAX_IN_FLIGHT_BYTES" envDefault:"67108864" help:"bytes (keys and values) of the messages taken off partitions and not yet finished, per instance; taking waits while they are all taken, and a message larger than it is processed alone. sarama's fetch buffers come on top (BENCHMARKS.md)"`
	// DrainTimeout bounds how long in-flight work may run after a partition
	// is revoked or SIGTERM arrives; what is unfinished then is abandoned
	// (rolled back, not marked) and redelivered to the next owner.
	DrainTimeout time.Duration `env:"DRAIN_TIMEOUT" envDefault:"10s" help:"how long in-flight work may finish after a revocation or SIGTERM; serve exits within DRAIN_TIMEOUT + 5s"`
}

// The default retentions of DEDUP_RETENTION and OUTBOX_RETENTION (their
// envDefault tags say the same; a test holds them together). billing
// maintain with a shorter one drops money-relevant records earlier than
// billing would: an operator's decision, recorded in operator_action.
const (
	DefaultDedupRetention  = 168 * time.Hour
	DefaultOutboxRetention = 72 * time.Hour
)

// DedupRetention is how long processed_event remembers an event, which
// serve judges events by and both serve and maintain keep.
type DedupRetention struct {
	// Retention is how long processed_event remembers an event. 720h is
	// advised for topics that are replayed from a DLQ.
	Retention time.Duration `env:"DEDUP_RETENTION" envDefault:"168h" help:"how long processed_event remembers an event (720h for topics replayed from a DLQ); at least 24h"`
}

// Dedup holds the settings of the processed_event store.
type Dedup struct {
	DedupRetention
	// AllowShortRetention starts serve even when Retention is shorter than
	// what the broker can still redeliver.
	AllowShortRetention bool `env:"DEDUP_ALLOW_SHORT_RETENTION" envDefault:"false" help:"start even when DEDUP_RETENTION is shorter than the topic's retention"`
	// MaxFutureSkew bounds how far ahead of this clock an event id's time
	// may be; beyond it the event is dead-lettered.
	MaxFutureSkew time.Duration `env:"DEDUP_MAX_FUTURE_SKEW" envDefault:"1h" help:"how far ahead of this clock an eventId's time may be; later events are dead-lettered"`
}

// Partitions are the daily partitions of processed_event and of the
// outbox, which serve and maintain create ahead of time.
type Partitions struct {
	// Ahead is how many days of partitions exist ahead of today, in both
	// tables: a row of a day without one waits for the writer to create
	// it.
	Ahead int `env:"PARTITIONS_AHEAD" envDefault:"3" help:"days of daily partitions of processed_event and outbox created ahead of today; DEDUP_PARTITIONS_AHEAD, its earlier name, is still read"`
}

// Maintenance is serve's schedule of the partitions' upkeep.
type Maintenance struct {
	Partitions
	// Interval is how often serve creates the partitions ahead and drops
	// the expired ones (processed_event and outbox). The charge attempts
	// left pending are looked for on a schedule of their own, derived from
	// PAYMENT_RECOVER_AFTER.
	Interval time.Duration `env:"PARTITION_MAINTENANCE_INTERVAL" envDefault:"1h" help:"how often serve creates the partitions of processed_event and outbox ahead and drops the expired ones; DEDUP_MAINTENANCE_INTERVAL, its earlier name, is still read"`
}

// Outbox is the retention of published payment outcome events, which
// serve's maintenance and maintain keep.
type Outbox struct {
	// Retention is how long published outcomes stay in the outbox table
	// (for an operator's look), by whole days.
	Retention time.Duration `env:"OUTBOX_RETENTION" envDefault:"72h" help:"how long the outbox keeps a day of payment outcome events once all of it is published (published ones are deleted), and outcome events that can never be published (outbox_dead); at least 24h (partitions are daily)"`
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
	Webhooks Webhooks
	Fleet    Fleet
	Consumer Consumer
	Dedup    Dedup
	Outbox   Outbox
	// Maintenance is the upkeep of the tables serve runs besides
	// consuming (maintenance.go in cmd/billing).
	Maintenance Maintenance

	HTTPAddr string `env:"HTTP_ADDR" envDefault:":8080" help:"address of /healthz, /readyz and /metrics"`
	// PprofAddr, when set, serves Go's runtime profiles on a listener of
	// their own, never on HTTP_ADDR: the metrics port is reachable by
	// whatever scrapes it, and a profile shows the process's internals
	// (and a CPU profile costs CPU while it runs). Off by default.
	PprofAddr string `env:"DEBUG_PPROF_ADDR" help:"address of a listener of its own serving Go's profiles at /debug/pprof/ (heap, goroutine, CPU; for benchmarks and diagnosis); empty: none. Bind it to 127.0.0.1 or a port only operators reach"`
	Log       Log
}

// Migrate is the configuration of `billing migrate`.
type Migrate struct {
	Database Database
	Log      Log
}

// Maintain is the configuration of `billing maintain`.
type Maintain struct {
	Database   Database
	Dedup      DedupRetention
	Partitions Partitions
	Outbox     Outbox
	Payment    OptionalPayment
	Log        Log
}

// Charging is the configuration of `billing pause` and `billing resume`:
// the database that holds the group's charging state, and the group.
type Charging struct {
	Database Database
	GroupID  string `env:"KAFKA_GROUP_ID" envDefault:"billing-order-confirmed" notEmpty:"true" help:"the consumer group whose charging is paused or resumed: every replica of it follows"`
	Log      Log
}

// PaymentMethods is the configuration of `billing payment-methods import`.
type PaymentMethods struct {
	Database Database
	Provider string `env:"PAYMENT_PROVIDER" envDefault:"contract" notEmpty:"true" help:"the provider whose saved payment methods are imported: stripe or adyen (the contract charges by customer id and needs none)"`
	Log      Log
}

// Resolve is the configuration of `billing resolve`: the database, and
// the provider settings that say when billing may still send an attempt,
// and which provider's saved payment methods a waiting event that becomes
// its order's next attempt is charged with. It asks the provider nothing.
type Resolve struct {
	Database Database
	Provider string `env:"PAYMENT_PROVIDER" envDefault:"contract" notEmpty:"true" help:"the provider's API billing speaks: contract, stripe or adyen; a waiting event that becomes its order's next attempt is recorded with its customer's saved payment method for it"`
	// IdempotencyWindow, Timeout and RecoverAfter are serve's: a pending
	// attempt is resolved by hand only once billing can no longer send it.
	IdempotencyWindow time.Duration `env:"PAYMENT_IDEMPOTENCY_WINDOW" envDefault:"0" help:"how long the provider keeps an idempotency key, as serve has it (0: the provider's, 24h for contract and stripe, 744h for adyen); a pending attempt is resolved by hand only once older than it and PAYMENT_RECOVER_AFTER"`
	Timeout           time.Duration `env:"PAYMENT_TIMEOUT" envDefault:"10s" help:"timeout of one provider request, as serve has it"`
	RecoverAfter      time.Duration `env:"PAYMENT_RECOVER_AFTER" envDefault:"0" help:"as serve has it (0: the longer of 1m and 2 × PAYMENT_TIMEOUT): a request sent before PAYMENT_IDEMPOTENCY_WINDOW passed is answered within it"`
	Log               Log
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
	environ, earlier := withRenamed(environ)
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
	return append(errs, more...).tidy(cfg, earlier)
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
