package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
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
)

// serve runs the consumer and the HTTP server until ctx is done, then
// drains and returns nil.
func serve(ctx context.Context, args []string, environ map[string]string, logw io.Writer) error {
	if err := noArgs("serve", args); err != nil {
		return err
	}
	var cfg config.Serve
	if err := config.Load(environ, &cfg); err != nil {
		return err
	}
	log := newLogger(logw, cfg.LogLevel)
	log.Info("billing starting", "version", version, "config", cfg)

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

	// --- Kafka: the consumer's client and the dead-letter producer.
	client, err := connectKafka(ctx, cfg.Kafka, log)
	if err != nil || client == nil {
		return err
	}
	defer client.Close()
	producerCfg, err := kafka.ProducerConfig(cfg.Kafka)
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
		BaseURL:  cfg.Payment.BaseURL,
		APIKey:   cfg.Payment.APIKey,
		Timeout:  cfg.Payment.Timeout,
		MaxConns: cfg.Consumer.MaxInFlight,
	}, m)
	defer payer.Close()
	proc := billing.NewProcessor(db, dedup.NewStore(cfg.Kafka.GroupID), payer, m, log)
	c, err := kafka.NewConsumer(client, proc, dlq, kafka.Options{
		Topic:              cfg.Kafka.Topic,
		Group:              cfg.Kafka.GroupID,
		Lanes:              cfg.Consumer.Lanes,
		BatchMax:           cfg.Consumer.BatchMax,
		MaxInFlight:        cfg.Consumer.MaxInFlight,
		DrainTimeout:       cfg.Consumer.DrainTimeout,
		CommitEveryMessage: cfg.Consumer.CommitEveryMessage,
	}, m, log)
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
func connectKafka(ctx context.Context, k config.Kafka, log *slog.Logger) (sarama.Client, error) {
	cfg, err := kafka.ConsumerConfig(k)
	if err != nil {
		return nil, err
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
