package billing

import (
	"context"
	"fmt"
	"sync"
	"time"

	"example.com/billing/internal/charge"
	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
)

// RecoveryReport says what one Recover run found and did.
type RecoveryReport struct {
	// Pending is the number of attempts pending when the run started, the
	// oldest of them created OldestPending ago.
	Pending       int           `json:"pending"`
	OldestPending time.Duration `json:"oldestPending"`
	// Expired lists pending attempts older than the provider's idempotency
	// window: never retried blindly, they wait for a human.
	Expired []uuid.UUID `json:"expired"`
	// Completed counts the attempts this run completed, by recorded status
	// (succeeded, declined, rejected); Unanswered those the provider still
	// did not answer (they are tried again at a later run).
	Completed  map[string]int `json:"completed"`
	Unanswered int            `json:"unanswered"`
}

// recoverBatch bounds the attempts one run takes on.
const recoverBatch = 500

// maxExpiredListed bounds the expired attempts one run lists and logs.
const maxExpiredListed = 100

// Recover completes charge attempts left pending: those nobody has worked
// on for idle (a consumer crashed after the claim, or the event was parked
// before its attempt was answered). It asks the provider again under the
// same key and body and settles the answer, as the event's own consumer
// would. Several replicas may run it at once: each first takes its
// attempts by touching them in a short transaction, and the others skip
// what was touched. Attempts older than the provider's idempotency window
// are counted and listed, never sent.
func (p *Processor) Recover(ctx context.Context, idle time.Duration) (RecoveryReport, error) {
	rep, err := p.ReportPending(ctx)
	if err != nil || rep.Pending == 0 {
		return rep, err
	}
	window := p.horizon.providerWindow()

	// Take the idle attempts: touching them tells the other replicas (and
	// the next run) that someone works on them.
	const take = `
UPDATE charge SET updated_at = now()
WHERE event_id IN (
    SELECT event_id FROM charge
    WHERE status = 'pending'
      AND updated_at < now() - make_interval(secs => $1)
      AND created_at >= now() - make_interval(secs => $2)
    ORDER BY updated_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED)
RETURNING ` + charge.Columns
	var taken []charge.Row
	err = p.inTx(ctx, "recover", nil, func(tx *sqlx.Tx) error {
		taken = taken[:0]
		return tx.SelectContext(ctx, &taken, take, idle.Seconds(), window.Seconds(), recoverBatch)
	})
	if err != nil {
		return rep, fmt.Errorf("take idle charge attempts: %w", err)
	}
	// No message waits for these: their outcomes are counted by their
	// events' messages, if they ever come. One this process is completing
	// already (an event met it meanwhile) is left to that call.
	var calls []*call
	for _, a := range taken {
		if c := newCall(a, true); p.activate(c) {
			calls = append(calls, c)
		}
	}
	if len(calls) == 0 {
		return rep, nil
	}
	var wg sync.WaitGroup
	for _, c := range calls {
		c.sent = true
		wg.Go(func() { c.charge, c.err = p.payer.Charge(ctx, request(c.a)) })
	}
	wg.Wait()
	// Settled here rather than by the writers: maintain runs no writers.
	p.settleBatch(ctx, calls)
	for _, c := range calls {
		result := c.a.Status
		if !c.settledHere {
			rep.Unanswered++
			result = "unanswered"
		} else {
			rep.Completed[c.a.Status]++
		}
		p.metrics.AttemptsRecovered.WithLabelValues(result).Inc()
	}
	p.log.Warn("completed charge attempts left pending", "taken", len(taken), "completed", rep.Completed, "unanswered", rep.Unanswered)
	return rep, nil
}

// ReportPending counts the pending charge attempts and those past the
// provider's idempotency window, sets the metrics and logs the expired ones
// for a human. It sends nothing.
func (p *Processor) ReportPending(ctx context.Context) (RecoveryReport, error) {
	rep := RecoveryReport{Completed: map[string]int{}}
	window := p.horizon.providerWindow()

	const stats = `
SELECT count(*),
       coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8,
       count(*) FILTER (WHERE created_at < now() - make_interval(secs => $1))
FROM charge WHERE status = 'pending'`
	var oldest float64
	var expired int
	if err := p.db.QueryRowContext(ctx, stats, window.Seconds()).Scan(&rep.Pending, &oldest, &expired); err != nil {
		return rep, fmt.Errorf("count pending charge attempts: %w", err)
	}
	rep.OldestPending = time.Duration(oldest * float64(time.Second))
	p.metrics.AttemptsPending.Set(float64(rep.Pending))
	p.metrics.AttemptsOldestPending.Set(oldest)
	p.metrics.AttemptsExpired.Set(float64(expired))
	if expired > 0 {
		const q = `SELECT event_id FROM charge WHERE status = 'pending' AND created_at < now() - make_interval(secs => $1) ORDER BY created_at LIMIT $2`
		if err := p.db.SelectContext(ctx, &rep.Expired, q, window.Seconds(), maxExpiredListed); err != nil {
			return rep, fmt.Errorf("list expired charge attempts: %w", err)
		}
		p.log.Error("charge attempts unanswered for longer than the provider's idempotency window; they are not retried blindly: reconcile them with the provider and record their outcome",
			"count", expired, "window", window.String(), "event_ids", rep.Expired)
	}

	return rep, nil
}
