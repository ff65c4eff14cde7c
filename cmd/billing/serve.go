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
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"example.com/billing/internal/billing"
	"example.com/billing/internal/config"
	"example.com/billing/internal/dedup"
	"example.com/billing/internal/dlq"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/kafkaacl"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/outbox"
	"example.com/billing/internal/payment"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/server"
	"example.com/billing/internal/tracing"
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
	for _, notice := range config.Retired(environ) {
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
func runService(ctx context.Context, cfg config.Serve, environ map[string]string, log *slog.Logger) error {
	// --- Tracing: off unless OTEL_EXPORTER_OTLP_ENDPOINT is set.
	tp, stopTracing, err := tracing.NewProvider(ctx, environ, version)
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := stopTracing(ctx); err != nil {
			log.Warn("flush traces", "err", err)
		}
	}()

	// --- Metrics: a registry of our own, never the global one.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg)

	// --- PostgreSQL. Open validates the URL; the server may still be away.
	db, err := postgres.Open(cfg.Database.URL, cfg.Database.MaxConns)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer db.Close()
	reg.MustRegister(collectors.NewDBStatsCollector(db.DB, "billing"))
	schema, err := postgres.Version()
	if err != nil {
		return err
	}

	// --- HTTP first, so that liveness answers while dependencies come up.
	var consumer atomic.Pointer[kafka.Consumer]
	var proc atomic.Pointer[billing.Processor]
	var acls permissions
	ready := server.Readiness{
		SchemaVersion: func(ctx context.Context) (int64, error) { return postgres.SchemaVersion(ctx, db) },
		Writable: func(ctx context.Context) error {
			if p := proc.Load(); p != nil {
				if err := p.WriteRefusal(); err != nil {
					return err
				}
			}
			return postgres.CheckWritable(ctx, db)
		},
		WantSchema: schema,
		Consumer: func() bool {
			c := consumer.Load()
			return c != nil && c.Ready()
		},
		MissingACLs: acls.Missing,
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stopHTTP, err := startHTTP("HTTP_ADDR", cfg.HTTPAddr, server.NewHandler(ready, reg, log), log, cancel)
	if err != nil {
		return err
	}
	defer stopHTTP()
	if cfg.PprofAddr != "" {
		stopPprof, err := startHTTP("DEBUG_PPROF_ADDR", cfg.PprofAddr, server.NewDebugHandler(), log, cancel)
		if err != nil {
			return err
		}
		defer stopPprof()
	}

	if err := waitForSchema(ctx, db, schema, log); err != nil || ctx.Err() != nil {
		return err
	}

	// --- Retention of the dedup store and the outbox: partitions ahead,
	// expired ones dropped. One replica of many does the work (advisory
	// locks); the others skip.
	retention := dedup.NewRetention(db, cfg.Dedup.Retention, cfg.Dedup.PartitionsAhead, m, log)
	outboxRetention := outbox.NewRetention(db, cfg.Outbox.Retention, cfg.Dedup.PartitionsAhead, log)
	maintain := func(ctx context.Context) error {
		_, err := retention.Run(ctx)
		_, oerr := outboxRetention.Run(ctx)
		return errors.Join(err, oerr)
	}
	if err := maintain(ctx); err != nil && ctx.Err() == nil {
		log.Warn("maintenance failed at start; the writers create missing partitions themselves", "err", err)
	}
	var maintenance sync.WaitGroup
	defer func() { cancel(nil); maintenance.Wait() }() // stopped before the pool closes under it
	maintenance.Go(func() { every(ctx, cfg.Dedup.MaintenanceInterval, "maintenance", log, maintain) })

	// --- Kafka: the consumer's client and the dead-letter producer.
	brokers := cfg.Kafka.Brokers
	client, err := connectKafka(ctx, cfg.Kafka, cfg.Consumer, log)
	if err != nil {
		return ignoreStop(ctx, err)
	}
	defer client.Close()
	// Every permission serve needs, before it takes anything: a missing
	// one would otherwise show only at its first use (the first message
	// to park, the first outcome to publish), after messages were taken.
	need := kafkaacl.Serve(cfg.Kafka)
	if err := awaitACLs(ctx, log, client, cfg.Kafka, need, &acls); err != nil {
		return ignoreStop(ctx, err)
	}
	maintenance.Go(func() { watchACLs(ctx, log, client, cfg.Kafka, need, &acls) })
	sizes, err := awaitKafka(ctx, log, brokers, "the topics' settings", func() (topicSizes, error) {
		return checkTopics(client, cfg, m, log)
	}, nil)
	if err != nil {
		return ignoreStop(ctx, err)
	}
	if _, err := awaitKafka(ctx, log, brokers, "the consumer group's committed offsets", func() (struct{}, error) {
		logStart(client, cfg.Kafka, log)
		return struct{}{}, nil
	}, nil); err != nil {
		return ignoreStop(ctx, err)
	}
	producerCfg, err := dlq.ProducerConfig(cfg.Kafka)
	if err != nil {
		return err
	}
	producer, err := awaitKafka(ctx, log, brokers, "the dead-letter producer's connection", func() (sarama.SyncProducer, error) {
		return sarama.NewSyncProducer(brokers, producerCfg)
	}, func(p sarama.SyncProducer) { _ = p.Close() })
	if err != nil {
		return ignoreStop(ctx, fmt.Errorf("dead-letter producer: %w", err))
	}
	parking := dlq.NewWriter(producer, cfg.Kafka.DLQTopic, cfg.Kafka.GroupID, sizes.dlq, m)
	defer parking.Close()

	// --- The pipeline: payment client, processor, consumer.
	payer := payment.New(payment.Config{
		BaseURL:        cfg.Payment.BaseURL,
		APIKey:         cfg.Payment.APIKey,
		Timeout:        cfg.Payment.Timeout,
		MaxConcurrency: cfg.Payment.MaxConcurrency,
		MaxRPS:         cfg.Payment.MaxRPS,
		TracerProvider: tp,
	}, m)
	defer payer.Close()
	horizon := billing.Horizon{Retention: cfg.Dedup.Retention, MaxFutureSkew: cfg.Dedup.MaxFutureSkew, ProviderWindow: cfg.Payment.IdempotencyWindow}
	processor := billing.NewProcessor(db, dedup.NewStore(cfg.Kafka.GroupID), payer, horizon, m, tp, log)
	proc.Store(processor)
	// The processor's writers outlive ctx: after SIGTERM the consumer's
	// drain still claims and settles what finishes in time. They stop once
	// the consumer is done.
	writersCtx, stopWriters := context.WithCancel(context.WithoutCancel(ctx))
	var writers sync.WaitGroup
	writers.Go(func() { processor.Run(writersCtx) })
	defer func() { stopWriters(); writers.Wait() }()
	// Charge attempts a crash left pending are completed by any replica,
	// and the pending and expired ones reported, whatever the consumer does.
	maintenance.Go(func() {
		every(ctx, recoverInterval(cfg.Payment.RecoverAfter), "charge attempt recovery", log, func(ctx context.Context) error {
			_, err := processor.Recover(ctx, cfg.Payment.RecoverAfter)
			return err
		})
	})

	// --- The outbox relay: payment outcome events to KAFKA_OUTCOME_TOPIC,
	// from whichever replica holds the relay lock.
	relayCfg, err := kafka.OutcomeProducerConfig(cfg.Kafka)
	if err != nil {
		return err
	}
	relayProducer, err := sarama.NewSyncProducer(cfg.Kafka.Brokers, relayCfg)
	if err != nil {
		return fmt.Errorf("outcome producer: %w", err)
	}
	defer relayProducer.Close()
	relay := outbox.NewRelay(db, relayProducer, cfg.Kafka.OutcomeTopic, m, log)
	relay.MaxBytes = min(sizes.outcome, kafka.OutcomeBatchBytes-512) // what the topic and the producer take, less the record's overhead
	maintenance.Go(func() { relay.Run(ctx) })
	c, err := kafka.NewConsumer(client, processor, parking, kafka.Options{
		Topic:              cfg.Kafka.Topic,
		Group:              cfg.Kafka.GroupID,
		MaxInFlight:        cfg.Consumer.MaxInFlight,
		MaxInFlightBytes:   cfg.Consumer.MaxInFlightBytes,
		DrainTimeout:       cfg.Consumer.DrainTimeout,
		CommitEveryMessage: cfg.Consumer.CommitEveryMessage,
		Positions:          dedup.NewPositions(db, cfg.Kafka.GroupID),
		ReplayWindow:       horizon.ProviderWindow,
	}, m, tp, log)
	if err != nil {
		return fmt.Errorf("consumer group: %w", err)
	}
	consumer.Store(c)

	var watch sync.WaitGroup
	watchCtx, stopWatch := context.WithCancel(ctx)
	watch.Go(func() { watchSession(watchCtx, c.Ready, log, brokers, cfg.Kafka.GroupID) })
	if err := c.Run(ctx); err != nil {
		log.Warn("consumer group close", "err", err)
	}
	stopWatch()
	watch.Wait()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return nil
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

// every runs job every interval until ctx is done. A failed run is logged
// and tried again at the next tick: maintenance that is late only delays
// work that stays recorded.
func every(ctx context.Context, interval time.Duration, what string, log *slog.Logger, job func(context.Context) error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := job(ctx); err != nil && ctx.Err() == nil {
			log.Warn(what+" failed; retrying at the next interval", "err", err, "interval", interval.String())
		}
	}
}

// recoverInterval is how often serve looks for charge attempts left pending:
// a quarter of the idle time it waits for, so that an orphan is completed
// soon after it qualifies, within [5s, 1m].
func recoverInterval(after time.Duration) time.Duration {
	return min(max(after/4, 5*time.Second), time.Minute)
}

func retentionText(l kafka.TopicLimits) string {
	if l.Forever {
		return "forever"
	}
	return l.Retention.String()
}
