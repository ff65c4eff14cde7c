package billing

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"example.com/billing/internal/charge"
	"example.com/billing/internal/order"
	"example.com/billing/internal/outbox"
	"example.com/billing/internal/payment"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/tracing"
)

// attempt is one row of the charge table, a provider request and what is
// known of its outcome, with what billing does with it.
type attempt struct{ charge.Row }

func newAttemptOf(ev order.Event) attempt {
	return attempt{charge.Row{EventID: ev.ID, OrderID: ev.OrderID, CustomerID: ev.CustomerID,
		Amount: ev.Amount.Minor, Currency: ev.Amount.Currency, Status: charge.Pending, CreatedAt: time.Now()}}
}

// request is the provider request of the attempt: the same bytes whoever
// sends it, so that the provider recognises a repeat.
func (a attempt) request() payment.Request {
	return payment.Request{IdempotencyKey: a.EventID.String(), OrderID: a.OrderID,
		CustomerID: a.CustomerID, Amount: a.Amount, Currency: a.Currency}
}

// sameRequest reports whether ev asks for the charge a records.
func (a attempt) sameRequest(ev order.Event) bool {
	return a.OrderID == ev.OrderID && a.CustomerID == ev.CustomerID &&
		a.Amount == ev.Amount.Minor && a.Currency == ev.Amount.Currency
}

// outcome is the event outcome a settled attempt stands for.
func (a attempt) outcome() Outcome {
	switch a.Status {
	case charge.Succeeded:
		return Charged
	case charge.Declined:
		return Declined
	case charge.Rejected:
		return Parked
	}
	return Pending
}

// call is one attempt completed in this round: phase 2's request and
// answer, then what phase 3 recorded.
type call struct {
	a       attempt
	trace   trace.SpanContext // of the first event waiting for it
	fromRow bool              // read pending from the table, not recorded by this claim
	// countedFor is the event (index into results) whose message counts
	// the outcome when this round settles it: the first copy of the
	// attempt's own event in the batch; -1 when none waits for it here.
	countedFor int

	sent    bool           // the request went out (not expired, not busy)
	charge  payment.Charge // the provider's charge, when it charged
	err     error          // the provider's answer when not a charge; why it was not sent
	expired bool           // older than the provider's idempotency window: not sent
	// settledHere: this round's settle moved the attempt out of pending;
	// otherwise another worker recorded the answer first.
	settledHere bool
}

func newCall(a attempt, fromRow bool) *call {
	return &call{a: a, fromRow: fromRow, countedFor: -1}
}

// Retry is what a failed Process asks of its caller before it tries the
// events again: the cause, as billing_retries_total labels it (payment or
// database), and the least wait (a provider's Retry-After).
type Retry struct {
	Cause string
	After time.Duration
}

// RetryFor tells how to retry after Process returned err.
func RetryFor(err error) Retry {
	var te *payment.TransientError
	switch {
	case errors.As(err, &te):
		return Retry{Cause: "payment", After: te.RetryAfter}
	case errors.Is(err, ErrAttemptBusy):
		return Retry{Cause: "payment"}
	}
	return Retry{Cause: "database"}
}

// ErrAttemptBusy: the attempt an event needs is being sent by another lane
// of this process right now; the event is retried once that settled.
var ErrAttemptBusy = errors.New("its charge attempt is in flight in another lane of this process")

// round runs claim → charge → settle once for the events results[idx]. It
// fills the Results of the events it decided and returns the events to
// decide in a further round: those that waited for another attempt of their
// order, now settled. Events left Pending wait for the caller's retry; the
// error says why.
func (p *Processor) round(ctx context.Context, results []Result, idx []int) ([]int, error) {
	pl, err := p.claim(ctx, results, idx)
	if err != nil {
		return nil, refusal(err)
	}
	if len(pl.calls) == 0 {
		return p.deferred(results, idx, pl), nil
	}
	defer p.release(pl.calls)
	p.chargeAll(ctx, pl.calls)
	if err := p.settle(ctx, results, idx, pl); err != nil {
		return nil, err
	}

	var next []int
	var failed error
	for _, i := range idx {
		id, waits := pl.waits[i]
		if !waits {
			continue
		}
		c, ok := pl.calls[id]
		own := id == results[i].Event.ID
		switch {
		case !ok:
			next = append(next, i) // its attempt was not recorded after all
		case c.expired:
			results[i].park(CodeStaleEvent, expiredDetail(c.a, own, p.horizon.providerWindow()))
		case c.a.Status == charge.Pending:
			failed = cmpOr(failed, c.err) // still unanswered: the caller retries
		case !own:
			next = append(next, i) // the order's other attempt is settled: decide now
		case c.a.Status == charge.Rejected:
			detail := "the provider refused the request"
			if c.a.LastError != nil {
				detail = *c.a.LastError
			}
			results[i].park(CodeProviderRejected, detail)
		case c.settledHere && c.countedFor == i:
			results[i].Outcome = c.a.outcome()
		default:
			// Settled by another worker (a copy of the event, another
			// event of the order, maintenance), or this is a second copy
			// in the batch: the next claim decides which message counts it.
			next = append(next, i)
		}
	}
	return next, failed
}

