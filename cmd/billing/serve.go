package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/trace"

	"example.com/billing/internal/billing"
	"example.com/billing/internal/config"
	"example.com/billing/internal/consumer"
	"example.com/billing/internal/dedup"
	"example.com/billing/internal/dlq"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/kafkaacl"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/notified"
	"example.com/billing/internal/outbox"
	"example.com/billing/internal/payment"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/schema"
	"example.com/billing/internal/server"
	"example.com/billing/internal/tracing"
	"example.com/billing/internal/webhook"
)

const serveHelp = `
Consumes order.confirmed.v1 events from KAFKA_TOPIC and charges each order
exactly once in effect; serves GET /healthz, /readyz and /metrics on
HTTP_ADDR. It runs until SIGTERM or SIGINT, then lets in-flight work finish
(at most DRAIN_TIMEOUT), commits the finished offsets and exits 0.

The database must be migrated to this binary's schema first (billing
migrate). The configuration is read from the environment once, at start;
every missing or bad variable is reported at once. Tracing is off unless
OTEL_EXPORTER_OTLP_ENDPOINT is set (the standard OTEL_* variables apply).
Logs go to stderr.`

const serveExample = `DATABASE_URL='postgres://billing:secret@db:5432/billing?sslmode=verify-full' \
  PAYMENT_BASE_URL=https://psp.example.com PAYMENT_API_KEY=sk_live_... \
  KAFKA_BROKERS=kafka-1:9092,kafka-2:9092 billing serve`

// serve runs the consumer and the HTTP server until ctx is done, then
// drains and returns nil.
func serve(ctx context.Context, args []string, environ map[string]string, stdout, logw io.Writer) error {
	var cfg config.Serve
	fs := newFlagSet("serve", about{description: serveHelp, env: &cfg, example: serveExample})
	if help, err := parseSubcommandFlags(fs, args, stdout); help || err != nil {
		return err
	}
	if err := config.Load(environ, &cfg); err != nil {
		return err
	}
	log := newLogger(logw, cfg.Log)
	log.Info("billing starting", "version", version, "config", cfg)
	for _, notice := range append(config.Retired(environ), config.Renamed(environ)...) {
		log.Warn(notice)
	}

	// SIGTERM must end the process within DRAIN_TIMEOUT + 5s, whatever the
	// broker or the database do: the deployment's grace period is sized from
	// it, and a process killed at its end stops without its last log line.
	// Nothing guarantees that on its own: sarama's calls take no context and
	// can wait on a silent broker for minutes, and a query cut off by ctx
	// still waits for a database that does not answer. So the service runs
	// on its own, and serve stops waiting for it when the bound is reached:
	// what is unfinished then was not marked, and is redelivered.
	stopped := make(chan error, 1)
	go func() { stopped <- runService(ctx, cfg, environ, log) }()
	var err error
	select {
	case err = <-stopped:
	case <-ctx.Done():
		select {
		case err = <-stopped:
		case <-time.After(cfg.Consumer.DrainTimeout + shutdownSlack):
			log.Error("shutdown did not finish in time (the broker or the database does not answer); exiting without waiting any longer: unfinished messages were not committed and will be redelivered",
				"waited", cfg.Consumer.DrainTimeout+shutdownSlack, "drain_timeout", cfg.Consumer.DrainTimeout)
		}
	}
	if ctx.Err() == nil {
		return err // the service failed: not a shutdown
	}
	if err != nil {
		log.Warn("error while stopping", "err", err)
	}
	log.Info("billing stopped")
	return nil
}

// shutdownSlack is how long, beyond DRAIN_TIMEOUT, serve waits for the
// service to stop after SIGTERM: the offsets' last commit and leaving the
// group, with a second to spare for the process to exit within
// DRAIN_TIMEOUT + 5s.
const shutdownSlack = 4 * time.Second

