package billing

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"go.opentelemetry.io/otel/trace"

	"example.com/billing/internal/charge"
	"example.com/billing/internal/dedup"
	"example.com/billing/internal/dlq/reason"
	"example.com/billing/internal/outbox"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/tracing"
)

// plan is what one claim decided: the attempts to complete, and which
// attempt each undecided event waits for.
type plan struct {
	calls map[uuid.UUID]*call
	// waits maps an event to the attempt it waits for: its own, or
	// another event's attempt for its order.
	waits map[*claimant]uuid.UUID
	// claimed is the number of events the claim recorded.
	claimed int
}

// intent is what the claim means to do with an event, before the dedup
// store's verdict.
type intent int

const (
	newAttempt     intent = iota // record a pending attempt and charge it
	resume                       // complete the event's own pending attempt
	retryRejected                // ask again after the provider refused the request
	settled                      // the event's attempt is settled or in progress: nothing to do
	alreadyCharged               // another event of the order succeeded
	copyInBatch                  // a later copy of an event claimed earlier in this batch
	waitHeld                     // the order's payment is in progress: wait for its verdict
)

// claimBatch runs phase 1 for claimants cls in one transaction and hands each its
// verdict: decided, or the call of the attempt it needs completed (its
// own, or another event's of its order), which charge.go and settle.go
// complete. When the claim fails for something outside the events (the
// database), they are left Pending for the caller's retry.
func (p *Processor) claimBatch(ctx context.Context, cls []*claimant) {
	cls = live(cls)
	if len(cls) == 0 {
		return
	}
	pl, err := p.claim(ctx, cls)
	var dropped *droppedError
	if errors.As(err, &dropped) {
		// Retention dropped these events' days: they cannot be judged.
		// The claim rolled back; park them (the next claim records their
		// failure) and claim again.
		for _, cl := range cls {
			if cl.res.Outcome == Pending && slices.Contains(dropped.ids, cl.res.Event.ID) {
				cl.res.park(reason.StaleEvent, fmt.Sprintf("eventId time %s falls on a day whose dedup records were dropped (the store remembers from %s on); it is not charged blindly",
					cl.res.Event.IDTime().Format(time.RFC3339), dropped.before.Format(time.DateOnly)))
			}
		}
		pl, err = p.claim(ctx, cls)
	}
	var refused *refusedError
	switch {
	case err == nil:
		p.observeAge(cls)
	case errors.As(refusal(err), &refused) && len(cls) > 1:
		// Waiting will not change a constraint the claim broke: each event
		// is claimed alone to find the one that broke it.
		for _, cl := range cls {
			p.claimBatch(ctx, []*claimant{cl})
		}
		return
	case errors.As(refusal(err), &refused):
		cls[0].res.park(reason.InvalidEvent, refused.Error())
		cls[0].claimed(nil)
		return
	default:
		for _, cl := range cls {
			cl.claimed(err)
		}
		return
	}
	// Each waiting event gets the call of its attempt; the first of them,
	// in batch order, traces the call.
	needed := map[*call]bool{}
	for _, cl := range cls {
		if id, waits := pl.waits[cl]; waits {
			if c, ok := pl.calls[id]; ok { // not recorded after all: claimed again
				cl.call = c
				if !needed[c] {
					needed[c] = true
					c.trace = cl.res.trace
				}
			}
		}
	}
	p.skipSettled(ctx, needed)
	for _, cl := range cls {
		cl.claimed(nil)
	}
}

