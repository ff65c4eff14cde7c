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
	"github.com/cenkalti/backoff/v5"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"example.com/billing/internal/billing"
	"example.com/billing/internal/config"
	"example.com/billing/internal/dedup"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/metrics"
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

	// --- HTTP first, so that liveness answers while dependencies come up.
	var consumer atomic.Pointer[kafka.Consumer]
	ready := server.Readiness{DB: db, Consumer: func() bool {
		c := consumer.Load()
		return c != nil && c.Ready()
	}}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stopHTTP, err := startHTTP(cfg.HTTPAddr, server.NewHandler(ready, reg, log), log, cancel)
	if err != nil {
		return err
	}
	defer stopHTTP()

	if err := waitForDatabase(ctx, db, log); err != nil {
		return err
	}

	// --- Dedup retention: partitions ahead, expired ones dropped. One
	// replica of many does the work (advisory lock); the others skip.
	retention := dedup.NewRetention(db, cfg.Dedup.Retention, cfg.Dedup.PartitionsAhead, m, log)
	if _, err := retention.Run(ctx); err != nil {
		log.Warn("dedup maintenance failed at start; the consumer creates missing partitions itself", "err", err)
	}
	var maintenance sync.WaitGroup
	defer func() { cancel(nil); maintenance.Wait() }() // stopped before the pool closes under it
	maintenance.Go(func() { retention.Every(ctx, cfg.Dedup.MaintenanceInterval) })

	// --- Kafka: the consumer's client and the dead-letter producer.
	client, err := connectKafka(ctx, cfg.Kafka, cfg.Consumer, log)
	if err != nil || client == nil {
		return err
	}
	defer client.Close()
	if err := checkTopics(client, cfg, m, log); err != nil {
		return err
	}
	producerCfg, err := kafka.DLQProducerConfig(cfg.Kafka)
	if err != nil {
		return err
	}
	producer, err := sarama.NewSyncProducer(cfg.Kafka.Brokers, producerCfg)
	if err != nil {
		return fmt.Errorf("dead-letter producer: %w", err)
	}
	dlq := kafka.NewDLQ(producer, cfg.Kafka.DLQTopic, cfg.Kafka.GroupID)
	defer dlq.Close()

	// --- The pipeline: payment client, processor, consumer.
	payer := payment.New(payment.Config{
		BaseURL: cfg.Payment.BaseURL,
		APIKey:  cfg.Payment.APIKey,
		Timeout: cfg.Payment.Timeout,
		// At most one transaction per connection, each calling the
		// provider for up to a batch of events at once.
		MaxConns:       cfg.Database.MaxConns * cfg.Consumer.BatchMax,
		TracerProvider: tp,
	}, m)
	defer payer.Close()
	horizon := billing.Horizon{Retention: cfg.Dedup.Retention, MaxFutureSkew: cfg.Dedup.MaxFutureSkew}
	proc := billing.NewProcessor(db, dedup.NewStore(cfg.Kafka.GroupID), payer, horizon, m, tp, log)
	c, err := kafka.NewConsumer(client, proc, dlq, kafka.Options{
		Topic:              cfg.Kafka.Topic,
		Group:              cfg.Kafka.GroupID,
		Lanes:              cfg.Consumer.Lanes,
		BatchMax:           cfg.Consumer.BatchMax,
		MaxInFlight:        cfg.Consumer.MaxInFlight,
		DrainTimeout:       cfg.Consumer.DrainTimeout,
		CommitEveryMessage: cfg.Consumer.CommitEveryMessage,
	}, m, tp, log)
	if err != nil {
		return fmt.Errorf("consumer group: %w", err)
	}
	consumer.Store(c)

	if err := c.Run(ctx); err != nil {
		log.Warn("consumer group close", "err", err)
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	log.Info("billing stopped")
	return nil
}

