package billing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel/trace/noop"

	"example.com/billing/internal/charge"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/payment"
)

// Recoverer completes the charge attempts left pending, which no event's
// message is completing (a consumer crashed after the claim, or the event
// was parked before its attempt was answered), resolves the ones whose
// outcome billing does not know by asking the provider (in_progress
// attempts no notification settled, pending ones past the provider's
// window), and reports what needs a human.
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
// reports (Recover is Report). horizon's ProviderWindow is the provider's
// idempotency window (PAYMENT_IDEMPOTENCY_WINDOW), its ResolveAfter how
// long an in_progress attempt waits for a notification.
func NewRecoverer(db *sqlx.DB, payer Payer, horizon Horizon, m *metrics.Metrics, log *slog.Logger) *Recoverer {
	return &Recoverer{s: newSettler(db, payer, horizon.ResolveAfter, m, noop.NewTracerProvider(), log), payer: payer, window: horizon.ProviderWindow}
}

// Woken is signalled when an attempt was recorded that no message sends
// (an event that waited for its order's payment became the order's next
// attempt): recovery sends it, and need not wait for its next round.
func (r *Recoverer) Woken() <-chan struct{} { return r.s.woken }

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
	// InProgress is the number of attempts the provider holds without a
	// verdict, the oldest created OldestInProgress ago; Resolved counts
	// those this run's lookups settled (in_progress, and pending past the
	// window), by recorded status; Unresolved the open attempts older than
	// the window the provider cannot find: they wait for a human.
	InProgress       int            `json:"inProgress"`
	OldestInProgress time.Duration  `json:"oldestInProgress"`
	Resolved         map[string]int `json:"resolved"`
	Unresolved       int            `json:"unresolved"`
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
	if err != nil || r.payer == nil {
		return rep, err
	}
	if err := r.resolve(ctx, idle, &rep); err != nil {
		return rep, err
	}
	// While charging is paused nothing is sent again: the attempts wait,
	// pending, for a run after the resume.
	if rep.Pending == 0 || r.paused() != nil {
		return rep, nil
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
		wg.Go(func() {
			if s.resend(ctx, c) {
				req := request(c.a)
				// Not sent once the attempt is past the provider's window
				// (it could charge twice) or charging is paused (taken
				// again after the resume).
				req.Ready = func() error {
					if err := r.paused(); err != nil {
						return err
					}
					return withinWindow(s.now(), c.a, window)
				}
				c.answered(r.payer.Charge(ctx, req))
				if errors.Is(c.err, payment.ErrNotSent) {
					c.sent = false // left pending
				}
			}
		})
	}
	wg.Wait()
	var answered []*call
	for _, c := range calls {
		if c.sent {
			answered = append(answered, c)
		} else {
			s.end(c, c.err) // its re-send is another worker's
		}
	}
	calls = answered
	r.settle(ctx, calls)
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

// errChargingPaused: recovery sends nothing while charging is paused.
var errChargingPaused = errors.New("charging is paused: recovery sends it after the resume")

// paused returns errChargingPaused while an operator has paused charging,
// else nil: the Ready of recovery's requests, which nobody waits for.
func (r *Recoverer) paused() error {
	if p, ok := r.payer.(pausable); ok && p.Paused() {
		return errChargingPaused
	}
	return nil
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
	rep.InProgress, rep.OldestInProgress, rep.Unresolved = st.InProgress, st.OldestInProgress, st.Unresolved
	rep.Resolved = map[string]int{}
	s.metrics.AttemptsPending.Set(float64(st.Count))
	s.metrics.AttemptsOldestPending.Set(st.Oldest.Seconds())
	s.metrics.AttemptsExpired.Set(float64(st.Expired))
	s.metrics.AttemptsInProgress.Set(float64(st.InProgress))
	s.metrics.AttemptsOldestInProgress.Set(st.OldestInProgress.Seconds())
	s.metrics.AttemptsUnresolved.Set(float64(st.Unresolved))
	if st.Expired > 0 {
		if rep.Expired, err = charge.PendingBefore(ctx, s.db, window, maxExpiredListed); err != nil {
			return rep, err
		}
		s.log.Error("charge attempts unanswered for longer than the provider's idempotency window; they are never sent again, only looked up: those the provider cannot find need a human (docs/operations.md, an unresolved charge attempt)",
			"count", st.Expired, "unresolved", st.Unresolved, "window", window.String(), "event_ids", rep.Expired)
	}
	return rep, nil
}

// settle settles calls' answers here rather than by the writers (maintain
// runs none), and again a few times when the database fails: the answers
// are not asked for again within this run.
func (r *Recoverer) settle(ctx context.Context, calls []*call) {
	s := r.s
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
		s.end(c, c.settleErr)
	}
}

// lookupLease is how long an attempt taken for a lookup is left to the
// replica that took it, should it die before it records the answer.
const lookupLease = time.Minute

