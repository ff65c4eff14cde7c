package main

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel/trace"

	"example.com/billing/internal/billing"
	"example.com/billing/internal/config"
	"example.com/billing/internal/dedup"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/outbox"
	"example.com/billing/internal/payment"
	"example.com/billing/internal/payment/adyen"
	"example.com/billing/internal/payment/contract"
	"example.com/billing/internal/payment/stripe"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/schema"
)

// maintenance is billing's upkeep of its tables, besides consuming: the
// daily partitions of processed_event and of the outbox (created ahead,
// the expired ones dropped) and the charge attempts left pending
// (completed, and those past the provider's window reported). serve runs
// it on a schedule (schedule), maintain once (once): both build it here,
// so that they keep the same tables by the same settings. Leases (a
// table's, in billing_lease; an attempt's, its updated_at) let several
// maintainers run at once.
type maintenance struct {
	db      *sqlx.DB
	dedup   *dedup.Retention
	outbox  *outbox.Retention
	attempt *billing.Recoverer
	// idle is how long an attempt stays pending with nobody working on it
	// before it is completed (PAYMENT_RECOVER_AFTER).
	idle time.Duration
	log  *slog.Logger
}

// newMaintenance returns the upkeep of db's tables: processed_event kept
// for dedupRetention, published outcomes for outboxRetention, parts.Ahead
// days of partitions ahead in both, and the attempts recoverer completes
// once idle for idle.
func newMaintenance(db *sqlx.DB, dedupRetention config.DedupRetention, outboxRetention config.Outbox, parts config.Partitions,
	recoverer *billing.Recoverer, idle time.Duration, m *metrics.Metrics, log *slog.Logger) *maintenance {
	return &maintenance{
		db:      db,
		dedup:   dedup.NewRetention(db, dedupRetention.Retention, parts.Ahead, m, log),
		outbox:  outbox.NewRetention(db, outboxRetention.Retention, parts.Ahead, log),
		attempt: recoverer,
		idle:    idle,
		log:     log,
	}
}

// maintenanceReport is what one run of the whole upkeep did: what
// billing maintain prints.
type maintenanceReport struct {
	dedup.Report
	Outbox   outbox.RetentionReport `json:"outbox"`
	Attempts billing.RecoveryReport `json:"chargeAttempts"`
	// ReplicasForgotten counts the records of replicas gone for longer
	// than replicaMemory that were removed (by the owner's maintain).
	ReplicasForgotten int64 `json:"replicasForgotten"`
}

// replicaMemory is how long the record of a replica that stopped or went
// quiet is kept for billing migrate status's reader.
const replicaMemory = 7 * 24 * time.Hour

// retention runs the retention of processed_event and of the outbox; a
// failure of one does not keep the other from running.
func (mt *maintenance) retention(ctx context.Context) (maintenanceReport, error) {
	var rep maintenanceReport
	var err, oerr error
	rep.Report, err = mt.dedup.Run(ctx)
	rep.Outbox, oerr = mt.outbox.Run(ctx)
	var ferr error
	// serve's runtime role may not delete: the owner's maintain does.
	if rep.ReplicasForgotten, ferr = schema.Forget(ctx, mt.db, replicaMemory); postgres.SQLState(ferr) == "42501" {
		ferr = nil
	}
	return rep, errors.Join(err, oerr, ferr)
}

// recoverAttempts completes the charge attempts idle for long enough and
// reports the pending and the expired ones.
func (mt *maintenance) recoverAttempts(ctx context.Context) (billing.RecoveryReport, error) {
	return mt.attempt.Recover(ctx, mt.idle)
}

// once runs the whole upkeep: the retention, then the charge attempts.
func (mt *maintenance) once(ctx context.Context) (maintenanceReport, error) {
	rep, err := mt.retention(ctx)
	if err != nil {
		return rep, err
	}
	rep.Attempts, err = mt.recoverAttempts(ctx)
	return rep, err
}

// schedule runs the retention every interval and the charge attempts'
// recovery every recoverInterval, in wg, until ctx is done.
func (mt *maintenance) schedule(ctx context.Context, wg *sync.WaitGroup, interval time.Duration) {
	wg.Go(func() {
		every(ctx, interval, nil, "partition maintenance", mt.log, func(ctx context.Context) error {
			_, err := mt.retention(ctx)
			return err
		})
	})
	wg.Go(func() {
		every(ctx, recoverInterval(mt.idle), mt.attempt.Woken(), "charge attempt recovery", mt.log, func(ctx context.Context) error {
			_, err := mt.recoverAttempts(ctx)
			return err
		})
	})
}

// every runs job every interval, and whenever wake is signalled (nil:
// never), until ctx is done. A failed run is logged and tried again at the
// next tick: maintenance that is late only delays work that stays
// recorded.
func every(ctx context.Context, interval time.Duration, wake <-chan struct{}, what string, log *slog.Logger, job func(context.Context) error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-wake:
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

// newPayer returns the provider's client of serve, maintain and
// reconcile, from the provider's settings they read; shared when it sends
// within a share of the account's budget (serve with
// PAYMENT_ACCOUNT_MAX_RPS); tp traces its calls (nil: none).
func newPayer(api config.API, shared bool, tp trace.TracerProvider, m *metrics.Metrics) *payment.Client {
	cfg := payment.Config{
		Timeout:        api.Timeout,
		MaxConcurrency: api.MaxConcurrency,
		MaxRPS:         api.MaxRPS,
		AccountShared:  shared,
		TracerProvider: tp,
		Wallet:         walletOf(api.Provider),
	}
	var proto payment.Protocol
	switch api.Provider {
	case config.ProviderStripe:
		proto = stripe.New(api.BaseURL, api.APIKey)
	case config.ProviderAdyen:
		proto = adyen.New(api.BaseURL, api.APIKey, api.MerchantAccount, api.IdempotencyWindow)
	default:
		proto = contract.New(api.BaseURL, api.APIKey)
	}
	return payment.New(proto, cfg, m)
}

// walletOf is the provider whose saved payment methods the requests
// charge (payment_method.provider): Stripe's and Adyen's requests charge a
// stored card, the contract's a customer id.
func walletOf(provider string) string {
	if provider == config.ProviderContract {
		return ""
	}
	return provider
}

// webhookOf is the provider's notifications' reader, verifying with
// PAYMENT_WEBHOOK_SECRET; nil when the contract has no secret (its webhook
// is off). Adyen's items that do not verify in a batch that is taken are
// counted as refused and logged.
func webhookOf(cfg config.Serve, m *metrics.Metrics, log *slog.Logger) payment.Webhook {
	secrets := cfg.Webhooks.Secrets
	switch {
	case cfg.Payment.Provider == config.ProviderStripe:
		return stripe.Webhook{Secrets: secrets}
	case cfg.Payment.Provider == config.ProviderAdyen:
		return adyen.Webhook{Keys: secrets, MerchantAccount: cfg.Payment.MerchantAccount,
			Ignored: func(pspReference string, err error) {
				m.Webhooks.WithLabelValues("refused").Inc()
				log.Warn("ignored an Adyen notification item that does not verify; the rest of its batch is taken",
					"provider", cfg.Payment.Provider, "psp_reference", pspReference, "err", err)
			}}
	case len(secrets) > 0:
		return contract.Webhook{Secrets: secrets}
	}
	return nil
}
