// Package audit records what operators did to money-relevant state, in the
// append-only operator_action table: who (--by), why (--reason), what (the
// command and its subject) and when. Every command that changes such state
// records one action before it acts (pause, resume, dlq replay,
// payment-methods import, an attempt resolved by hand, maintain dropping
// data early); billing audit lists them and billing explain shows those on
// an event or order.
package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// Action is one row of operator_action.
type Action struct {
	ID      int64           `db:"id" json:"id"`
	At      time.Time       `db:"at" json:"at"`
	By      string          `db:"by" json:"by"`
	Reason  string          `db:"reason" json:"reason"`
	Command string          `db:"command" json:"command"`
	Subject string          `db:"subject" json:"subject,omitempty"`
	Details json.RawMessage `db:"details" json:"details,omitempty"`
}

// ErrNoReason: an action without a --reason is not recorded, and the
// command does not act.
var ErrNoReason = errors.New("--reason is required: say why, for whoever reads billing audit later")

// maxText bounds by and reason: a sentence, not a document.
const maxText = 1000

// Check validates who and why before a command acts.
func Check(by, reason string) error {
	switch {
	case strings.TrimSpace(reason) == "":
		return ErrNoReason
	case strings.TrimSpace(by) == "":
		return errors.New("--by is empty; name who acts (default: the operating system's user)")
	case len(reason) > maxText || len(by) > maxText:
		return fmt.Errorf("--by and --reason are limited to %d bytes", maxText)
	}
	return nil
}

// Record inserts a, with details (any value that marshals to a JSON
// object, nil for none), and returns it as recorded.
func Record(ctx context.Context, q sqlx.QueryerContext, a Action, details any) (Action, error) {
	if err := Check(a.By, a.Reason); err != nil {
		return a, err
	}
	raw := json.RawMessage(`{}`)
	if details != nil {
		b, err := json.Marshal(details)
		if err != nil {
			return a, fmt.Errorf("audit: details: %w", err)
		}
		raw = b
	}
	const stmt = `
INSERT INTO operator_action (by, reason, command, subject, details) VALUES ($1, $2, $3, $4, $5::jsonb)
RETURNING id, at, by, reason, command, subject, details`
	var out Action
	if err := sqlx.GetContext(ctx, q, &out, stmt, strings.TrimSpace(a.By), strings.TrimSpace(a.Reason), a.Command, a.Subject, string(raw)); err != nil {
		return a, fmt.Errorf("record the operator action in operator_action: %w", err)
	}
	return out, nil
}

// Since lists the actions recorded at or after since, oldest first.
func Since(ctx context.Context, q sqlx.QueryerContext, since time.Time) ([]Action, error) {
	var out []Action
	if err := sqlx.SelectContext(ctx, q, &out, `SELECT id, at, by, reason, command, subject, details FROM operator_action WHERE at >= $1 ORDER BY id`, since); err != nil {
		return nil, fmt.Errorf("read operator_action: %w", err)
	}
	return out, nil
}

// About lists the actions on any of subjects (event ids, order ids),
// oldest first.
func About(ctx context.Context, q sqlx.QueryerContext, subjects []string) ([]Action, error) {
	var out []Action
	if err := sqlx.SelectContext(ctx, q, &out, `SELECT id, at, by, reason, command, subject, details FROM operator_action WHERE subject = ANY($1::text[]) ORDER BY id`, pq.StringArray(subjects)); err != nil {
		return nil, fmt.Errorf("read operator_action: %w", err)
	}
	return out, nil
}

// Get reads the actions of ids, oldest first: those a record elsewhere
// names (a message republished by billing dlq replay carries its action's
// id).
func Get(ctx context.Context, q sqlx.QueryerContext, ids []int64) ([]Action, error) {
	var out []Action
	if err := sqlx.SelectContext(ctx, q, &out, `SELECT id, at, by, reason, command, subject, details FROM operator_action WHERE id = ANY($1::int8[]) ORDER BY id`, pq.Int64Array(ids)); err != nil {
		return nil, fmt.Errorf("read operator_action: %w", err)
	}
	return out, nil
}

// Text is a for a human, on three lines: its id, when (UTC), who, the
// command and its subject; why; what (its details).
func (a Action) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d  %s  %s  %s", a.ID, a.At.UTC().Format(time.RFC3339), a.By, a.Command)
	if a.Subject != "" {
		fmt.Fprintf(&b, "  %s", a.Subject)
	}
	fmt.Fprintf(&b, "\n    why:  %s", a.Reason)
	if len(a.Details) > 0 && string(a.Details) != "{}" {
		var compact bytes.Buffer
		if json.Compact(&compact, a.Details) != nil {
			compact.Reset()
			compact.Write(a.Details)
		}
		fmt.Fprintf(&b, "\n    what: %s", compact.String())
	}
	return b.String()
}

// DefaultBy is --by's default: the operating system's user, else $USER.
func DefaultBy() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return os.Getenv("USER")
}