// runService runs the consumer and the HTTP server until ctx is done, then
// drains. It returns nil when ctx ended, also while it was still starting.
// Each step below starts one part, top to bottom, and the deferred calls
// stop them in the reverse order.
func runService(ctx context.Context, cfg config.Serve, environ map[string]string, log *slog.Logger) error {
	tp, stopTracing, err := startTracing(ctx, environ, log)
	if err != nil {
		return err
	}
	defer stopTracing()
	// A registry of our own, never the global one.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg)

	db, embedded, err := openDatabase(cfg.Database, reg)
	if err != nil {
		return err
	}
	defer db.Close()

	// HTTP first, so that liveness answers while dependencies come up. A
	// server that fails cancels ctx with the failure as its cause.
	var live liveParts
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stopHTTP, err := startHTTPServers(cfg, live.readiness(db, embedded), reg, log, cancel)
	if err != nil {
		return err
	}
	defer stopHTTP()
	if err := waitForSchema(ctx, db, embedded, log); err != nil || ctx.Err() != nil {
		return err
	}
	if err := checkPoolMode(ctx, db, cfg.Database.URL, log); err != nil {
		return err
	}
	replica, err := register(ctx, db, embedded, log)
	if err != nil {
		return ignoreStop(ctx, err)
	}
	defer replica.end()

	// The provider's client outlives the background work that charges
	// through it (maintenance's recovery), which stops first. The fleet's
	// member gives it its share of the provider's budget and the charging
	// state before anything charges, and leaves once nothing sends.
	payer := newPayer(cfg.Payment.API(), cfg.Fleet.AccountMaxRPS > 0, tp, m)
	defer payer.Close()
	member, err := joinFleet(ctx, db, cfg, replica.instance, payer, m, log)
	if err != nil {
		return ignoreStop(ctx, err)
	}
	defer member.leave()
	horizon := billing.Horizon{Retention: cfg.Dedup.Retention, MaxFutureSkew: cfg.Dedup.MaxFutureSkew,
		ProviderWindow: cfg.Payment.IdempotencyWindow, ResolveAfter: cfg.Payment.ResolveAfter}
	processor := billing.NewProcessor(db, dedup.NewStore(cfg.Kafka.GroupID), payer, horizon, m, tp, log)
	live.proc.Store(processor)
	stopWebhooks, err := startWebhooks(cfg, db, processor, m, log, cancel)
	if err != nil {
		return err
	}
	defer stopWebhooks()
	var background sync.WaitGroup
	defer func() { cancel(nil); background.Wait() }() // stopped before the pool closes under it
	startMaintenance(ctx, &background, cfg, db, processor, m, log)

	k, err := joinKafka(ctx, &background, cfg, &live.acls, m, log)
	if err != nil {
		return ignoreStop(ctx, err)
	}
	defer k.client.Close()
	parking, err := newParking(ctx, cfg.Kafka, k.sizes, m, log)
	if err != nil {
		return ignoreStop(ctx, err)
	}
	defer parking.Close()

	// The processor's writers outlive ctx: after SIGTERM the consumer's
	// drain still claims and settles what finishes in time. They stop once
	// the consumer is done.
	writersCtx, stopWriters := context.WithCancel(context.WithoutCancel(ctx))
	var writers sync.WaitGroup
	writers.Go(func() { processor.Run(writersCtx) })
	defer func() { stopWriters(); writers.Wait() }()

	stopRelay, err := startRelay(ctx, &background, cfg.Kafka, db, k.sizes, m, log)
	if err != nil {
		return err
	}
	defer stopRelay()

	c, err := consumer.NewConsumer(k.client, processor, parking, consumer.Options{
		Topic:            cfg.Kafka.Topic,
		Group:            cfg.Kafka.GroupID,
		MaxInFlight:      cfg.Consumer.MaxInFlight,
		MaxInFlightBytes: cfg.Consumer.MaxInFlightBytes,
		DrainTimeout:     cfg.Consumer.DrainTimeout,
		Commit:           commitOf(db, cfg.Kafka.GroupID),
		ReplayWindow:     horizon.ProviderWindow,
	}, m, tp, log)
	if err != nil {
		return fmt.Errorf("consumer group: %w", err)
	}
	live.consumer.Store(c)
	member.Follow(c) // while charging is paused, fetching is too
	consume(ctx, c, cfg.Kafka, log)
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return nil
}

