package postgres

import (
	"context"
	"database/sql/driver"
	"fmt"
	"strconv"

	"github.com/jmoiron/sqlx"
)

// Lock is the key of a PostgreSQL session advisory lock: several processes
// (replicas of serve, the maintain CronJob, concurrent migrate runs) take
// it so that one of them at a time does a job.
type Lock int64

// Every advisory lock billing takes, in one block so that no two collide.
// A key is the ASCII of its name ("billdedu"), which String shows.
//
// The values must never change: during a rolling update the old version
// and the new one run side by side, and they exclude each other only if
// they take the same key.
const (
	// LockDedupRetention: one maintainer of processed_event at a time
	// (dedup.Retention).
	LockDedupRetention Lock = 0x62696c6c_64656475 // "billdedu"
	// LockOutboxRetention: one maintainer of the outbox at a time
	// (outbox.Retention).
	LockOutboxRetention Lock = 0x62696c6c_6f757472 // "billoutr"
	// LockOutboxRelay: one relay at a time (outbox.Relay), so that a single
	// publisher keeps each order's outcome events in order.
	LockOutboxRelay Lock = 0x62696c6c_6f757462 // "billoutb"
	// LockMigrations: one migrate at a time (Migrate). It is goose's
	// default key, which every earlier version took, written out so that
	// a goose upgrade cannot change it.
	LockMigrations Lock = 4097083626
)

// OrderLockSpace is the first key of the two-key transaction locks that
// serialize the claims of one order (pg_advisory_xact_lock(OrderLockSpace,
// hashint8(order_id))). PostgreSQL keeps two-key locks apart from one-key
// ones, so they never collide with the locks above.
const OrderLockSpace int32 = 0x62696c6c // "bill"

// String is the lock's name: its key's bytes when they are printable ASCII
// (a name such as "billdedu"), else the number.
func (l Lock) String() string {
	var name [8]byte
	for i := range name {
		b := byte(uint64(l) >> (56 - 8*i))
		if b < ' ' || b > '~' {
			return strconv.FormatInt(int64(l), 10)
		}
		name[i] = b
	}
	return string(name[:])
}

// WithSessionLock runs fn on a connection of its own while that session
// holds the advisory lock key, and reports whether it ran fn: when another
// session holds the lock, it returns false at once.
//
// The lock must not outlive fn: a connection that went back to the pool
// holding it would keep it, unseen, until the pool closed that connection,
// and every later WithSessionLock would skip. So the lock is released with
// pg_advisory_unlock when fn succeeded, and by ending the session (which
// releases its locks) in every other case: fn failed (the connection may be
// broken), ctx ended (a shutdown must not wait for a database that does not
// answer), the unlock failed, or taking the lock failed without saying
// whether the server granted it.
func WithSessionLock(ctx context.Context, db *sqlx.DB, key Lock, fn func(conn *sqlx.Conn) error) (bool, error) {
	conn, err := db.Connx(ctx)
	if err != nil {
		return false, fmt.Errorf("connection for lock %s: %w", key, err)
	}
	defer conn.Close()
	// A session holding a lock must end once its client is gone: over a
	// cut network the server otherwise keeps the idle session, and its
	// lock, until the operating system's keepalive gives up (two hours by
	// default), and no other replica takes the job meanwhile. The server
	// probes a silent client after 5 s and ends the session after 3
	// unanswered probes 2 s apart.
	if _, err := conn.ExecContext(ctx, `SELECT set_config('tcp_keepalives_idle', '5', false),
		set_config('tcp_keepalives_interval', '2', false), set_config('tcp_keepalives_count', '3', false)`); err != nil {
		discard(conn)
		return false, fmt.Errorf("keepalive of the session for lock %s: %w", key, err)
	}
	var locked bool
	if err := conn.GetContext(ctx, &locked, `SELECT pg_try_advisory_lock($1)`, int64(key)); err != nil {
		discard(conn)
		return false, fmt.Errorf("lock %s: %w", key, err)
	}
	if !locked {
		return false, nil
	}
	if err := fn(conn); err != nil || ctx.Err() != nil {
		discard(conn)
		return true, err
	}
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_unlock($1)`, int64(key)); err != nil {
		discard(conn)
	}
	return true, nil
}

// discard ends conn's session instead of returning it to the pool: the
// pool drops a connection whose driver reports it bad.
func discard(conn *sqlx.Conn) {
	conn.Raw(func(any) error { return driver.ErrBadConn }) //nolint:errcheck // the error is the point
}
