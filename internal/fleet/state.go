package fleet

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"

	"example.com/billing/internal/audit"
	"example.com/billing/internal/postgres"
)

// State is a group's charging state: running, or paused by an operator.
type State struct {
	Paused bool `json:"paused"`
	// Version grows by one at every change; 0: never set (running).
	Version int64 `json:"version"`
	// Since is when the group entered this state, For how long ago that
	// was by the database's clock; zero when never set.
	Since time.Time     `json:"since,omitzero"`
	For   time.Duration `json:"-"`
	// By and Reason are the operator's who set it, ActionID its
	// operator_action.
	By       string `json:"by,omitempty"`
	Reason   string `json:"reason,omitempty"`
	ActionID int64  `json:"actionId,omitempty"`
}

// stateRow is charging_state's row with its operator action.
type stateRow struct {
	Paused   bool           `db:"paused"`
	Version  int64          `db:"version"`
	Since    time.Time      `db:"changed_at"`
	For      float64        `db:"for_seconds"`
	ActionID int64          `db:"action_id"`
	By       sql.NullString `db:"by"`
	Reason   sql.NullString `db:"reason"`
}

// readState reads group's charging state; locked, it stays so until the
// transaction ends.
func readState(ctx context.Context, q sqlx.QueryerContext, group string, lock bool) (State, error) {
	query := `
SELECT s.paused, s.version, s.changed_at, extract(epoch FROM now() - s.changed_at)::float8 AS for_seconds, s.action_id, a.by, a.reason
FROM charging_state s LEFT JOIN operator_action a ON a.id = s.action_id
WHERE s.consumer_group = $1`
	if lock {
		query += ` FOR UPDATE OF s`
	}
	var r stateRow
	err := sqlx.GetContext(ctx, q, &r, query, group)
	if errors.Is(err, sql.ErrNoRows) {
		return State{}, nil
	}
	if err != nil {
		return State{}, fmt.Errorf("read the charging state: %w", err)
	}
	return State{Paused: r.Paused, Version: r.Version, Since: r.Since, For: time.Duration(r.For * float64(time.Second)),
		By: r.By.String, Reason: r.Reason.String, ActionID: r.ActionID}, nil
}

// ReadState returns group's charging state.
func ReadState(ctx context.Context, db sqlx.QueryerContext, group string) (State, error) {
	return readState(ctx, db, group, false)
}

// SetCharging pauses group's charging (paused) or resumes it, and records
// the operator's action a (who, why; its command and subject are set
// here) in the same transaction, with whether it changed anything. It
// returns the state in force and the action as recorded. Pausing a paused
// group (resuming a running one) is recorded and changes nothing: the
// state keeps its version and its time.
func SetCharging(ctx context.Context, db *sqlx.DB, group string, paused bool, a audit.Action) (State, audit.Action, error) {
	a.Command, a.Subject = "resume", group
	if paused {
		a.Command = "pause"
	}
	if err := audit.Check(a.By, a.Reason); err != nil {
		return State{}, a, err
	}
	var st State
	err := postgres.InTx(ctx, db, func(tx *sqlx.Tx) error {
		before, err := readState(ctx, tx, group, true)
		if err != nil {
			return err
		}
		changed := before.Paused != paused
		details := map[string]any{"paused": paused, "changed": changed, "version": before.Version}
		if changed {
			details["version"] = before.Version + 1
		}
		if a, err = audit.Record(ctx, tx, a, details); err != nil {
			return err
		}
		if changed {
			// Two operators' first pause at once: the second meets the
			// first's row and waits for it, then raises its version.
			const q = `
INSERT INTO charging_state AS s (consumer_group, paused, version, changed_at, action_id) VALUES ($1, $2, 1, now(), $3)
ON CONFLICT (consumer_group) DO UPDATE SET paused = excluded.paused, version = s.version + 1, changed_at = excluded.changed_at, action_id = excluded.action_id`
			if _, err := tx.ExecContext(ctx, q, group, paused, a.ID); err != nil {
				return fmt.Errorf("set the charging state: %w", err)
			}
		}
		st, err = readState(ctx, tx, group, false)
		return err
	})
	if err != nil {
		return State{}, a, err
	}
	return st, a, nil
}

// Replica is a live member of a fleet as it last renewed.
type Replica struct {
	Instance uuid.UUID `db:"instance" json:"instance"`
	// Share is its share of the budget, in requests per second.
	Share float64 `db:"share" json:"share"`
	// Applies is the version of the charging state it applies, Paused
	// whether that is a pause.
	Applies   int64     `db:"applied_version" json:"applies"`
	Paused    bool      `db:"paused" json:"paused"`
	RenewedAt time.Time `db:"renewed_at" json:"renewedAt"`
}

// Replicas lists group's live members (their share not expired), oldest
// renewal first.
func Replicas(ctx context.Context, db sqlx.QueryerContext, group string) ([]Replica, error) {
	var out []Replica
	const q = `
SELECT instance, share, applied_version, paused, renewed_at FROM fleet_member
WHERE consumer_group = $1 AND expires_at > now() ORDER BY renewed_at`
	if err := sqlx.SelectContext(ctx, db, &out, q, group); err != nil {
		return nil, fmt.Errorf("list the fleet's members: %w", err)
	}
	return out, nil
}