// startTracing starts the tracer provider: off unless
// OTEL_EXPORTER_OTLP_ENDPOINT is set. stop flushes the spans still
// buffered.
func startTracing(ctx context.Context, environ map[string]string, log *slog.Logger) (tp trace.TracerProvider, stop func(), err error) {
	tp, shutdown, err := tracing.NewProvider(ctx, environ, version)
	if err != nil {
		return nil, nil, err
	}
	return tp, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdown(ctx); err != nil {
			log.Warn("flush traces", "err", err)
		}
	}, nil
}

// openDatabase opens serve's pool, its statistics in reg, and returns the
// newest schema this binary embeds. Open validates the URL; the server may
// still be away.
func openDatabase(cfg config.Pool, reg *prometheus.Registry) (*sqlx.DB, int64, error) {
	db, err := postgres.Open(cfg.URL, cfg.MaxConns)
	if err != nil {
		return nil, 0, fmt.Errorf("DATABASE_URL: %w", err)
	}
	embedded, err := schema.Version()
	if err != nil {
		db.Close()
		return nil, 0, err
	}
	reg.MustRegister(collectors.NewDBStatsCollector(db.DB, "billing"))
	return db, embedded, nil
}

// checkPoolMode finds whether db's connections share server sessions (a
// pooler in transaction mode) and logs the pool mode found, before serve
// takes anything; it refuses a pool mode billing cannot run on, naming it.
// Billing keeps no state in a session (leases, SET LOCAL, transaction
// advisory locks), so only lib/pq's two-round-trip statements
// (binary_parameters turned off) are refused.
func checkPoolMode(ctx context.Context, db *sqlx.DB, dsn string, log *slog.Logger) error {
	sessions, err := postgres.DetectSessions(ctx, db)
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("could not tell whether the database's connections share server sessions; billing runs either way", "err", err)
		}
		return nil
	}
	if err := postgres.CheckSessions(sessions, dsn); err != nil {
		return err
	}
	log.Info("database pool mode", "pool_mode", sessions.Mode(), "sessions", sessions.String())
	return nil
}

// liveParts are the parts of the service that readiness asks about, set
// as they come up.
type liveParts struct {
	consumer atomic.Pointer[consumer.Consumer]
	proc     atomic.Pointer[billing.Processor]
	acls     permissions
}

// readiness is /readyz's view of the service: the database's schema and
// writes, the consumer's group session, the principal's Kafka permissions.
func (l *liveParts) readiness(db *sqlx.DB, embedded int64) server.Readiness {
	return server.Readiness{
		Schema: func(ctx context.Context) (string, error) { return schemaProblem(ctx, db, embedded) },
		Writable: func(ctx context.Context) error {
			if p := l.proc.Load(); p != nil {
				if err := p.WriteRefusal(); err != nil {
					return err
				}
			}
			return postgres.CheckWritable(ctx, db)
		},
		Consumer: func() bool {
			c := l.consumer.Load()
			return c != nil && c.Ready()
		},
		MissingACLs: l.acls.Missing,
	}
}

// startHTTPServers serves /healthz, /readyz and /metrics on HTTP_ADDR and,
// when DEBUG_PPROF_ADDR is set, the profiles on a listener of their own.
// stop shuts them down.
func startHTTPServers(cfg config.Serve, ready server.Readiness, reg *prometheus.Registry, log *slog.Logger, fail context.CancelCauseFunc) (stop func(), err error) {
	stopHTTP, err := startHTTP("HTTP_ADDR", cfg.HTTPAddr, server.NewHandler(ready, reg, log), log, fail)
	if err != nil {
		return nil, err
	}
	if cfg.PprofAddr == "" {
		return stopHTTP, nil
	}
	stopPprof, err := startHTTP("DEBUG_PPROF_ADDR", cfg.PprofAddr, server.NewDebugHandler(), log, fail)
	if err != nil {
		stopHTTP()
		return nil, err
	}
	return func() { stopPprof(); stopHTTP() }, nil
}

