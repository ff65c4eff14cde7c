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
	"slices"
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
	ready := server.Readiness{
		SchemaVersion: func(ctx context.Context) (int64, error) { return postgres.SchemaVersion(ctx, db) },
		Writable:      func(ctx context.Context) error { return postgres.CheckWritable(ctx, db) },
		WantSchema:    schema,
		Consumer: func() bool {
			c := consumer.Load()
			return c != nil && c.Ready()
		},
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stopHTTP, err := startHTTP(cfg.HTTPAddr, server.NewHandler(ready, reg, log), log, cancel)
	if err != nil {
		return err
	}
	defer stopHTTP()

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
	outcomeMaxBytes, err := awaitKafka(ctx, log, brokers, "the topics' settings", func() (int, error) {
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
	producerCfg, err := kafka.DLQProducerConfig(cfg.Kafka)
	if err != nil {
		return err
	}
	producer, err := awaitKafka(ctx, log, brokers, "the dead-letter producer's connection", func() (sarama.SyncProducer, error) {
		return sarama.NewSyncProducer(brokers, producerCfg)
	}, func(p sarama.SyncProducer) { _ = p.Close() })
	if err != nil {
		return ignoreStop(ctx, fmt.Errorf("dead-letter producer: %w", err))
	}
	dlq := kafka.NewDLQ(producer, cfg.Kafka.DLQTopic, cfg.Kafka.GroupID)
	defer dlq.Close()

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
	proc := billing.NewProcessor(db, dedup.NewStore(cfg.Kafka.GroupID), payer, horizon, m, tp, log)
	// Charge attempts a crash left pending are completed by any replica,
	// and the pending and expired ones reported, whatever the consumer does.
	maintenance.Go(func() {
		every(ctx, recoverInterval(cfg.Payment.RecoverAfter), "charge attempt recovery", log, func(ctx context.Context) error {
			_, err := proc.Recover(ctx, cfg.Payment.RecoverAfter)
			return err
		})
	})

	// --- The outbox relay: payment outcome events to KAFKA_OUTCOME_TOPIC,
	// from whichever replica holds the relay lock.
	relayCfg, err := kafka.ProducerConfig(cfg.Kafka)
	if err != nil {
		return err
	}
	relayProducer, err := sarama.NewSyncProducer(cfg.Kafka.Brokers, relayCfg)
	if err != nil {
		return fmt.Errorf("outcome producer: %w", err)
	}
	defer relayProducer.Close()
	relay := outbox.NewRelay(db, relayProducer, cfg.Kafka.OutcomeTopic, m, log)
	relay.MaxBytes = outcomeMaxBytes
	maintenance.Go(func() { relay.Run(ctx) })
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

// waitForSchema waits until the database answers, then checks that its
// schema is the one this binary needs (want). A refused password or a
// missing database is a configuration error and stops the process, and so
// does a schema older than want; a server that does not answer yet is
// waited for (readiness stays 503 meanwhile). It returns nil when ctx ends
// first.
func waitForSchema(ctx context.Context, db *sqlx.DB, want int64, log *slog.Logger) error {
	retry := backoff.NewExponentialBackOff()
	retry.MaxInterval = 10 * time.Second
	for {
		have, err := postgres.SchemaVersion(ctx, db)
		if err == nil {
			return checkSchema(have, want, log)
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

// checkSchema compares the database's schema version with the binary's.
func checkSchema(have, want int64, log *slog.Logger) error {
	switch {
	case have < want:
		// Every event would fail on a missing table or column and be
		// retried forever while /readyz said ready: refuse to start.
		return fmt.Errorf("the database schema is at version %d, this billing needs version %d: run `billing migrate` (of this version) first", have, want)
	case have > want:
		// A later version migrated the database and this binary was rolled
		// back. Migrations are additive (new tables, columns, indexes and
		// partitions; nothing an older binary uses is dropped or renamed),
		// so its queries still work: refusing to start would turn a
		// rollback into an outage.
		log.Warn("the database schema is newer than this binary (rolled back after a migration?); starting, since migrations are additive",
			"schema_version", have, "binary_schema_version", want)
	default:
		log.Info("database schema up to date", "schema_version", have)
	}
	return nil
}

// connectKafka connects to the brokers, waiting while none answers, until
// ctx ends.
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
		client, err := awaitKafka(ctx, log, k.Brokers, "an answer to the first metadata request (connecting)", func() (sarama.Client, error) {
			return sarama.NewClient(k.Brokers, cfg)
		}, func(c sarama.Client) { _ = c.Close() })
		if err == nil || ctx.Err() != nil {
			return client, err
		}
		wait := retry.NextBackOff()
		log.Warn("kafka unreachable; waiting", "brokers", k.Brokers, "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// Reports while waiting for Kafka: the first after firstReport, then at
// doubling intervals up to maxReport.
const (
	firstReport = 5 * time.Second
	maxReport   = time.Minute
)

// awaitKafka runs step, a call into sarama, and returns its answer. sarama's
// calls take no context, and one can wait for minutes on a broker that
// accepts connections and never answers (each request up to
// Net.ReadTimeout, per broker, per retry), so awaitKafka says what it is
// waiting for, on which brokers, after firstReport and then with backoff:
// a hang is never silent. When ctx ends first it returns ctx's error at
// once; step finishes in the background, and release (when not nil) frees
// what it made.
func awaitKafka[T any](ctx context.Context, log *slog.Logger, brokers []string, what string, step func() (T, error), release func(T)) (T, error) {
	type answer struct {
		v   T
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		v, err := step()
		answered <- answer{v, err}
	}()
	began := time.Now()
	every := firstReport
	report := time.NewTimer(every)
	defer report.Stop()
	for {
		select {
		case a := <-answered:
			return a.v, a.err
		case <-ctx.Done():
			if release != nil {
				go func() {
					if a := <-answered; a.err == nil {
						release(a.v)
					}
				}()
			}
			var zero T
			return zero, ctx.Err()
		case <-report.C:
			log.Warn("waiting for Kafka: no answer yet", "brokers", brokers, "waiting_for", what, "waited", time.Since(began))
			every = min(2*every, maxReport)
			report.Reset(every)
		}
	}
}

// watchSession says, after firstReport and then with backoff, that the
// consumer is waiting for a group session while it has none: joining can
// wait on a broker that does not answer, or on a rebalance that does not
// end, and /readyz alone would not say why.
func watchSession(ctx context.Context, ready func() bool, log *slog.Logger, brokers []string, group string) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var since time.Time // when the session was lost; zero while there is one
	next, gap := firstReport, firstReport
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			switch {
			case ready():
				since, next, gap = time.Time{}, firstReport, firstReport
			case since.IsZero():
				since = now
			case now.Sub(since) >= next:
				log.Warn("waiting for Kafka: no consumer group session yet", "brokers", brokers, "group", group, "waited", now.Sub(since))
				gap = min(2*gap, maxReport)
				next += gap
			}
		}
	}
}

// logStart says where the consumer group starts reading. A group without
// committed offsets starts at the oldest offset of every partition: the
// whole topic is processed again. processed_event is per group, so its
// events are claimed again; an order already charged is not charged twice
// (outcome already_charged), but every invalid message is parked in the
// dead-letter topic once more. A new KAFKA_GROUP_ID next to an existing
// one is a decision to make knowingly.
func logStart(client sarama.Client, k config.Kafka, log *slog.Logger) {
	committed, err := kafka.CommittedOffsets(client, k.GroupID, k.Topic)
	if err != nil {
		log.Warn("cannot read the consumer group's committed offsets", "group", k.GroupID, "err", err)
		return
	}
	var fresh []int32
	var reprocess int64
	for p, offset := range committed {
		if offset >= 0 {
			continue
		}
		fresh = append(fresh, p)
		oldest, err1 := client.GetOffset(k.Topic, p, sarama.OffsetOldest)
		newest, err2 := client.GetOffset(k.Topic, p, sarama.OffsetNewest)
		if err1 == nil && err2 == nil {
			reprocess += newest - oldest
		}
	}
	slices.Sort(fresh)
	switch {
	case len(fresh) == 0:
		log.Info("consumer group resumes from its committed offsets", "group", k.GroupID, "topic", k.Topic)
	case len(fresh) == len(committed) && reprocess == 0:
		log.Info("new consumer group: it starts from the oldest offset of the topic, which holds no message", "group", k.GroupID, "topic", k.Topic)
	case len(fresh) == len(committed):
		log.Warn("new consumer group: it starts from the oldest offset, so every message on the topic is processed; if another group processed them already, orders already charged are not charged again, but invalid messages are parked in the dead-letter topic again",
			"group", k.GroupID, "topic", k.Topic, "messages", reprocess)
	default:
		log.Info("consumer group resumes from its committed offsets; partitions without one start from their oldest offset",
			"group", k.GroupID, "topic", k.Topic, "from_oldest", fresh, "messages", reprocess)
	}
}

// checkTopics derives the dedup horizon from the broker instead of guessing
// it: when the topic keeps messages longer than DEDUP_RETENTION remembers
// them, a redelivery of an old message could no longer be recognised as a
// duplicate (billing parks it as stale-event rather than charging it, but a
// replay would then fill the DLQ). serve refuses to start unless the operator
// accepts that with DEDUP_ALLOW_SHORT_RETENTION.
func checkTopics(client sarama.Client, cfg config.Serve, m *metrics.Metrics, log *slog.Logger) (outcomeMaxBytes int, err error) {
	// The admin shares the client; closing it would close the client.
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return 0, fmt.Errorf("kafka admin: %w", err)
	}
	// The outcome topic bounds the relay's values: a row larger than it
	// takes is dead rather than retried for ever.
	outcomeMaxBytes = 1 << 20
	if out, err := kafka.DescribeTopic(admin, cfg.Kafka.OutcomeTopic); err != nil {
		log.Error("cannot read the outcome topic; payment outcome events wait in the outbox until it exists",
			"topic", cfg.Kafka.OutcomeTopic, "err", err)
	} else {
		outcomeMaxBytes = out.MaxMessageBytes - 512 // the record's key, headers and framing
	}
	src, err := kafka.DescribeTopic(admin, cfg.Kafka.Topic)
	if err != nil {
		log.Warn("cannot read the topic's retention; the dedup horizon is unchecked", "topic", cfg.Kafka.Topic, "err", err)
		return outcomeMaxBytes, nil
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
			return 0, fmt.Errorf("config: DEDUP_RETENTION: %s; raise it, or set DEDUP_ALLOW_SHORT_RETENTION=true to accept this", msg)
		}
		log.Error(msg + "; starting anyway because DEDUP_ALLOW_SHORT_RETENTION=true")
	}
	if dlq, err := kafka.DescribeTopic(admin, cfg.Kafka.DLQTopic); err != nil {
		log.Warn("cannot read the dead-letter topic's settings", "topic", cfg.Kafka.DLQTopic, "err", err)
	} else if dlq.MaxMessageBytes < src.MaxMessageBytes {
		log.Warn("the dead-letter topic accepts smaller messages than the source topic; a large invalid message could not be parked and would hold its partition",
			"dlq_max_message_bytes", dlq.MaxMessageBytes, "topic_max_message_bytes", src.MaxMessageBytes)
	}
	return outcomeMaxBytes, nil
}

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