// claim runs phase 1 for claimants cls in one transaction. Under the advisory locks
// of their orders it reads the orders' attempts, records the events in the
// dedup store and a pending attempt for each first-seen event that may
// charge its order, records the failures of the events parked for a
// reason of their own, and returns the plan. Events it decides at once
// (duplicates, business duplicates, mismatches) get their Result.
func (p *Processor) claim(ctx context.Context, cls []*claimant) (*plan, error) {
	var c *claimTx
	err := p.inTx(ctx, "claim", traces(cls), func(tx *sqlx.Tx) error {
		c = &claimTx{p: p, tx: tx, cls: cls, decided: map[*claimant]Result{},
			pl: &plan{calls: map[uuid.UUID]*call{}, waits: map[*claimant]uuid.UUID{}}}
		return c.run(ctx)
	})
	if err != nil {
		return nil, err
	}
	for cl, r := range c.decided {
		cl.res = r
	}
	p.metrics.Batch.Observe(float64(c.pl.claimed))
	return c.pl, nil
}

// claimTx is one claim transaction's work: what the orders' attempts are,
// what each event means to do, and what the claim decided.
type claimTx struct {
	p   *Processor
	tx  *sqlx.Tx
	cls []*claimant

	byEvent map[uuid.UUID]charge.Row // the attempts read, by event
	paid    map[int64]bool           // orders with a succeeded attempt
	busy    map[int64]uuid.UUID      // order → the attempt this claim completes for it
	held    map[int64]bool           // orders with an in_progress attempt

	claimed []*claimant // the events recorded in the dedup store, in batch order
	intents map[*claimant]intent
	entries []dedup.Entry // claimed's, in the same order

	decided map[*claimant]Result
	pl      *plan
}

func (c *claimTx) run(ctx context.Context) error {
	var claiming, announce []*claimant
	for _, cl := range c.cls {
		if cl.res.Outcome == Parked {
			announce = append(announce, cl)
		} else {
			claiming = append(claiming, cl)
		}
	}
	if err := c.lockAndRead(ctx, claiming); err != nil {
		return err
	}
	c.intend(claiming)
	verdicts, err := c.p.dedup.Claim(ctx, c.tx, c.entries)
	if err != nil {
		return err
	}
	c.pl.claimed = len(c.entries)
	return c.record(ctx, verdicts, announce)
}

// lockAndRead takes the advisory locks of every claimant's order, in key order,
// and then reads the orders' attempts and those of the claiming events:
// after the locks, so that under READ COMMITTED this sees what the locks'
// last holders committed.
func (c *claimTx) lockAndRead(ctx context.Context, claiming []*claimant) error {
	orderIDs := make([]int64, 0, len(c.cls))
	for _, cl := range c.cls {
		orderIDs = append(orderIDs, cl.res.Event.OrderID)
	}
	slices.Sort(orderIDs)
	orderIDs = slices.Compact(orderIDs)
	if err := lockOrders(ctx, c.tx, orderIDs); err != nil {
		return err
	}
	eventIDs := make([]uuid.UUID, len(claiming))
	for i, cl := range claiming {
		eventIDs[i] = cl.res.Event.ID
	}
	rows, err := charge.ForOrders(ctx, c.tx, orderIDs, eventIDs)
	if err != nil {
		return err
	}
	c.byEvent, c.paid, c.busy, c.held = map[uuid.UUID]charge.Row{}, map[int64]bool{}, map[int64]uuid.UUID{}, map[int64]bool{}
	for _, a := range rows {
		c.byEvent[a.EventID] = a
		switch a.Status {
		case charge.Succeeded:
			c.paid[a.OrderID] = true
		case charge.Pending:
			c.busy[a.OrderID] = a.EventID
			c.pl.calls[a.EventID] = newCall(a, true)
		case charge.InProgress:
			c.held[a.OrderID] = true
		}
	}
	return nil
}

