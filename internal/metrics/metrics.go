// Package metrics defines billing's Prometheus collectors in one place.
//
// Their names and labels are part of billing's interface contract: operators'
// dashboards and alerts depend on them, so they live together here rather than
// scattered through the packages that update them. Collectors are registered
// into a caller-supplied registry, never the global one, so that every test and
// every in-process service gets its own.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Outcome labels of billing_events_total. Every consumed message is counted
// exactly once, under one of these, after its transaction committed or its
// dead-letter write was acknowledged.
const (
	OutcomeCharged        = "charged"
	OutcomeDuplicate      = "duplicate"
	OutcomeAlreadyCharged = "already_charged"
	OutcomeDeclined       = "declined"
	OutcomeInvalid        = "invalid"
)

// latencyBuckets are dense enough (about 1.5× apart) for a p99 read from
// them to be within a third of the truth, from 1 ms to an hour.
var latencyBuckets = []float64{.001, .0025, .005, .0075, .01, .015, .025, .035, .05, .075, .1, .15, .2, .3, .5, .75,
	1, 1.5, 2, 3, 5, 7.5, 10, 15, 20, 30, 60, 120, 300, 900, 3600}

// Metrics holds every collector billing updates.
type Metrics struct {
	// Events counts finished messages by outcome (billing_events_total).
	Events *prometheus.CounterVec
	// DLQ counts messages parked in the dead-letter topic by reason code.
	DLQ *prometheus.CounterVec
	// Processing observes the time from taking a message off its partition
	// to its commit (or dead-letter acknowledgement), retries included.
	Processing prometheus.Histogram
	// EndToEnd observes the time from the event's occurredAt to its commit:
	// what a customer waits for, producer and queueing delay included.
	EndToEnd prometheus.Histogram
	// PaymentRequests counts provider calls by classified result.
	PaymentRequests *prometheus.CounterVec
	// PaymentReplays counts provider answers marked as replayed from the
	// provider's idempotency store (Stripe's Idempotent-Replayed: true): a
	// request billing sent before, whose answer it lost or did not settle.
	PaymentReplays prometheus.Counter
	// PaymentLookups counts the provider lookups of attempts whose outcome
	// billing does not know (in progress, indeterminate, past the window),
	// by what the provider said (succeeded, declined, rejected,
	// in_progress, unknown, error).
	PaymentLookups *prometheus.CounterVec
	// Webhooks counts the provider's notifications by what billing did
	// with them: settled (an outcome recorded), no_news (known already, or
	// of an event billing does not act on), refused (the signature did not
	// verify: 400), failed (not committed: the provider sends it again).
	Webhooks *prometheus.CounterVec
	// PaymentSeconds observes provider call latency.
	PaymentSeconds prometheus.Histogram
	// PaymentInFlight is the number of provider requests holding one of
	// the client's PAYMENT_MAX_CONCURRENCY slots (sent, or waiting for the
	// rate limit or a 429 pause).
	PaymentInFlight prometheus.Gauge
	// PaymentRateLimited counts the provider's 429s, to charges and
	// lookups alike (billing_payment_requests_total{result="rate_limited"}
	// counts the charges' only): what the fleet's shared budget shrinks by.
	PaymentRateLimited prometheus.Counter
	// AccountShare is the share of the provider account's budget
	// (PAYMENT_ACCOUNT_MAX_RPS) this replica may use now, in requests per
	// second; AccountBudget the budget in force for the whole group as of
	// its last renewal (lower than PAYMENT_ACCOUNT_MAX_RPS after 429s).
	AccountShare  prometheus.Gauge
	AccountBudget prometheus.Gauge
	// ChargingPaused is 1 while this replica applies an operator's pause
	// of charging (billing pause), ChargingPausedSeconds how long the
	// group has been paused, by the database's clock.
	ChargingPaused        prometheus.Gauge
	ChargingPausedSeconds prometheus.Gauge
	// Transaction observes how long each database transaction of the
	// pipeline was open, by phase (claim, settle, recover): none of them
	// spans a provider call, so they stay short whatever the provider does.
	Transaction *prometheus.HistogramVec
	// DBErrors counts pipeline transactions that failed, by the SQLSTATE
	// the server answered (53100: disk full) or "none" when it did not
	// answer (unreachable, a connection lost).
	DBErrors *prometheus.CounterVec
	// AttemptsPending is the number of charge attempts waiting for a
	// provider answer to be recorded, AttemptsOldestPending the age of the
	// oldest, and AttemptsExpired those older than the provider's
	// idempotency window: never retried blindly, they need a human.
	AttemptsPending       prometheus.Gauge
	AttemptsOldestPending prometheus.Gauge
	AttemptsExpired       prometheus.Gauge
	// AttemptsInProgress is the number of charge attempts the provider
	// holds without a verdict (in_progress), AttemptsOldestInProgress the
	// age of the oldest; AttemptsUnresolved those whose outcome the
	// provider cannot tell (no payment found and the key forgotten): they
	// need a human.
	AttemptsInProgress       prometheus.Gauge
	AttemptsOldestInProgress prometheus.Gauge
	AttemptsUnresolved       prometheus.Gauge
	// AttemptsRecovered counts attempts maintenance found left pending, by
	// what became of them (succeeded, declined, rejected, unanswered).
	AttemptsRecovered *prometheus.CounterVec

	// OutboxPending is the number of payment outcome events recorded and
	// not yet published, OutboxOldestPending the age of the oldest, and
	// OutboxDead those the relay cannot publish (set by the relaying
	// replica only). OutboxPublished counts published events by type,
	// OutboxErrors failed publications that will be retried.
	OutboxPending       prometheus.Gauge
	OutboxOldestPending prometheus.Gauge
	OutboxDead          prometheus.Gauge
	OutboxPublished     *prometheus.CounterVec
	OutboxErrors        prometheus.Counter
	// Lag is the partition's last stable offset (the end a read_committed
	// consumer can reach) minus the group's committed offset, for each
	// partition this instance owns.
	Lag *prometheus.GaugeVec
	// StableOffsetHeld is, per owned partition, how long its last stable
	// offset has stood still below its high-water mark: a transaction open
	// that long holds back every later record of the partition.
	StableOffsetHeld *prometheus.GaugeVec
	// Retries counts retried attempts by cause (database, payment, dlq).
	Retries *prometheus.CounterVec
	// Retrying is the number of messages waiting for a retry of their key.
	Retrying prometheus.Gauge
	// HeartbeatAge is the time since the group coordinator last confirmed
	// this process's membership (package consumer's membership); past the
	// session timeout the process starts no new work.
	HeartbeatAge prometheus.Gauge
	// Generation is the consumer group's generation this member's session
	// is in, read every second: it grows at every rebalance, so a pause
	// of charging, which must cause none, leaves it as it was.
	Generation prometheus.Gauge
	// Rewinds counts partitions consumed again because the database lost
	// commits (its position was behind what billing saved),
	// RewoundMessages the messages consumed again.
	Rewinds, RewoundMessages prometheus.Counter
	// Rebalances counts partitions assigned and revoked.
	Rebalances *prometheus.CounterVec
	// Batch observes how many events share one database transaction.
	Batch prometheus.Histogram
	// ClaimedEventAge is the age of the oldest event of the latest claim:
	// how far behind the events being charged are.
	ClaimedEventAge prometheus.Gauge

	// DedupPartitions is the number of processed_event partitions.
	DedupPartitions prometheus.Gauge
	// DedupOldestPartitionAge is the age of the oldest partition's day.
	DedupOldestPartitionAge prometheus.Gauge
	// DedupPartitionsDropped counts partitions dropped by retention.
	DedupPartitionsDropped prometheus.Counter
	// DedupRetentionShortfall is how much longer the broker can redeliver
	// an event than the dedup store remembers it (0 when it cannot).
	DedupRetentionShortfall prometheus.Gauge
}