// deferred returns the events that wait for an attempt no call completes.
func (p *Processor) deferred(results []Result, idx []int, pl *plan) []int {
	var next []int
	for _, i := range idx {
		if _, waits := pl.waits[i]; waits && results[i].Outcome == Pending {
			next = append(next, i)
		}
	}
	return next
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func expiredDetail(a attempt, own bool, window time.Duration) string {
	whose := "its charge attempt"
	if !own {
		whose = fmt.Sprintf("order %d has a charge attempt (event %s)", a.OrderID, a.EventID)
	}
	return fmt.Sprintf("%s from %s is still unanswered and older than the provider's idempotency window %s: asking again could charge twice, so it is not retried blindly; reconcile it with the provider, record the outcome in the charge table, then replay this event",
		whose, a.CreatedAt.UTC().Format(time.RFC3339), window)
}

// chargeAll runs phase 2: every call's request, concurrently, with no
// transaction open. The payment client keeps the whole process inside the
// provider's limits. An attempt another lane of this process is sending
// right now is not sent twice: its events wait for that lane's answer.
func (p *Processor) chargeAll(ctx context.Context, calls map[uuid.UUID]*call) {
	window := p.horizon.providerWindow()
	now := p.now()
	var wg sync.WaitGroup
	for id, c := range calls {
		if now.Sub(c.a.CreatedAt) > window {
			c.expired = true
			p.log.Error("charge attempt older than the provider's idempotency window; not retried blindly (reconcile it)",
				"event_id", c.a.EventID.String(), "order_id", c.a.OrderID, "created_at", c.a.CreatedAt, "window", window.String())
			continue
		}
		if !p.acquire(id) {
			c.err = ErrAttemptBusy
			continue
		}
		c.sent = true
	}
	p.skipSettled(ctx, calls)
	for _, c := range calls {
		if c.sent {
			wg.Go(func() {
				c.charge, c.err = p.payer.Charge(trace.ContextWithSpanContext(ctx, c.trace), c.a.request())
			})
		}
	}
	wg.Wait()
}

// skipSettled takes back the calls of attempts that were read pending but
// are settled by now: another copy of the event, another lane or
// maintenance recorded the answer between the claim and this call. Asking
// again would be answered from the provider's store, but costs a request
// of the provider's rate limit for nothing. (A race that slips between
// this check and the request is still safe: same key, same body.)
func (p *Processor) skipSettled(ctx context.Context, calls map[uuid.UUID]*call) {
	var ids pq.StringArray
	for id, c := range calls {
		if c.sent && c.fromRow {
			ids = append(ids, id.String())
		}
	}
	if len(ids) == 0 {
		return
	}
	var settled []uuid.UUID
	const q = `SELECT event_id FROM charge WHERE event_id = ANY($1::uuid[]) AND status <> 'pending'`
	if err := p.db.SelectContext(ctx, &settled, q, ids); err != nil {
		return // ask the provider: it knows
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range settled {
		calls[id].sent = false
		delete(p.sending, id)
	}
}

// acquire registers attempt id as being sent by this process; it reports
// false when it already is.
func (p *Processor) acquire(id uuid.UUID) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, busy := p.sending[id]; busy {
		return false
	}
	p.sending[id] = struct{}{}
	return true
}

// release forgets the attempts calls sent, once their answers are recorded.
func (p *Processor) release(calls map[uuid.UUID]*call) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, c := range calls {
		if c.sent {
			delete(p.sending, id)
		}
	}
}