// intend decides what each event would do, in batch order, before the
// dedup store's verdict: the first event of an order may charge it, the
// others wait for that attempt.
func (c *claimTx) intend(claiming []*claimant) {
	c.intents = map[*claimant]intent{}
	seen := map[uuid.UUID]bool{}
	for _, cl := range claiming {
		ev := cl.res.Event
		own, hasOwn := c.byEvent[ev.ID]
		var in intent
		switch {
		case seen[ev.ID]:
			// The dedup store judges it against the first copy.
			in = copyInBatch
		case hasOwn && !sameRequest(own, ev):
			r := cl.res
			r.park(reason.PayloadMismatch, fmt.Sprintf("eventId %s already has a charge attempt for order %d, customer %d, %d %s; not a duplicate to skip",
				ev.ID, own.OrderID, own.CustomerID, own.Amount, own.Currency))
			c.decided[cl] = r
			continue
		case hasOwn && own.Status == charge.Pending:
			in = resume
		case hasOwn && own.Status != charge.Rejected:
			in = settled
		case c.paid[ev.OrderID]:
			in = alreadyCharged
		default: // a new attempt, or one more after the provider refused
			if b, ok := c.busy[ev.OrderID]; ok {
				c.pl.waits[cl] = b // decided once that attempt is settled
				continue
			}
			if c.held[ev.OrderID] {
				in = waitHeld
				break
			}
			in = newAttempt
			if hasOwn {
				in = retryRejected
			}
			c.busy[ev.OrderID] = ev.ID
		}
		c.intents[cl] = in
		seen[ev.ID] = true
		c.claimed = append(c.claimed, cl)
		c.entries = append(c.entries, dedup.Entry{ID: ev.ID, Fingerprint: ev.Fingerprint()})
	}
}

// record acts on the dedup store's verdicts: the attempts to record,
// resume or ask again, the events decided at once (counted when their own
// attempt's outcome is theirs to count), the events that wait for their
// order's payment in progress, and the failures to announce.
func (c *claimTx) record(ctx context.Context, verdicts []dedup.Verdict, announce []*claimant) error {
	var fresh, retried []*claimant // new attempts, refused ones asked again
	var waiting []charge.Row
	var settledOwn []*claimant
	for n, cl := range c.claimed {
		ev, in, v := cl.res.Event, c.intents[cl], verdicts[n]
		_, hasOwn := c.byEvent[ev.ID]
		r := cl.res
		switch {
		case v == dedup.Mismatch:
			r.park(reason.PayloadMismatch, fmt.Sprintf("eventId %s was already processed with a different payload (fingerprint %x); not a duplicate to skip",
				ev.ID, c.entries[n].Fingerprint[:8]))
			c.decided[cl] = r
			continue
		case in == resume:
			// A redelivery or a retry of an event whose attempt is
			// recorded: complete it under the same key.
			c.pl.waits[cl] = ev.ID
			c.pl.calls[ev.ID] = newCall(c.byEvent[ev.ID], true)
			continue
		case in == retryRejected:
			retried = append(retried, cl) // a replay: asked again below
			continue
		case in == waitHeld && (v != dedup.Seen || hasOwn):
			// Its order's payment is in progress: decided when that is
			// settled (waiting.go). A replayed refused event waits too.
			waiting = append(waiting, newAttemptOf(ev))
			r.Outcome = InProgress
		case in == settled:
			// Counted below when no message of the event counted it.
			r.Outcome, r.Recorded = Duplicate, outcomeOf(c.byEvent[ev.ID].Status)
			settledOwn = append(settledOwn, cl)
		case v == dedup.Seen || in == copyInBatch:
			// Claimed before without an attempt of its own: a business
			// duplicate then, or its attempt was settled elsewhere, or it
			// waits for its order's payment.
			r.Outcome = Duplicate
		case in == alreadyCharged:
			r.Outcome = AlreadyCharged
		default: // newAttempt, first seen
			fresh = append(fresh, cl)
			continue
		}
		c.decided[cl] = r
	}
	if err := c.p.count(ctx, c.tx, settledOwn, c.decided); err != nil {
		return err
	}
	if err := charge.Wait(ctx, c.tx, waiting); err != nil {
		return err
	}
	if err := c.attempts(ctx, fresh, retried); err != nil {
		return err
	}
	// The failures of the events parked for a reason of their own, under
	// their orders' locks: announced in the order recorded.
	var failures []outbox.Event
	for _, cl := range announce {
		failures = append(failures, c.p.failureOf(cl.res))
	}
	for _, r := range c.decided {
		if r.announced() {
			failures = append(failures, c.p.failureOf(r))
		}
	}
	return outbox.Record(ctx, c.tx, failures)
}