// startWebhooks serves the provider's notifications on WEBHOOK_ADDR,
// recorded through processor; stop shuts the listener down. The contract's
// webhook is off without PAYMENT_WEBHOOK_SECRET: its outcomes are then
// learnt by lookups alone. Adyen's notified payments are kept in db too,
// for billing reconcile: Adyen has no API that lists them.
func startWebhooks(cfg config.Serve, db *sqlx.DB, processor *billing.Processor, m *metrics.Metrics, log *slog.Logger, fail context.CancelCauseFunc) (stop func(), err error) {
	verify := webhookOf(cfg, m, log)
	if verify == nil {
		log.Info("webhooks off: no PAYMENT_WEBHOOK_SECRET; outcomes the provider decides later are learnt by lookups", "provider", cfg.Payment.Provider)
		return func() {}, nil
	}
	var n webhook.Notifier = processor
	if cfg.Payment.Provider == config.ProviderAdyen {
		n = keeping{kept: notified.NewStore(db, cfg.Payment.Provider), next: processor}
	}
	return startHTTP("WEBHOOK_ADDR", cfg.Webhooks.Addr, webhook.NewHandler(cfg.Payment.Provider, verify, n, m, log), log, fail)
}

// keeping keeps the payments notifications describe, then records their
// outcomes: the handler acknowledges a notification only once both are
// committed, and a notification sent again is kept once.
type keeping struct {
	kept *notified.Store
	next webhook.Notifier
}

func (k keeping) Notify(ctx context.Context, notes []payment.Notification) (billing.Noticed, error) {
	if err := k.kept.Keep(ctx, notes); err != nil {
		return billing.Noticed{}, err
	}
	return k.next.Notify(ctx, notes)
}

// startMaintenance runs the tables' upkeep in background: the retention
// of processed_event and the outbox once now and every
// PARTITION_MAINTENANCE_INTERVAL, and the recovery of the charge attempts
// left pending, through processor, whatever the consumer does. One replica
// of many does each piece of work (leases); the others skip.
func startMaintenance(ctx context.Context, background *sync.WaitGroup, cfg config.Serve, db *sqlx.DB, processor *billing.Processor, m *metrics.Metrics, log *slog.Logger) {
	mt := newMaintenance(db, cfg.Dedup.DedupRetention, cfg.Outbox, cfg.Maintenance.Partitions, processor.Recoverer(), cfg.Payment.RecoverAfter, m, log)
	if _, err := mt.retention(ctx); err != nil && ctx.Err() == nil {
		log.Warn("maintenance failed at start; the writers create missing partitions themselves", "err", err)
	}
	mt.schedule(ctx, background, cfg.Maintenance.Interval)
}

// kafkaLink is serve's connection to the brokers, and what it learnt of
// its topics at start.
type kafkaLink struct {
	client sarama.Client
	sizes  topicSizes
}

// joinKafka connects to the brokers and waits until serve's principal has
// every permission serve needs, before it takes anything: a missing one
// would otherwise show only at its first use (the first message to park,
// the first outcome to publish), after messages were taken. It keeps
// checking them in background, reads the topics' settings (the dedup
// horizon's check) and says where the group starts.
func joinKafka(ctx context.Context, background *sync.WaitGroup, cfg config.Serve, acls *permissions, m *metrics.Metrics, log *slog.Logger) (kafkaLink, error) {
	brokers := cfg.Kafka.Brokers
	client, err := connectKafka(ctx, cfg.Kafka, cfg.Consumer, log)
	if err != nil {
		return kafkaLink{}, err
	}
	need := kafkaacl.Serve(cfg.Kafka)
	if err := awaitACLs(ctx, log, client, cfg.Kafka, need, acls); err != nil {
		client.Close()
		return kafkaLink{}, err
	}
	background.Go(func() { watchACLs(ctx, log, client, cfg.Kafka, need, acls) })
	sizes, err := awaitKafka(ctx, log, brokers, "the topics' settings", func() (topicSizes, error) {
		return checkTopics(client, cfg, m, log)
	}, nil)
	if err == nil {
		_, err = awaitKafka(ctx, log, brokers, "the consumer group's committed offsets", func() (struct{}, error) {
			logStart(ctx, client, cfg.Kafka, log)
			return struct{}{}, nil
		}, nil)
	}
	if err != nil {
		client.Close()
		return kafkaLink{}, err
	}
	return kafkaLink{client: client, sizes: sizes}, nil
}

