package postgres

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"
)

// Sessions is how a pool's connections map to PostgreSQL's server sessions.
type Sessions int

const (
	// OwnSessions: each connection keeps a server session of its own, for
	// as long as it lives: PostgreSQL itself, or a pooler in session mode.
	OwnSessions Sessions = iota + 1
	// SharedSessions: connections share server sessions, each statement
	// or transaction running on whichever is free: a pooler in transaction
	// mode (PgBouncer's pool_mode=transaction, CloudNativePG's Pooler with
	// poolMode: transaction) or statement mode. Nothing of a session's
	// state (a session advisory lock, a SET, a named prepared statement)
	// survives the statement or transaction that made it.
	SharedSessions
	// SharedStatements: a pooler in statement mode, which lends a server
	// session for one statement and refuses transactions of several.
	SharedStatements
)

func (s Sessions) String() string {
	switch s {
	case OwnSessions:
		return "own sessions (each connection keeps a server session of its own: direct, or a pooler in session mode)"
	case SharedSessions:
		return "shared sessions (connections share server sessions: a pooler in transaction mode)"
	case SharedStatements:
		return "shared sessions, statement by statement (a pooler in statement mode, which refuses transactions)"
	}
	return "unknown"
}

// Mode is the pool mode a Sessions means: "session", "transaction" or
// "statement".
func (s Sessions) Mode() string {
	switch s {
	case SharedSessions:
		return "transaction"
	case SharedStatements:
		return "statement"
	}
	return "session"
}

// sessionProbes is how many times DetectSessions asks each of its two
// connections for its server process.
const sessionProbes = 3

// DetectSessions tells how db's connections map to server sessions: it
// asks two connections of its own, in turns, which server process serves
// them (pg_backend_pid). A connection served by two processes, or two
// connections by one, share server sessions. A pooler in transaction mode
// hands the server session a statement just released to the next one that
// asks (PgBouncer reuses the most recent first), so the turns meet on one
// within a round or two.
func DetectSessions(ctx context.Context, db *sqlx.DB) (Sessions, error) {
	a, err := db.Connx(ctx)
	if err != nil {
		return 0, fmt.Errorf("detect the pool mode: %w", err)
	}
	defer a.Close()
	b, err := db.Connx(ctx)
	if err != nil {
		return 0, fmt.Errorf("detect the pool mode: %w", err)
	}
	defer b.Close()
	var firstA, firstB int
	for i := range sessionProbes {
		var pa, pb int
		if err := a.GetContext(ctx, &pa, `SELECT pg_backend_pid()`); err != nil {
			return 0, fmt.Errorf("detect the pool mode: %w", err)
		}
		if err := b.GetContext(ctx, &pb, `SELECT pg_backend_pid()`); err != nil {
			return 0, fmt.Errorf("detect the pool mode: %w", err)
		}
		if i == 0 {
			firstA, firstB = pa, pb
		}
		if pa == pb || pa != firstA || pb != firstB {
			return sharedMode(ctx, a)
		}
	}
	return OwnSessions, nil
}

// sharedMode tells a pooler in transaction mode from one in statement
// mode, which refuses a transaction of more than one statement: PgBouncer
// answers BEGIN with a FATAL error ("transaction blocks not allowed in
// statement pooling mode") and closes the connection, which lib/pq reports
// as a bad connection, its message dropped.
func sharedMode(ctx context.Context, conn *sqlx.Conn) (Sessions, error) {
	tx, err := conn.BeginTxx(ctx, nil)
	if err == nil {
		var one int
		err = tx.GetContext(ctx, &one, `SELECT 1`)
		_ = tx.Rollback()
	}
	switch {
	case err == nil:
		return SharedSessions, nil
	case errors.Is(err, driver.ErrBadConn) || strings.Contains(err.Error(), "statement pooling mode"):
		return SharedStatements, nil
	}
	return 0, fmt.Errorf("detect the pool mode: %w", err)
}

// ErrUnnamedStatements: lib/pq without binary_parameters sends each
// parameterised statement in two round trips (the server first describes
// the parameters, then the statement runs), and a transaction pooler may
// give the two to two server sessions: the second then fails with
// "unnamed prepared statement does not exist".
var ErrUnnamedStatements = errors.New("DATABASE_URL sets binary_parameters=no, with which lib/pq sends a parameterised statement in two round trips; a pooler in transaction mode may give them to two server sessions (unnamed prepared statement does not exist): remove binary_parameters from DATABASE_URL, or use session pooling")

// CheckSessions returns an error naming the pool mode when billing cannot
// run on db's server sessions as found (sessions), nil when it can: on
// shared sessions, everything billing does holds within a statement or a
// transaction (leases, SET LOCAL, transaction advisory locks, unnamed
// statements sent in one round trip), as long as dsn keeps
// binary_parameters.
func CheckSessions(sessions Sessions, dsn string) error {
	if sessions == SharedStatements {
		return fmt.Errorf("pool mode %s: billing claims and settles in transactions of several statements, which a pooler in statement mode refuses: use transaction (or session) mode", sessions.Mode())
	}
	if sessions == SharedSessions && !BinaryParameters(dsn) {
		return fmt.Errorf("pool mode %s: %w", sessions.Mode(), ErrUnnamedStatements)
	}
	return nil
}