// attempts records the attempts of fresh (new events that may charge their
// order) and asks again those of retried (replays of events the provider
// refused), each with its customer's saved payment method when the provider
// charges one. An event whose customer has none is parked
// no-payment-method, with a refused attempt that a replay re-opens, and
// nothing is sent.
func (c *claimTx) attempts(ctx context.Context, fresh, retried []*claimant) error {
	methods, err := c.p.methodsOf(ctx, c.tx, c.rowsOf(append(slices.Clone(fresh), retried...)))
	if err != nil {
		return err
	}
	var inserted, reopened []charge.Row
	for _, cl := range append(slices.Clone(fresh), retried...) {
		ev := cl.res.Event
		a, isRetry := c.byEvent[ev.ID]
		if !isRetry {
			a = newAttemptOf(ev)
		}
		if wallet := c.p.wallet; wallet != "" {
			m, ok := methods[ev.CustomerID]
			if !ok {
				why := noMethodDetail(wallet, ev.CustomerID)
				r := cl.res
				r.park(reason.NoPaymentMethod, why)
				c.decided[cl] = r
				if !isRetry {
					a.Status, a.LastError = charge.Rejected, &why
					inserted = append(inserted, a)
				}
				continue
			}
			a.CustomerRef, a.PaymentMethodRef = &m.CustomerRef, &m.PaymentMethodRef
		}
		if isRetry {
			a.Status, a.CreatedAt, a.Indeterminate = charge.Pending, c.p.now(), 0
			reopened = append(reopened, a)
		} else {
			inserted = append(inserted, a)
		}
		c.pl.waits[cl] = ev.ID
		c.pl.calls[ev.ID] = newCall(a, false)
	}
	if err := charge.Insert(ctx, c.tx, inserted); err != nil {
		return err
	}
	return charge.Reopen(ctx, c.tx, reopened)
}

// rowsOf is the attempts the events of cls would record.
func (c *claimTx) rowsOf(cls []*claimant) []charge.Row {
	rows := make([]charge.Row, len(cls))
	for i, cl := range cls {
		rows[i] = newAttemptOf(cl.res.Event)
	}
	return rows
}

// failureOf is the payment.failed.v1 outcome of an event parked for a
// reason of its own.
func (p *Processor) failureOf(r Result) outbox.Event {
	o := outbox.NewEvent(outbox.Failed, r.Event, string(r.Reason.Code), p.now())
	o.Traceparent = tracing.Traceparent(r.trace)
	return o
}

// traces are the spans of cls' events, for a transaction serving them.
func traces(cls []*claimant) []trace.SpanContext {
	out := make([]trace.SpanContext, len(cls))
	for i, cl := range cls {
		out[i] = cl.res.trace
	}
	return out
}

// count decides, for the events whose own attempt is settled, which
// message counts the outcome: the first try that finds it counted for
// nobody (another worker settled it: another event of the order,
// maintenance) or counted for this very message's earlier try in this
// process, whose commit went unanswered. It records that in
// charge.counted_by and reports the recorded outcome; every other copy
// stays a Duplicate.
func (p *Processor) count(ctx context.Context, tx *sqlx.Tx, cls []*claimant, decided map[*claimant]Result) error {
	if len(cls) == 0 {
		return nil
	}
	var ids []uuid.UUID
	var counters []string
	seen := map[uuid.UUID]bool{}
	for _, cl := range cls {
		id := cl.res.Event.ID
		if seen[id] {
			continue // a second copy in the batch is a duplicate
		}
		seen[id] = true
		ids = append(ids, id)
		counters = append(counters, cl.res.counter)
	}
	byEvent, err := charge.Count(ctx, tx, ids, counters)
	if err != nil {
		return err
	}
	for _, cl := range cls {
		r := decided[cl]
		if byEvent[r.Event.ID] == cl.res.counter {
			r.Outcome = r.Recorded
			delete(byEvent, r.Event.ID) // once
			decided[cl] = r
		}
	}
	return nil
}