// newParking returns the dead-letter writer, once its producer connected.
func newParking(ctx context.Context, k config.Kafka, sizes topicSizes, m *metrics.Metrics, log *slog.Logger) (*dlq.Writer, error) {
	producerCfg, err := dlq.ProducerConfig(k)
	if err != nil {
		return nil, err
	}
	producer, err := awaitKafka(ctx, log, k.Brokers, "the dead-letter producer's connection", func() (sarama.SyncProducer, error) {
		return sarama.NewSyncProducer(k.Brokers, producerCfg)
	}, func(p sarama.SyncProducer) { _ = p.Close() })
	if err != nil {
		return nil, fmt.Errorf("dead-letter producer: %w", err)
	}
	return dlq.NewWriter(producer, k.DLQTopic, k.GroupID, sizes.dlq, m), nil
}

// startRelay runs the outbox relay in background: payment outcome events
// to KAFKA_OUTCOME_TOPIC, from whichever replica holds the relay's lease.
// stop closes its producer.
func startRelay(ctx context.Context, background *sync.WaitGroup, k config.Kafka, db *sqlx.DB, sizes topicSizes, m *metrics.Metrics, log *slog.Logger) (stop func(), err error) {
	relayCfg, err := kafka.OutcomeProducerConfig(k)
	if err != nil {
		return nil, err
	}
	producer, err := sarama.NewSyncProducer(k.Brokers, relayCfg)
	if err != nil {
		return nil, fmt.Errorf("outcome producer: %w", err)
	}
	relay := outbox.NewRelay(db, producer, k.OutcomeTopic, m, log)
	relay.MaxBytes = min(sizes.outcome, kafka.OutcomeBatchBytes-512) // what the topic and the producer take, less the record's overhead
	background.Go(func() { relay.Run(ctx) })
	return func() { _ = producer.Close() }, nil
}

// consume runs the consumer group until ctx is done and the consumer has
// drained, saying meanwhile when it waits for a group session.
func consume(ctx context.Context, c *consumer.Consumer, k config.Kafka, log *slog.Logger) {
	var watch sync.WaitGroup
	watchCtx, stopWatch := context.WithCancel(ctx)
	watch.Go(func() { watchSession(watchCtx, c.Ready, log, k.Brokers, k.GroupID) })
	if err := c.Run(ctx); err != nil {
		log.Warn("consumer group close", "err", err)
	}
	stopWatch()
	watch.Wait()
}

// ignoreStop returns nil when err comes from ctx ending (a shutdown while
// starting), else err.
func ignoreStop(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// startHTTP serves handler on addr, which variable configures (it names
// the variable when the address cannot be listened on). A server that
// fails later cancels ctx through fail. The returned function shuts the
// server down.
func startHTTP(variable, addr string, handler http.Handler, log *slog.Logger, fail context.CancelCauseFunc) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", variable, err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	log.Info("http listening", "addr", ln.Addr().String(), "variable", variable)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fail(fmt.Errorf("http server: %w", err))
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}