// startHTTP serves handler on addr. A server that fails later cancels ctx
// through fail. The returned function shuts the server down.
func startHTTP(addr string, handler http.Handler, log *slog.Logger, fail context.CancelCauseFunc) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("HTTP_ADDR: %w", err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	log.Info("http listening", "addr", ln.Addr().String())
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

// waitForDatabase waits until the database answers. A refused password or a
// missing database is a configuration error and stops the process; a server
// that does not answer yet is waited for (readiness stays 503 meanwhile).
func waitForDatabase(ctx context.Context, db *sqlx.DB, log *slog.Logger) error {
	retry := backoff.NewExponentialBackOff()
	retry.MaxInterval = 10 * time.Second
	for {
		err := db.PingContext(ctx)
		if err == nil {
			return nil
		}
		if postgres.IsConfigError(err) {
			return fmt.Errorf("DATABASE_URL: %w", err)
		}
		if ctx.Err() != nil {
			return nil
		}
		wait := retry.NextBackOff()
		log.Warn("database unreachable; waiting", "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// connectKafka connects to the brokers, waiting while none answers. It
// returns a nil client and no error when ctx ends first.
func connectKafka(ctx context.Context, k config.Kafka, c config.Consumer, log *slog.Logger) (sarama.Client, error) {
	cfg, err := kafka.ConsumerConfig(k)
	if err != nil {
		return nil, err
	}
	if c.CommitEveryMessage {
		// sarama sends one request at a time per broker connection, so a
		// synchronous commit waits behind the fetch long-poll (up to
		// MaxWaitTime, 500 ms) when the coordinator leads the partitions
		// too. Polling briefly keeps that wait from dominating the
		// commit-per-message mode.
		cfg.Consumer.MaxWaitTime = 10 * time.Millisecond
	}
	retry := backoff.NewExponentialBackOff()
	retry.MaxInterval = 10 * time.Second
	for {
		client, err := sarama.NewClient(k.Brokers, cfg)
		if err == nil {
			return client, nil
		}
		wait := retry.NextBackOff()
		log.Warn("kafka unreachable; waiting", "brokers", k.Brokers, "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(wait):
		}
	}
}

// checkTopics derives the dedup horizon from the broker instead of guessing
// it: when the topic keeps messages longer than DEDUP_RETENTION remembers
// them, a redelivery of an old message could no longer be recognised as a
// duplicate (billing parks it as stale-event rather than charging it, but a
// replay would then fill the DLQ). serve refuses to start unless the operator
// accepts that with DEDUP_ALLOW_SHORT_RETENTION.
func checkTopics(client sarama.Client, cfg config.Serve, m *metrics.Metrics, log *slog.Logger) error {
	// The admin shares the client; closing it would close the client.
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return fmt.Errorf("kafka admin: %w", err)
	}
	src, err := kafka.DescribeTopic(admin, cfg.Kafka.Topic)
	if err != nil {
		log.Warn("cannot read the topic's retention; the dedup horizon is unchecked", "topic", cfg.Kafka.Topic, "err", err)
		return nil
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
			return fmt.Errorf("config: DEDUP_RETENTION: %s; raise it, or set DEDUP_ALLOW_SHORT_RETENTION=true to accept this", msg)
		}
		log.Error(msg + "; starting anyway because DEDUP_ALLOW_SHORT_RETENTION=true")
	}
	if dlq, err := kafka.DescribeTopic(admin, cfg.Kafka.DLQTopic); err != nil {
		log.Warn("cannot read the dead-letter topic's settings", "topic", cfg.Kafka.DLQTopic, "err", err)
	} else if dlq.MaxMessageBytes < src.MaxMessageBytes {
		log.Warn("the dead-letter topic accepts smaller messages than the source topic; a large invalid message could not be parked and would hold its partition",
			"dlq_max_message_bytes", dlq.MaxMessageBytes, "topic_max_message_bytes", src.MaxMessageBytes)
	}
	return nil
}

func retentionText(l kafka.TopicLimits) string {
	if l.Forever {
		return "forever"
	}
	return l.Retention.String()
}