// lockOrders takes the transaction locks of orderIDs
// (postgres.OrderLockSpace, hashint8(order_id)): two orders that share a
// hash only wait for each other.
func lockOrders(ctx context.Context, tx *sqlx.Tx, orderIDs []int64) error {
	// ORDER BY at the top level: PostgreSQL evaluates a volatile function of
	// the select list after sorting, so the locks are taken in key order
	// and two batches sharing orders cannot deadlock.
	const q = `
SELECT pg_advisory_xact_lock($1, h)
FROM (SELECT DISTINCT hashint8(id) AS h FROM unnest($2::int8[]) AS id) AS keys
ORDER BY h`
	if _, err := tx.ExecContext(ctx, q, postgres.OrderLockSpace, pq.Int64Array(orderIDs)); err != nil {
		return fmt.Errorf("lock orders: %w", err)
	}
	return nil
}

// refusedError is a claim the database refused for what an event holds:
// a data exception (SQLSTATE class 22) or an integrity constraint other
// than a unique one (class 23; a unique violation is two workers racing,
// which the next attempt settles). Validation keeps such events out, so it
// takes a schema that demands more than the event contract (a constraint
// added by hand, a narrower column); retrying cannot change it, so the
// event is parked with the database's words rather than retried for ever.
type refusedError struct{ err *pq.Error }

func (e *refusedError) Error() string {
	return fmt.Sprintf("the database refused the event: %s (SQLSTATE %s)", e.err.Message, e.err.Code)
}

func (e *refusedError) Unwrap() error { return e.err }

// refusal returns err as a *refusedError when the database refused the
// claim's data, else err.
func refusal(err error) error {
	var pe *pq.Error
	if !errors.As(err, &pe) {
		return err
	}
	switch pe.Code.Class() {
	case "22":
	case "23":
		if pe.Code == "23505" || pe.Code == "23P01" { // unique, exclusion: a race
			return err
		}
	default:
		return err
	}
	return &refusedError{err: pe}
}

// oldEvent is the age from which claiming an event is worth a warning: a
// backlog of days (an outage, a replay of parked events) is worked off.
const oldEvent = 24 * time.Hour

// observeAge sets billing_claimed_event_age_seconds to the age of the
// oldest of the events just claimed, and warns, once a minute at most, that
// events older than a day are being charged: not a failure (each is
// charged once like any other), but an operator should know that orders
// are being paid days late.
func (p *Processor) observeAge(cls []*claimant) {
	now := p.now()
	var oldest time.Duration
	var old int64
	for _, cl := range cls {
		if cl.res.Outcome == Parked {
			continue // not charged
		}
		age := now.Sub(cl.res.Event.IDTime())
		oldest = max(oldest, age)
		if age >= oldEvent {
			old++
		}
	}
	p.metrics.ClaimedEventAge.Set(oldest.Seconds())
	if old == 0 {
		return
	}
	n := p.oldClaimed.Add(old)
	if last := p.oldWarned.Load(); now.UnixNano()-last >= int64(time.Minute) && p.oldWarned.CompareAndSwap(last, now.UnixNano()) {
		p.oldClaimed.Add(-n)
		p.log.Warn("claiming events older than a day: a backlog is being worked off (billing_claimed_event_age_seconds)",
			"events", n, "oldest_age", oldest.Round(time.Minute).String())
	}
}
