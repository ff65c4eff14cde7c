package billing

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel/trace/noop"

	"example.com/billing/internal/charge"
	"example.com/billing/internal/metrics"
)

// Recoverer completes the charge attempts left pending, which no event's
// message is completing (a consumer crashed after the claim, or the event
// was parked before its attempt was answered), and reports the pending and
// the expired ones.
//
// It completes an attempt as the event's own consumer would: the same
// request under the same key, settled by the same settle, which records
// the answer and announces its outcome. serve's recoverer shares its
// processor's settler (Processor.Recoverer): within one process the
// consumer and recovery never send the same attempt at the same time.
// maintain, which consumes nothing, builds one with a settler of its own
// (NewRecoverer). Across processes the attempts are taken with a lease
// (Recover).
type Recoverer struct {
	s     *settler
	payer Payer // nil: the recoverer only reports
	// window is the provider's idempotency window
	// (PAYMENT_IDEMPOTENCY_WINDOW).
	window time.Duration
}

// Recoverer returns the recoverer of p's process, which shares p's
// settler, its payer and its provider window.
func (p *Processor) Recoverer() *Recoverer {
	return &Recoverer{s: p.settler, payer: p.payer, window: p.horizon.ProviderWindow}
}

// NewRecoverer returns a recoverer for a process that consumes nothing
// (billing maintain). It charges through payer; with a nil payer it only
// reports (Recover is Report). window is the provider's idempotency window
// (PAYMENT_IDEMPOTENCY_WINDOW).
func NewRecoverer(db *sqlx.DB, payer Payer, window time.Duration, m *metrics.Metrics, log *slog.Logger) *Recoverer {
	return &Recoverer{s: newSettler(db, m, noop.NewTracerProvider(), log), payer: payer, window: window}
}

// RecoveryReport says what one Recover or Report run found and did.
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

// recoverSettles is how often one run tries to record the answers it got.
const recoverSettles = 3

// recoverBatch bounds the attempts one run takes on.
const recoverBatch = 500

// maxExpiredListed bounds the expired attempts one run lists and logs.
const maxExpiredListed = 100

// Recover reports the pending attempts (Report), then completes those
// nobody has worked on for idle: it asks the provider again under the same
// key and body and settles the answer, as the event's own consumer would.
// Several replicas may run it at once: each first takes its attempts by
// touching them in a short transaction, and the others skip what was
// touched. Attempts older than the provider's idempotency window are
// counted and listed, never sent. A recoverer without a payer only
// reports.
func (r *Recoverer) Recover(ctx context.Context, idle time.Duration) (RecoveryReport, error) {
	s := r.s
	rep, err := r.Report(ctx)
	if err != nil || rep.Pending == 0 || r.payer == nil {
		return rep, err
	}
	window := r.window

	// Take the idle attempts: touching them tells the other replicas (and
	// the next run) that someone works on them.
	var taken []charge.Row
	err = s.inTx(ctx, "recover", nil, func(tx *sqlx.Tx) error {
		var err error
		taken, err = charge.TakeIdle(ctx, tx, idle, window, recoverBatch)
		return err
	})
	if err != nil {
		return rep, fmt.Errorf("take idle charge attempts: %w", err)
	}
	// No message waits for these: their outcomes are counted by their
	// events' messages, if they ever come. One this process is completing
	// already (an event met it meanwhile) is left to that call.
	var calls []*call
	for _, a := range taken {
		if c := newCall(a, true); s.activate(c) {
			calls = append(calls, c)
		}
	}
	if len(calls) == 0 {
		return rep, nil
	}
	var wg sync.WaitGroup
	for _, c := range calls {
		c.sent = true
		wg.Go(func() { c.charge, c.err = r.payer.Charge(ctx, request(c.a)) })
	}
	wg.Wait()
	// Settled here rather than by the writers (maintain runs none), and
	// again a few times when the database fails: the answers are not
	// asked for again within this run.
	unsettled := s.settleBatch(ctx, calls)
	for try := 1; len(unsettled) > 0 && try < recoverSettles; try++ {
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(try) * time.Second):
		}
		if ctx.Err() != nil {
			break
		}
		unsettled = s.settleBatch(ctx, unsettled)
	}
	for _, c := range unsettled {
		s.abandon(c, c.settleErr)
	}
	for _, c := range calls {
		result := c.a.Status
		if !c.settledHere {
			rep.Unanswered++
			result = "unanswered"
		} else {
			rep.Completed[c.a.Status]++
		}
		s.metrics.AttemptsRecovered.WithLabelValues(result).Inc()
	}
	s.log.Warn("completed charge attempts left pending", "taken", len(taken), "completed", rep.Completed, "unanswered", rep.Unanswered)
	return rep, nil
}

// Report counts the pending charge attempts and those past the provider's
// idempotency window, sets the metrics and logs the expired ones for a
// human. It sends nothing.
func (r *Recoverer) Report(ctx context.Context) (RecoveryReport, error) {
	s := r.s
	rep := RecoveryReport{Completed: map[string]int{}}
	window := r.window

	st, err := charge.CountPending(ctx, s.db, window)
	if err != nil {
		return rep, err
	}
	rep.Pending, rep.OldestPending = st.Count, st.Oldest
	s.metrics.AttemptsPending.Set(float64(st.Count))
	s.metrics.AttemptsOldestPending.Set(st.Oldest.Seconds())
	s.metrics.AttemptsExpired.Set(float64(st.Expired))
	if st.Expired > 0 {
		if rep.Expired, err = charge.PendingBefore(ctx, s.db, window, maxExpiredListed); err != nil {
			return rep, err
		}
		s.log.Error("charge attempts unanswered for longer than the provider's idempotency window; they are not retried blindly: reconcile them with the provider and record their outcome",
			"count", st.Expired, "window", window.String(), "event_ids", rep.Expired)
	}
	return rep, nil
}
