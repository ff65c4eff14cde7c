package charge

// The charge table's statements, next to its row: billing's claim, charge
// and settle, and maintenance, write and read the table only through
// these. The statuses are parameters, never spelled in SQL.

import (
	"context"
	"fmt"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// ForOrders reads what a claim decides on: the succeeded and the open
// (pending, in_progress) attempts of orderIDs, and every attempt of the
// events ids themselves (an event id recorded for another order is a
// mismatch). Each part is an index's (the partial unique indexes of an
// order's succeeded and open attempt, the primary key): an order's
// declined and rejected attempts are not read, and the table is never
// scanned whole, whatever its size.
func ForOrders(ctx context.Context, tx *sqlx.Tx, orderIDs []int64, ids []uuid.UUID) ([]Row, error) {
	var rows []Row
	if err := tx.SelectContext(ctx, &rows, forOrders, pq.Int64Array(orderIDs), texts(ids), Succeeded, Pending, InProgress); err != nil {
		return nil, fmt.Errorf("select charge attempts: %w", err)
	}
	return rows, nil
}

// forOrders is ForOrders' statement.
const forOrders = `SELECT ` + Columns + ` FROM charge
WHERE (order_id = ANY($1::int8[]) AND status = $3) OR (order_id = ANY($1::int8[]) AND status IN ($4, $5)) OR event_id = ANY($2::uuid[])`

// Insert records new attempts, one statement for all: pending ones, and
// rejected ones billing does not send (no payment method; LastError says
// why).
func Insert(ctx context.Context, tx *sqlx.Tx, rows []Row) error {
	if len(rows) == 0 {
		return nil
	}
	var ids, currencies, statuses, customerRefs, methodRefs, errs pq.StringArray
	var orders, customers, amounts pq.Int64Array
	var deferred pq.BoolArray
	for _, r := range rows {
		ids = append(ids, r.EventID.String())
		orders = append(orders, r.OrderID)
		customers = append(customers, r.CustomerID)
		amounts = append(amounts, r.Amount)
		currencies = append(currencies, r.Currency)
		statuses = append(statuses, r.Status)
		customerRefs = append(customerRefs, deref(r.CustomerRef))
		methodRefs = append(methodRefs, deref(r.PaymentMethodRef))
		errs = append(errs, deref(r.LastError))
		deferred = append(deferred, r.Deferred)
	}
	if _, err := tx.ExecContext(ctx, insertAttempts, ids, orders, customers, amounts, currencies, statuses,
		customerRefs, methodRefs, errs, Pending, deferred); err != nil {
		return fmt.Errorf("insert charge attempts: %w", err)
	}
	return nil
}

// Reopen makes refused attempts pending again, as new attempts, with the
// saved card rows name (a replay after the customer's card was imported):
// the provider charged nothing under them, so the idempotency window
// starts now.
func Reopen(ctx context.Context, tx *sqlx.Tx, rows []Row) error {
	if len(rows) == 0 {
		return nil
	}
	const q = `
UPDATE charge AS c SET status = $4, settled_at = NULL, created_at = now(), updated_at = now(), last_error = NULL,
    customer_ref = NULLIF(u.cref, ''), payment_method_ref = NULLIF(u.pref, ''), indeterminate = 0, decline_code = NULL
FROM unnest($1::uuid[], $2::text[], $3::text[]) AS u(id, cref, pref)
WHERE c.event_id = u.id AND c.status = $5`
	var ids, customerRefs, methodRefs pq.StringArray
	for _, r := range rows {
		ids = append(ids, r.EventID.String())
		customerRefs = append(customerRefs, deref(r.CustomerRef))
		methodRefs = append(methodRefs, deref(r.PaymentMethodRef))
	}
	if _, err := tx.ExecContext(ctx, q, ids, customerRefs, methodRefs, Pending, Rejected); err != nil {
		return fmt.Errorf("reopen refused charge attempts: %w", err)
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Count records, for each settled (succeeded or declined) attempt of ids,
// that counter counts its outcome, unless another one already does, and
// returns who counts each: counters[i] goes with ids[i].
func Count(ctx context.Context, tx *sqlx.Tx, ids []uuid.UUID, counters []string) (map[uuid.UUID]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	const q = `
UPDATE charge AS c SET counted_by = u.counter
FROM unnest($1::uuid[], $2::text[]) AS u(id, counter)
WHERE c.event_id = u.id AND c.status IN ($3, $4)
  AND (c.counted_by IS NULL OR c.counted_by = u.counter)
RETURNING c.event_id, c.counted_by`
	var counted []struct {
		EventID uuid.UUID `db:"event_id"`
		Counter string    `db:"counted_by"`
	}
	if err := tx.SelectContext(ctx, &counted, q, texts(ids), pq.StringArray(counters), Succeeded, Declined); err != nil {
		return nil, fmt.Errorf("count settled charge attempts: %w", err)
	}
	out := make(map[uuid.UUID]string, len(counted))
	for _, c := range counted {
		out[c.EventID] = c.Counter
	}
	return out, nil
}

// Settled returns the status of each attempt of ids that is no longer
// pending.
func Settled(ctx context.Context, db sqlx.QueryerContext, ids []uuid.UUID) (map[uuid.UUID]string, error) {
	const q = `SELECT event_id, status FROM charge WHERE event_id = ANY($1::uuid[]) AND status <> $2`
	var rows []struct {
		EventID uuid.UUID `db:"event_id"`
		Status  string    `db:"status"`
	}
	if err := sqlx.SelectContext(ctx, db, &rows, q, texts(ids), Pending); err != nil {
		return nil, fmt.Errorf("read settled charge attempts: %w", err)
	}
	out := make(map[uuid.UUID]string, len(rows))
	for _, r := range rows {
		out[r.EventID] = r.Status
	}
	return out, nil
}

// Answer is what became known of an attempt, to record on it: a provider
// request's answer, a notification's or a lookup's.
type Answer struct {
	EventID          uuid.UUID
	Status           string // Succeeded, Declined, Rejected, InProgress, or Pending when unanswered
	ProviderChargeID string // the provider's id, when it gave one
	DeclineCode      string // Declined: the provider's reason, "" for none
	Err              string // the refusal or the failure, "" for a charge
	// CountedBy, when the answer settles the attempt, is who counts its
	// outcome (counted_by), "" for nobody yet. A deferred attempt's is
	// always DeferredCounter: its settle counts it.
	CountedBy string
	// Requests is 1 for a provider request's answer, 0 for a
	// notification's or a lookup's.
	Requests int
	// Indeterminate: the provider stored an answer without a verdict.
	Indeterminate bool
	// ResolveAt, for InProgress, is when to ask the provider if nothing is
	// heard from it before.
	ResolveAt time.Time
}

// DeferredCounter is counted_by of a deferred attempt's settled outcome:
// the settle counted it, no message may.
const DeferredCounter = "deferred"

// Change is what a Settle changed on an attempt.
type Change struct {
	EventID  uuid.UUID `db:"event_id"`
	OrderID  int64     `db:"order_id"`
	Status   string    `db:"status"`
	Deferred bool      `db:"deferred"`
}

// Settle records answers on their attempts that are still open (an answer
// someone else recorded first wins) and returns the attempts it changed.
// A final answer (succeeded, declined, rejected) settles a pending or an
// in_progress attempt; in_progress moves a pending one there, or renews an
// in_progress one's provider id and next lookup; an unanswered request is
// counted on its pending attempt, which stays pending.
func Settle(ctx context.Context, tx *sqlx.Tx, answers []Answer) ([]Change, error) {
	if len(answers) == 0 {
		return nil, nil
	}
	const q = `
UPDATE charge AS c SET
    status             = u.status,
    provider_charge_id = COALESCE(NULLIF(u.provider_id, ''), c.provider_charge_id),
    decline_code       = NULLIF(u.decline_code, ''),
    settled_at         = CASE WHEN u.status IN ($6, $7) THEN NULL ELSE now() END,
    updated_at         = now(),
    requests           = c.requests + u.requests,
    last_error         = NULLIF(u.err, ''),
    indeterminate      = c.indeterminate + u.indeterminate::int,
    deferred           = c.deferred OR u.status = $7,
    resolve_at         = CASE WHEN u.status = $7 THEN u.resolve_at END,
    counted_by         = CASE WHEN u.status IN ($6, $7) THEN NULL
                              WHEN c.deferred THEN $8
                              ELSE NULLIF(u.counted_by, '') END
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $9::text[], $10::int[], $11::bool[], $12::timestamptz[])
    AS u(id, status, provider_id, err, counted_by, decline_code, requests, indeterminate, resolve_at)
WHERE c.event_id = u.id AND (c.status = $6 OR (c.status = $7 AND u.status <> $6))
RETURNING c.event_id, c.order_id, c.status, c.deferred`
	var ids, statuses, providerIDs, errs, countedBy, declineCodes pq.StringArray
	var requests pq.Int64Array
	var indeterminate pq.BoolArray
	var resolveAt pq.StringArray
	for _, a := range answers {
		ids = append(ids, a.EventID.String())
		statuses = append(statuses, a.Status)
		providerIDs = append(providerIDs, a.ProviderChargeID)
		errs = append(errs, a.Err)
		countedBy = append(countedBy, a.CountedBy)
		declineCodes = append(declineCodes, a.DeclineCode)
		requests = append(requests, int64(a.Requests))
		indeterminate = append(indeterminate, a.Indeterminate)
		at := a.ResolveAt
		if at.IsZero() {
			at = time.Now()
		}
		resolveAt = append(resolveAt, at.UTC().Format(time.RFC3339Nano))
	}
	var changed []Change
	if err := tx.SelectContext(ctx, &changed, q, ids, statuses, providerIDs, errs, countedBy, Pending, InProgress, DeferredCounter,
		declineCodes, requests, indeterminate, resolveAt); err != nil {
		return nil, fmt.Errorf("settle charge attempts: %w", err)
	}
	return changed, nil
}

// TakeResend takes the one re-send of a pending attempt whose request got
// an answer without a verdict (indeterminate 1 → 2), for the caller alone
// among every worker of every replica; false when another took it first.
func TakeResend(ctx context.Context, db sqlx.ExecerContext, id uuid.UUID) (bool, error) {
	const q = `UPDATE charge SET indeterminate = 2, updated_at = now() WHERE event_id = $1 AND status = $2 AND indeterminate = 1`
	res, err := db.ExecContext(ctx, q, id.String(), Pending)
	if err != nil {
		return false, fmt.Errorf("take the re-send of charge attempt %s: %w", id, err)
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// ReleaseLookups makes the lookups of ids' in_progress attempts due now:
// a worker that leased them (TakeDue) gives them back unanswered.
func ReleaseLookups(ctx context.Context, db sqlx.ExecerContext, ids []uuid.UUID) error {
	const q = `UPDATE charge SET resolve_at = now() WHERE event_id = ANY($1::uuid[]) AND status = $2`
	if _, err := db.ExecContext(ctx, q, texts(ids), InProgress); err != nil {
		return fmt.Errorf("release charge attempts' lookups: %w", err)
	}
	return nil
}

// Get reads the attempts of ids.
func Get(ctx context.Context, q sqlx.QueryerContext, ids []uuid.UUID) ([]Row, error) {
	return Select(ctx, q, `WHERE event_id = ANY($1::uuid[])`, texts(ids))
}

// TakeIdle takes up to limit pending attempts nobody has worked on for idle
// and that are younger than window, oldest touch first: it touches them
// (updated_at), which tells other maintainers, and the next run, that
// someone works on them, and skips rows another transaction holds.
func TakeIdle(ctx context.Context, tx *sqlx.Tx, idle, window time.Duration, limit int) ([]Row, error) {
	const q = `
UPDATE charge SET updated_at = now()
WHERE event_id IN (
    SELECT event_id FROM charge
    WHERE status = $1
      AND updated_at < now() - make_interval(secs => $2)
      AND created_at >= now() - make_interval(secs => $3)
    ORDER BY updated_at
    LIMIT $4
    FOR UPDATE SKIP LOCKED)
RETURNING ` + Columns
	var rows []Row
	if err := tx.SelectContext(ctx, &rows, q, Pending, idle.Seconds(), window.Seconds(), limit); err != nil {
		return nil, fmt.Errorf("touch idle charge attempts: %w", err)
	}
	return rows, nil
}

// PendingStats is what the charge table holds open.
type PendingStats struct {
	Count  int
	Oldest time.Duration // the age of the oldest pending attempt, 0 for none
	// Expired counts the pending attempts older than the window asked for.
	Expired int
	// InProgress counts the in_progress attempts, OldestInProgress is the
	// age of the oldest.
	InProgress       int
	OldestInProgress time.Duration
	// Unresolved counts the open attempts older than the window that the
	// provider cannot find: pending ones, and in_progress ones whose
	// payment billing knows no id of.
	Unresolved int
}

// CountPending counts the open attempts: pending ones, the age of the
// oldest, those created longer than window ago; in_progress ones and the
// age of the oldest; and the unresolved ones.
func CountPending(ctx context.Context, db sqlx.QueryerContext, window time.Duration) (PendingStats, error) {
	const q = `
SELECT count(*) FILTER (WHERE status = $1),
       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE status = $1)), 0)::float8,
       count(*) FILTER (WHERE status = $1 AND created_at < now() - make_interval(secs => $2)),
       count(*) FILTER (WHERE status = $3),
       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE status = $3)), 0)::float8,
       count(*) FILTER (WHERE created_at < now() - make_interval(secs => $2)
                          AND (status = $1 OR provider_charge_id IS NULL))
FROM charge WHERE status IN ($1, $3)`
	var st PendingStats
	var oldest, oldestInProgress float64
	if err := db.QueryRowxContext(ctx, q, Pending, window.Seconds(), InProgress).Scan(&st.Count, &oldest, &st.Expired,
		&st.InProgress, &oldestInProgress, &st.Unresolved); err != nil {
		return st, fmt.Errorf("count open charge attempts: %w", err)
	}
	st.Oldest = time.Duration(oldest * float64(time.Second))
	st.OldestInProgress = time.Duration(oldestInProgress * float64(time.Second))
	return st, nil
}

// TakeDue takes up to limit in_progress attempts whose next lookup is due,
// and leases them for lease (their resolve_at moves on by it), so that
// another replica does not ask about them meanwhile.
func TakeDue(ctx context.Context, tx *sqlx.Tx, lease time.Duration, limit int) ([]Row, error) {
	const q = `
UPDATE charge SET resolve_at = now() + make_interval(secs => $2)
WHERE event_id IN (
    SELECT event_id FROM charge
    WHERE status = $1 AND resolve_at <= now()
    ORDER BY resolve_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED)
RETURNING ` + Columns
	var rows []Row
	if err := tx.SelectContext(ctx, &rows, q, InProgress, lease.Seconds(), limit); err != nil {
		return nil, fmt.Errorf("take in-progress charge attempts due: %w", err)
	}
	return rows, nil
}

// TakeExpired takes up to limit pending attempts created longer than
// window ago that nobody worked on for idle and whose next lookup is due,
// oldest touch first: they are never sent again, only looked up, and the
// next lookup of each is due after pause.
func TakeExpired(ctx context.Context, tx *sqlx.Tx, idle, window, pause time.Duration, limit int) ([]Row, error) {
	const q = `
UPDATE charge SET updated_at = now(), resolve_at = now() + make_interval(secs => $5)
WHERE event_id IN (
    SELECT event_id FROM charge
    WHERE status = $1
      AND updated_at < now() - make_interval(secs => $2)
      AND created_at < now() - make_interval(secs => $3)
      AND (resolve_at IS NULL OR resolve_at <= now())
    ORDER BY updated_at
    LIMIT $4
    FOR UPDATE SKIP LOCKED)
RETURNING ` + Columns
	var rows []Row
	if err := tx.SelectContext(ctx, &rows, q, Pending, idle.Seconds(), window.Seconds(), limit, pause.Seconds()); err != nil {
		return nil, fmt.Errorf("take expired charge attempts: %w", err)
	}
	return rows, nil
}

// PendingBefore lists up to limit pending attempts created longer than
// window ago, oldest first.
func PendingBefore(ctx context.Context, db sqlx.QueryerContext, window time.Duration, limit int) ([]uuid.UUID, error) {
	const q = `SELECT event_id FROM charge WHERE status = $1 AND created_at < now() - make_interval(secs => $2) ORDER BY created_at LIMIT $3`
	var ids []uuid.UUID
	if err := sqlx.SelectContext(ctx, db, &ids, q, Pending, window.Seconds(), limit); err != nil {
		return nil, fmt.Errorf("list expired charge attempts: %w", err)
	}
	return ids, nil
}

// Wait records events that wait for their order's in_progress attempt
// (charge_waiting), to be decided when it is settled (Waiters).
func Wait(ctx context.Context, tx *sqlx.Tx, rows []Row) error {
	if len(rows) == 0 {
		return nil
	}
	const q = `
INSERT INTO charge_waiting (event_id, order_id, customer_id, amount_minor, currency)
SELECT * FROM unnest($1::uuid[], $2::int8[], $3::int8[], $4::int8[], $5::text[])
ON CONFLICT (event_id) DO NOTHING`
	var ids, currencies pq.StringArray
	var orders, customers, amounts pq.Int64Array
	for _, r := range rows {
		ids = append(ids, r.EventID.String())
		orders = append(orders, r.OrderID)
		customers = append(customers, r.CustomerID)
		amounts = append(amounts, r.Amount)
		currencies = append(currencies, r.Currency)
	}
	if _, err := tx.ExecContext(ctx, q, ids, orders, customers, amounts, currencies); err != nil {
		return fmt.Errorf("record waiting events: %w", err)
	}
	return nil
}

// Waiters returns the events waiting for orderIDs' attempts, each order's
// in the order they came. The caller holds the orders' locks.
func Waiters(ctx context.Context, tx *sqlx.Tx, orderIDs []int64) ([]Row, error) {
	const q = `
SELECT event_id, order_id, customer_id, amount_minor, currency, created_at FROM charge_waiting
WHERE order_id = ANY($1::int8[]) ORDER BY order_id, created_at, event_id`
	var rows []Row
	if err := tx.SelectContext(ctx, &rows, q, pq.Int64Array(orderIDs)); err != nil {
		return nil, fmt.Errorf("read waiting events: %w", err)
	}
	return rows, nil
}

// Unwait removes events from charge_waiting: they are decided.
func Unwait(ctx context.Context, tx *sqlx.Tx, ids []uuid.UUID) error {
	if len(ids) == 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM charge_waiting WHERE event_id = ANY($1::uuid[])`, texts(ids)); err != nil {
		return fmt.Errorf("remove decided waiting events: %w", err)
	}
	return nil
}

func texts(ids []uuid.UUID) pq.StringArray {
	out := make(pq.StringArray, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}