// settle runs phase 3: it records every answer in one transaction, counts
// an unanswered request on its attempt, and reads back what is recorded
// (another worker may have settled an attempt first; the provider gave it
// the same answer). calls' attempts then hold the recorded state. An answer
// is recorded as counted for its own event's message when that message is
// in the batch (charge.counted_by), and for nobody otherwise: the event's
// message counts it when it comes.
func (p *Processor) settle(ctx context.Context, results []Result, idx []int, pl *plan) error {
	calls := pl.calls
	const update = `
UPDATE charge AS c SET
    status             = u.status,
    provider_charge_id = NULLIF(u.provider_id, ''),
    settled_at         = CASE WHEN u.status = 'pending' THEN NULL ELSE now() END,
    updated_at         = now(),
    requests           = c.requests + 1,
    last_error         = NULLIF(u.err, ''),
    counted_by         = CASE WHEN u.status = 'pending' THEN NULL ELSE NULLIF(u.counted_by, '') END
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[]) AS u(id, status, provider_id, err, counted_by)
WHERE c.event_id = u.id AND c.status = 'pending'
RETURNING c.event_id, c.status`
	const reread = `SELECT ` + charge.Columns + ` FROM charge WHERE event_id = ANY($1::uuid[])`

	var ids, statuses, providerIDs, errs, countedBy, all pq.StringArray
	for id, c := range calls {
		all = append(all, id.String())
		if !c.sent {
			continue
		}
		var counted string
		if c.countedFor >= 0 {
			counted = results[c.countedFor].counter
		}
		countedBy = append(countedBy, counted)
		status, errText := charge.Pending, ""
		switch {
		case c.err == nil:
			status = charge.Succeeded
		case errors.Is(c.err, payment.ErrDeclined):
			status, errText = charge.Declined, c.err.Error()
		case errors.Is(c.err, payment.ErrRejected):
			status, errText = charge.Rejected, c.err.Error()
		default:
			errText = c.err.Error()
		}
		ids = append(ids, id.String())
		statuses = append(statuses, status)
		providerIDs = append(providerIDs, c.charge.ID)
		errs = append(errs, errText)
	}
	var recorded []attempt
	var changed []struct {
		EventID uuid.UUID `db:"event_id"`
		Status  string    `db:"status"`
	}
	err := p.inTxWithOutbox(ctx, "settle", results, idx, func(tx *sqlx.Tx) error {
		changed = changed[:0]
		if len(ids) > 0 {
			if err := tx.SelectContext(ctx, &changed, update, ids, statuses, providerIDs, errs, countedBy); err != nil {
				return fmt.Errorf("settle charge attempts: %w", err)
			}
		}
		// The outcome is announced with the settle that records it, once:
		// only this transaction moved these attempts out of pending.
		var outcomes []outbox.Outcome
		for _, ch := range changed {
			if ch.Status == charge.Pending {
				continue
			}
			outcomes = append(outcomes, p.outcomeOf(results, calls[ch.EventID], ch.Status))
		}
		if err := outbox.Record(ctx, tx, outcomes); err != nil {
			return err
		}
		if err := tx.SelectContext(ctx, &recorded, reread, all); err != nil {
			return fmt.Errorf("read settled charge attempts: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, a := range recorded {
		if c, ok := calls[a.EventID]; ok {
			c.a = a
		}
	}
	for _, ch := range changed {
		if c, ok := calls[ch.EventID]; ok && ch.Status != charge.Pending {
			c.settledHere = true
		}
	}
	return nil
}

// outcomeOf is the payment outcome event of c's attempt, settled here as
// status.
func (p *Processor) outcomeOf(results []Result, c *call, status string) outbox.Outcome {
	a := c.a
	ev := order.Event{ID: a.EventID, OrderID: a.OrderID, CustomerID: a.CustomerID,
		Amount: order.Money{Minor: a.Amount, Currency: a.Currency}}
	typ := map[string]string{charge.Succeeded: outbox.Succeeded, charge.Declined: outbox.Declined, charge.Rejected: outbox.Failed}[status]
	var reason string
	if status == charge.Rejected {
		reason = CodeProviderRejected
	}
	o := outbox.NewOutcome(typ, ev, reason, p.now())
	switch status {
	case charge.Succeeded:
		o.ProviderChargeID = c.charge.ID
	case charge.Declined:
		o.DeclineCode = payment.DeclineCode(c.err)
	}
	sc := c.trace
	if c.countedFor >= 0 {
		sc = results[c.countedFor].trace // the attempt's own event
	}
	o.Traceparent = tracing.Traceparent(sc)
	return o
}

// inTxWithOutbox is inTx for a transaction that records outcomes: when the
// outbox has no partition for today yet (maintenance has not run), it
// creates it and runs the transaction once more.
func (p *Processor) inTxWithOutbox(ctx context.Context, phase string, results []Result, idx []int, fn func(tx *sqlx.Tx) error) error {
	err := p.inTx(ctx, phase, results, idx, fn)
	var missing *outbox.MissingPartitionError
	if !errors.As(err, &missing) {
		return err
	}
	p.log.Warn("the outbox has no partition for today; creating it (is maintenance running?)")
	if err := outbox.Table.EnsureFor(ctx, p.db, missing.IDs); err != nil {
		return err
	}
	return p.inTx(ctx, phase, results, idx, fn)
}

// inTx runs fn in a transaction of phase, traced below the events' spans and
// timed in billing_db_transaction_seconds.
func (p *Processor) inTx(ctx context.Context, phase string, results []Result, idx []int, fn func(tx *sqlx.Tx) error) error {
	links := make([]trace.Link, 0, len(idx))
	for _, i := range idx {
		links = append(links, trace.Link{SpanContext: results[i].trace})
	}
	var parent trace.SpanContext
	if len(idx) > 0 {
		parent = results[idx[0]].trace
	}
	// One transaction serves the whole batch: its span hangs below the
	// first message's and links to all of them.
	ctx, span := p.tracer.Start(trace.ContextWithSpanContext(ctx, parent), "billing "+phase,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithLinks(links...),
		trace.WithAttributes(semconv.DBSystemNamePostgreSQL, attribute.Int("billing.events", len(idx))))
	defer span.End()
	started := time.Now()
	err := postgres.InTx(ctx, p.db, fn)
	p.metrics.Transaction.WithLabelValues(phase).Observe(time.Since(started).Seconds())
	p.writes.Observe(err)
	if err != nil {
		p.metrics.DBErrors.WithLabelValues(postgres.SQLState(err)).Inc()
		span.RecordError(err)
		span.SetStatus(codes.Error, "rolled back")
	}
	return err
}