// checkTopics derives the dedup horizon from the broker instead of guessing
// it: when the topic keeps messages longer than DEDUP_RETENTION remembers
// them, a redelivery of an old message could no longer be recognised as a
// duplicate (billing parks it as stale-event rather than charging it, but a
// replay would then fill the DLQ). serve refuses to start unless the operator
// accepts that with DEDUP_ALLOW_SHORT_RETENTION.
func checkTopics(client sarama.Client, cfg config.Serve, m *metrics.Metrics, log *slog.Logger) (sizes topicSizes, err error) {
	// The admin shares the client; closing it would close the client.
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return sizes, fmt.Errorf("kafka admin: %w", err)
	}
	// The outcome topic bounds the relay's values: a row larger than it
	// takes is dead rather than retried for ever.
	sizes.outcome, sizes.dlq = 1<<20, dlq.DefaultMaxRecordBytes
	if out, err := kafka.DescribeTopic(admin, cfg.Kafka.OutcomeTopic); err != nil {
		log.Error("cannot read the outcome topic; payment outcome events wait in the outbox until it exists",
			"topic", cfg.Kafka.OutcomeTopic, "err", err)
	} else {
		sizes.outcome = out.MaxMessageBytes - 512 // the record's key, headers and framing
	}
	src, err := kafka.DescribeTopic(admin, cfg.Kafka.Topic)
	if err != nil {
		log.Warn("cannot read the topic's retention; the dedup horizon is unchecked", "topic", cfg.Kafka.Topic, "err", err)
		return sizes, nil
	}
	shortfall, forever := src.Shortfall(cfg.Dedup.Retention)
	switch {
	case forever:
		m.DedupRetentionShortfall.Set(math.Inf(1))
	default:
		m.DedupRetentionShortfall.Set(shortfall.Seconds())
	}
	if forever || shortfall > 0 {
		msg := fmt.Sprintf("DEDUP_RETENTION %s is shorter than topic %s's retention.ms (%s): a redelivered message older than %s cannot be deduplicated and would be parked as stale-event",
			cfg.Dedup.Retention, cfg.Kafka.Topic, retentionText(src), cfg.Dedup.Retention)
		if !cfg.Dedup.AllowShortRetention {
			return sizes, fmt.Errorf("config: DEDUP_RETENTION: %s; raise it, or set DEDUP_ALLOW_SHORT_RETENTION=true to accept this", msg)
		}
		log.Error(msg + "; starting anyway because DEDUP_ALLOW_SHORT_RETENTION=true")
	}
	if dlqLimits, err := kafka.DescribeTopic(admin, cfg.Kafka.DLQTopic); err != nil {
		log.Warn("cannot read the dead-letter topic's max.message.bytes; assuming Kafka's default", "topic", cfg.Kafka.DLQTopic,
			"max_message_bytes", sizes.dlq, "err", err)
	} else {
		// A message too large for it even compressed is parked as a
		// reference (reason oversize), so this bounds nothing; it only
		// decides which messages a replay must fetch from the topic.
		sizes.dlq = dlqLimits.MaxMessageBytes
		if dlqLimits.MaxMessageBytes < src.MaxMessageBytes {
			log.Warn("the dead-letter topic accepts smaller messages than the source topic; the largest invalid messages will be parked as references (reason oversize)",
				"dlq_max_message_bytes", dlqLimits.MaxMessageBytes, "topic_max_message_bytes", src.MaxMessageBytes)
		}
	}
	return sizes, nil
}

// topicSizes are the largest records the outcome topic and the dead-letter
// topic accept (max.message.bytes), as the broker says at start.
type topicSizes struct{ outcome, dlq int }

func retentionText(l kafka.TopicLimits) string {
	if l.Forever {
		return "forever"
	}
	return l.Retention.String()
}

// commitOf is how serve's consumer commits: each partition's position saved
// in db before Kafka's commit, or, in the seed design's benchmark build, a
// synchronous commit per message.
func commitOf(db *sqlx.DB, group string) consumer.Commit {
	if seedDesign {
		return consumer.CommitEach()
	}
	return consumer.SavePositions(dedup.NewPositions(db, group))
}