// resolve asks the provider about the attempts whose outcome billing does
// not know and records what it says: the in_progress ones whose next
// lookup is due (no notification came, or the provider stored an answer
// without a verdict), and the pending ones past the provider's window,
// which are never sent again. What the provider cannot find stays as it
// is: an in_progress attempt is asked about again later, one past the
// window counts as unresolved, for a human.
func (r *Recoverer) resolve(ctx context.Context, idle time.Duration, rep *RecoveryReport) error {
	s := r.s
	if p, ok := r.payer.(pausable); ok && p.ResolveSends() && p.Paused() {
		return nil // a lookup would send the payment again: after the resume
	}
	var due, expired []charge.Row
	err := s.inTx(ctx, "recover", nil, func(tx *sqlx.Tx) error {
		var err error
		if due, err = charge.TakeDue(ctx, tx, lookupLease, recoverBatch); err != nil {
			return err
		}
		expired, err = charge.TakeExpired(ctx, tx, idle, r.window, expiredLookupPause, recoverBatch)
		return err
	})
	if err != nil {
		return fmt.Errorf("take charge attempts to look up: %w", err)
	}
	var calls []*call
	for _, a := range append(due, expired...) {
		if c := newCall(a, true); s.activate(c) {
			calls = append(calls, c)
		}
	}
	if len(calls) == 0 {
		return nil
	}
	now := s.now()
	var wg sync.WaitGroup
	for _, c := range calls {
		wg.Go(func() {
			l := lookup(c.a)
			l.Ready = r.paused
			out, err := r.payer.Resolve(ctx, l)
			if errors.Is(err, payment.ErrNotSent) {
				return // paused meanwhile: its lease runs out, and a run after the resume looks it up
			}
			r.looked(c, out, err, now)
		})
	}
	wg.Wait()
	var answered []*call
	var failed []error
	for _, c := range calls {
		if c.lookupErr != nil && ctx.Err() == nil {
			failed = append(failed, c.lookupErr)
		}
		if c.sent && ctx.Err() == nil {
			answered = append(answered, c)
		} else {
			s.end(c, c.err)
		}
	}
	if ctx.Err() != nil {
		r.release(due)
		return ctx.Err()
	}
	if len(failed) > 0 {
		// Once per run, not once per attempt: a provider that cannot be
		// asked fails every lookup of the run the same way.
		s.log.Warn("cannot look charge attempts up at the provider; they are looked up again later (billing_payment_lookups_total{result=\"error\"})",
			"failed", len(failed), "looked_up", len(calls), "err", failed[0])
	}
	r.settle(ctx, answered)
	for _, c := range answered {
		if c.settledHere && !charge.Open(c.a.Status) {
			rep.Resolved[c.a.Status]++
		}
	}
	if n := len(rep.Resolved); n > 0 {
		s.log.Info("resolved charge attempts by asking the provider", "resolved", rep.Resolved, "looked_up", len(calls))
	}
	return nil
}

// release gives the in_progress attempts of due back to the next lookup,
// now: this process stops before it could record what the provider said,
// and another replica should not wait for the lookup's lease to pass.
func (r *Recoverer) release(due []charge.Row) {
	if len(due) == 0 {
		return
	}
	ids := make([]uuid.UUID, len(due))
	for i, a := range due {
		ids[i] = a.EventID
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if err := charge.ReleaseLookups(ctx, r.s.db, ids); err != nil {
		r.s.log.Warn("could not give back the lookups of a stopped run; they are due again when their lease passes", "attempts", len(ids), "err", err)
	}
}

// releaseTimeout bounds release, which runs while the process stops.
const releaseTimeout = 2 * time.Second

// looked records on c what a lookup of its attempt found, as an answer to
// settle: a verdict settles it; an in_progress attempt the provider still
// holds, cannot find or could not be asked about is asked again after a
// pause that grows with its age (a bank debit takes days); a pending one
// past the window is left as it is.
func (r *Recoverer) looked(c *call, out payment.Outcome, err error, now time.Time) {
	c.lookupErr = err
	age := now.Sub(c.a.CreatedAt)
	next := now.Add(min(max(age/10, r.s.resolveAfter), maxLookupPause))
	switch {
	case err == nil && out.Kind.Final():
		c.sent, c.out = true, out
	case c.a.Status == charge.Pending && err == nil && out.Kind == payment.InProgress:
		c.sent, c.out, c.next = true, out, next
	case c.a.Status == charge.InProgress:
		switch {
		case err != nil:
			out = payment.Outcome{Detail: "lookup failed: " + err.Error()}
		case out.Kind == payment.Unknown:
			// A provider's own reason comes first: Adyen's lookup past
			// its window asks nothing, and says so.
			out.Detail = "lookup: " + cmp.Or(out.Detail, "the provider found no payment yet")
		}
		out.Kind = payment.InProgress
		c.sent, c.out, c.next = true, out, next
	default:
		c.err = cmp.Or(err, errNotFound) // pending past the window, not found: for a human
	}
}

// maxLookupPause bounds the pause between two lookups of an in_progress
// attempt; expiredLookupPause is the pause between two lookups of a
// pending attempt past the window that the provider did not find (it may
// still, if the payment appears late).
const (
	maxLookupPause     = time.Hour
	expiredLookupPause = 10 * time.Minute
)

// errNotFound: a lookup found no payment for the attempt.
var errNotFound = errors.New("billing: the provider found no payment for the attempt")
