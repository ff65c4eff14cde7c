package charge

// The statements of billing resolve: an operator's decision on an attempt
// billing cannot settle by itself. A verdict goes through billing's settle
// (Settle, like any answer); sending the attempt again is the one change
// outside it, and it is here.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
)

// Aged is an attempt with its age by the database's clock, so that an
// operator's clock does not decide whether a request may be in flight.
type Aged struct {
	Row
	// Age is how long ago the attempt was created: its idempotency
	// window's start.
	Age time.Duration
}

// ErrNoAttempt: the charge table has no attempt of the event.
var ErrNoAttempt = errors.New("no charge attempt of the event")

// GetAged reads attempt id with its ages.
func GetAged(ctx context.Context, q sqlx.QueryerContext, id uuid.UUID) (Aged, error) {
	var r struct {
		Row
		Age float64 `db:"age_s"`
	}
	err := sqlx.GetContext(ctx, q, &r, `SELECT `+Columns+`, extract(epoch FROM now() - created_at)::float8 AS age_s
FROM charge WHERE event_id = $1`, id.String())
	if errors.Is(err, sql.ErrNoRows) {
		return Aged{}, fmt.Errorf("%w %s", ErrNoAttempt, id)
	}
	if err != nil {
		return Aged{}, fmt.Errorf("read charge attempt %s: %w", id, err)
	}
	return Aged{Row: r.Row, Age: time.Duration(r.Age * float64(time.Second))}, nil
}

// SendAgain makes the open attempt id a new pending attempt under the same
// key, for recovery to send at its next round: the provider has no payment
// for it and forgot the key, so the same key starts a new payment. Its
// idempotency window starts now; note is its last_error. It changes an
// attempt only while nothing can be in flight for it: in progress with no
// provider id, or pending and created longer than quiet ago (the caller's
// rule, repeated here so that a change between its check and this
// statement is not overwritten). It reports whether it changed it.
func SendAgain(ctx context.Context, db sqlx.ExecerContext, id uuid.UUID, note string, quiet time.Duration) (bool, error) {
	const q = `
UPDATE charge SET status = $2, created_at = now(), updated_at = '-infinity', settled_at = NULL, resolve_at = NULL,
    indeterminate = 0, last_error = $3
WHERE event_id = $1 AND provider_charge_id IS NULL
  AND (status = $4 OR (status = $2 AND created_at < now() - make_interval(secs => $5)))`
	res, err := db.ExecContext(ctx, q, id.String(), Pending, note, InProgress, quiet.Seconds())
	if err != nil {
		return false, fmt.Errorf("send charge attempt %s again: %w", id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("send charge attempt %s again: %w", id, err)
	}
	return n == 1, nil
}
