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

// ForOrders reads what a claim decides on: the succeeded and the pending
// attempts of orderIDs, and every attempt of the events ids themselves (an
// event id recorded for another order is a mismatch). Each part is an
// index's (the partial unique indexes of an order's succeeded and pending
// attempt, the primary key): an order's declined and rejected attempts are
// not read, and the table is never scanned whole, whatever its size.
func ForOrders(ctx context.Context, tx *sqlx.Tx, orderIDs []int64, ids []uuid.UUID) ([]Row, error) {
	var rows []Row
	if err := tx.SelectContext(ctx, &rows, forOrders, pq.Int64Array(orderIDs), texts(ids), Succeeded, Pending); err != nil {
		return nil, fmt.Errorf("select charge attempts: %w", err)
	}
	return rows, nil
}

// forOrders is ForOrders' statement.
const forOrders = `SELECT ` + Columns + ` FROM charge
WHERE (order_id = ANY($1::int8[]) AND status = $3) OR (order_id = ANY($1::int8[]) AND status = $4) OR event_id = ANY($2::uuid[])`

// InsertPending records new attempts, pending, one statement for all.
func InsertPending(ctx context.Context, tx *sqlx.Tx, rows []Row) error {
	if len(rows) == 0 {
		return nil
	}
	var ids, currencies pq.StringArray
	var orders, customers, amounts pq.Int64Array
	for _, r := range rows {
		ids = append(ids, r.EventID.String())
		orders = append(orders, r.OrderID)
		customers = append(customers, r.CustomerID)
		amounts = append(amounts, r.Amount)
		currencies = append(currencies, r.Currency)
	}
	if _, err := tx.ExecContext(ctx, insertPending, ids, orders, customers, amounts, currencies, Pending); err != nil {
		return fmt.Errorf("insert charge attempts: %w", err)
	}
	return nil
}

// Reopen makes refused attempts pending again, as new attempts: the
// provider charged nothing under them, so the idempotency window starts
// now.
func Reopen(ctx context.Context, tx *sqlx.Tx, ids []uuid.UUID) error {
	if len(ids) == 0 {
		return nil
	}
	const q = `
UPDATE charge SET status = $2, settled_at = NULL, created_at = now(), updated_at = now()
WHERE event_id = ANY($1::uuid[]) AND status = $3`
	if _, err := tx.ExecContext(ctx, q, texts(ids), Pending, Rejected); err != nil {
		return fmt.Errorf("reopen refused charge attempts: %w", err)
	}
	return nil
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

// Answer is what one provider request came back with, to record on its
// attempt.
type Answer struct {
	EventID          uuid.UUID
	Status           string // Succeeded, Declined, Rejected, or Pending when unanswered
	ProviderChargeID string // Succeeded
	Err              string // the refusal or the failure, "" for a charge
	// CountedBy, when the answer settles the attempt, is who counts its
	// outcome (counted_by), "" for nobody yet.
	CountedBy string
}

// Settle records answers on their attempts that are still pending (an
// answer someone else recorded first wins) and returns the attempts it
// changed, with their new status; an unanswered request is counted on its
// attempt, which stays pending.
func Settle(ctx context.Context, tx *sqlx.Tx, answers []Answer) (map[uuid.UUID]string, error) {
	if len(answers) == 0 {
		return nil, nil
	}
	const q = `
UPDATE charge AS c SET
    status             = u.status,
    provider_charge_id = NULLIF(u.provider_id, ''),
    settled_at         = CASE WHEN u.status = $6 THEN NULL ELSE now() END,
    updated_at         = now(),
    requests           = c.requests + 1,
    last_error         = NULLIF(u.err, ''),
    counted_by         = CASE WHEN u.status = $6 THEN NULL ELSE NULLIF(u.counted_by, '') END
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[]) AS u(id, status, provider_id, err, counted_by)
WHERE c.event_id = u.id AND c.status = $6
RETURNING c.event_id, c.status`
	var ids, statuses, providerIDs, errs, countedBy pq.StringArray
	for _, a := range answers {
		ids = append(ids, a.EventID.String())
		statuses = append(statuses, a.Status)
		providerIDs = append(providerIDs, a.ProviderChargeID)
		errs = append(errs, a.Err)
		countedBy = append(countedBy, a.CountedBy)
	}
	var changed []struct {
		EventID uuid.UUID `db:"event_id"`
		Status  string    `db:"status"`
	}
	if err := tx.SelectContext(ctx, &changed, q, ids, statuses, providerIDs, errs, countedBy, Pending); err != nil {
		return nil, fmt.Errorf("settle charge attempts: %w", err)
	}
	out := make(map[uuid.UUID]string, len(changed))
	for _, c := range changed {
		out[c.EventID] = c.Status
	}
	return out, nil
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

// PendingStats is what the charge table holds pending.
type PendingStats struct {
	Count  int
	Oldest time.Duration // the age of the oldest pending attempt, 0 for none
	// Expired counts the pending attempts older than the window asked for.
	Expired int
}

// CountPending counts the pending attempts, the age of the oldest, and those
// created longer than window ago.
func CountPending(ctx context.Context, db sqlx.QueryerContext, window time.Duration) (PendingStats, error) {
	const q = `
SELECT count(*),
       coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8,
       count(*) FILTER (WHERE created_at < now() - make_interval(secs => $2))
FROM charge WHERE status = $1`
	var st PendingStats
	var oldest float64
	if err := db.QueryRowxContext(ctx, q, Pending, window.Seconds()).Scan(&st.Count, &oldest, &st.Expired); err != nil {
		return st, fmt.Errorf("count pending charge attempts: %w", err)
	}
	st.Oldest = time.Duration(oldest * float64(time.Second))
	return st, nil
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

func texts(ids []uuid.UUID) pq.StringArray {
	out := make(pq.StringArray, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}