// New creates billing's collectors and registers them with reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_events_total",
			Help: "Consumed order.confirmed events by outcome, counted once each after commit or DLQ acknowledgement.",
		}, []string{"outcome"}),
		DLQ: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_dlq_messages_total",
			Help: "Messages parked in the dead-letter topic, by reason code.",
		}, []string{"reason"}),
		Processing: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "billing_event_processing_seconds",
			Help:    "Time from taking a message off its partition to its commit or DLQ acknowledgement, retries included.",
			Buckets: latencyBuckets,
		}),
		EndToEnd: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "billing_event_latency_seconds",
			Help:    "Time from the event's occurredAt to its commit.",
			Buckets: latencyBuckets,
		}),
		PaymentRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_payment_requests_total",
			Help: "Payment provider requests by result.",
		}, []string{"result"}),
		PaymentReplays: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "billing_payment_replays_total",
			Help: "Provider answers replayed from its idempotency store (Idempotent-Replayed): requests sent again under the same key.",
		}),
		PaymentLookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_payment_lookups_total",
			Help: "Lookups at the provider of charge attempts whose outcome is unknown (in progress, indeterminate, past the idempotency window), by what the provider said.",
		}, []string{"result"}),
		Webhooks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_webhooks_total",
			Help: "Provider notifications received on WEBHOOK_ADDR, by what billing did with them (settled, no_news, refused, failed).",
		}, []string{"result"}),
		PaymentSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "billing_payment_request_seconds",
			Help:    "Payment provider request latency.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		PaymentInFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "billing_payment_requests_in_flight",
			Help: "Provider requests holding a PAYMENT_MAX_CONCURRENCY slot (sent, or waiting for PAYMENT_MAX_RPS or a 429 pause).",
		}),
		PaymentRateLimited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "billing_payment_rate_limited_total",
			Help: "Provider answers 429 (rate limited), to charges and lookups alike; each shrinks the fleet's shared budget (PAYMENT_ACCOUNT_MAX_RPS).",
		}),
		AccountShare: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "billing_payment_account_share",
			Help: "Requests per second of the provider account's shared budget this replica may send now (0: none, or its lease lapsed; with PAYMENT_ACCOUNT_MAX_RPS=0, always 0).",
		}),
		AccountBudget: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "billing_payment_account_budget",
			Help: "Requests per second the whole consumer group may send to the provider account, as of this replica's last renewal: PAYMENT_ACCOUNT_MAX_RPS, less what 429s took (0: no shared budget).",
		}),
		ChargingPaused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "billing_charging_paused",
			Help: "1 while this replica applies an operator's pause of charging (billing pause): no request that could create a payment is sent and fetching is paused, without leaving the group.",
		}),
		ChargingPausedSeconds: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "billing_charging_paused_seconds",
			Help: "How long the consumer group's charging has been paused (billing pause), by the database's clock; 0 when it is not.",
		}),
		Transaction: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "billing_db_transaction_seconds",
			Help:    "Time each pipeline database transaction was open, by phase (claim, settle, recover); none spans a provider call.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"phase"}),
		DBErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_db_errors_total",
			Help: "Pipeline database transactions that failed and will be retried, by SQLSTATE (53100 disk full, 25006 read-only; none: no answer from the server).",
		}, []string{"sqlstate"}),
		AttemptsPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "billing_charge_attempts_pending",
			Help: "Charge attempts recorded before their provider call whose answer is not recorded yet (read by maintenance).",
		}),
		AttemptsOldestPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "billing_charge_attempts_oldest_pending_seconds",
			Help: "Age of the oldest pending charge attempt (0 when none).",
		}),
		AttemptsExpired: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "billing_charge_attempts_expired",
			Help: "Pending charge attempts older than PAYMENT_IDEMPOTENCY_WINDOW: never retried blindly; reconcile them by hand.",
		}),
		AttemptsInProgress: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "billing_charge_attempts_in_progress",
			Help: "Charge attempts the provider accepted without a verdict yet (in_progress): settled by its webhook or by a lookup.",
		}),
		AttemptsOldestInProgress: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "billing_charge_attempts_oldest_in_progress_seconds",
			Help: "Age of the oldest in_progress charge attempt (0 when none).",
		}),
		AttemptsUnresolved: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "billing_charge_attempts_unresolved",
			Help: "Charge attempts whose outcome the provider cannot tell (no payment found and the idempotency key forgotten): they need a human (docs/operations.md).",
		}),
		AttemptsRecovered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_charge_attempts_recovered_total",
			Help: "Charge attempts left pending that maintenance completed, by result.",
		}, []string{"result"}),
		OutboxPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "billing_outbox_pending",
			Help: "Payment outcome events recorded and not yet published (reported by the relaying replica; 0 on the others).",
		}),
		OutboxOldestPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "billing_outbox_oldest_pending_seconds",
			Help: "Age of the oldest unpublished payment outcome event (0 when none; reported by the relaying replica).",
		}),
		OutboxDead: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "billing_outbox_dead",
			Help: "Outbox rows the relay cannot publish (invalid or oversized values): skipped, for a human (reported by the relaying replica).",
		}),
		OutboxPublished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_outbox_published_total",
			Help: "Payment outcome events published to KAFKA_OUTCOME_TOPIC, by event type.",
		}, []string{"event_type"}),
		OutboxErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "billing_outbox_publish_errors_total",
			Help: "Payment outcome events whose publication failed and will be retried.",
		}),
		Lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "billing_consumer_lag",
			Help: "Last stable offset (the end a read_committed consumer reaches; the high-water mark when no transaction is open) minus committed offset, per owned partition.",
		}, []string{"partition"}),
		ClaimedEventAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "billing_claimed_event_age_seconds",
			Help: "Age (now minus the time in its eventId) of the oldest event of the latest claim transaction: how far behind the events being charged are, days while a backlog or a replay of old events is worked off.",
		}),
		StableOffsetHeld: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "billing_consumer_stable_offset_held_seconds",
			Help: "How long the partition's last stable offset has stood still below its high-water mark: a producer's transaction open that long holds back every later record of the partition (0 when none is held).",
		}, []string{"partition"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_retries_total",
			Help: "Attempts that failed for a reason outside the event and will be retried, by cause.",
		}, []string{"cause"}),
		Retrying: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "billing_messages_retrying",
			Help: "Messages held for retry: those that failed for a reason outside the event and wait to be tried again, and the later messages of their keys waiting behind them.",
		}),
		HeartbeatAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "billing_consumer_heartbeat_age_seconds",
			Help: "Time since the group coordinator last confirmed this member; past the session timeout (cut off from the brokers) the member starts no new work.",
		}),
		Generation: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "billing_consumer_group_generation",
			Help: "The consumer group's generation this member's session is in (every rebalance raises it, a cooperative one without a new session); 0 before the first session.",
		}),
		Rewinds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "billing_consumer_rewinds_total",
			Help: "Partitions consumed again from the database's position because the database lost commits billing saw acknowledged (a failover to an asynchronous standby, a restored backup).",
		}),
		RewoundMessages: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "billing_consumer_rewound_messages_total",
			Help: "Messages consumed again after the database lost commits.",
		}),
		Rebalances: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_partitions_rebalanced_total",
			Help: "Partitions assigned to or revoked from this instance.",
		}, []string{"change"}),
		Batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "billing_transaction_events",
			Help:    "Events committed per database transaction.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64},
		}),
		DedupPartitions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "billing_dedup_partitions",
			Help: "Daily partitions of processed_event present.",
		}),
		DedupOldestPartitionAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "billing_dedup_oldest_partition_age_seconds",
			Help: "Age of the oldest processed_event partition's day.",
		}),
		DedupPartitionsDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "billing_dedup_partitions_dropped_total",
			Help: "processed_event partitions dropped by retention.",
		}),
		DedupRetentionShortfall: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "billing_dedup_retention_shortfall_seconds",
			Help: "How much longer the topic keeps messages than DEDUP_RETENTION remembers them (+Inf: the topic keeps them forever); 0 is safe.",
		}),
	}
	reg.MustRegister(m.Events, m.DLQ, m.Processing, m.EndToEnd, m.PaymentRequests,
		m.PaymentReplays, m.PaymentLookups, m.Webhooks, m.AttemptsInProgress, m.AttemptsOldestInProgress, m.AttemptsUnresolved,
		m.PaymentSeconds, m.PaymentInFlight, m.PaymentRateLimited, m.AccountShare, m.AccountBudget, m.ChargingPaused, m.ChargingPausedSeconds, m.Transaction, m.DBErrors, m.AttemptsPending, m.AttemptsOldestPending,
		m.AttemptsExpired, m.AttemptsRecovered, m.OutboxPending, m.OutboxOldestPending, m.OutboxDead,
		m.OutboxPublished, m.OutboxErrors, m.Lag, m.StableOffsetHeld, m.Retries, m.Retrying, m.HeartbeatAge, m.Generation, m.Rewinds, m.RewoundMessages, m.Rebalances, m.Batch, m.ClaimedEventAge,
		m.DedupPartitions, m.DedupOldestPartitionAge, m.DedupPartitionsDropped, m.DedupRetentionShortfall)
	// Pre-create the outcome series so a dashboard shows zeros, not gaps, and
	// rate() works from the first event.
	for _, o := range []string{OutcomeCharged, OutcomeDuplicate, OutcomeAlreadyCharged, OutcomeDeclined, OutcomeInvalid} {
		m.Events.WithLabelValues(o)
	}
	return m
}
