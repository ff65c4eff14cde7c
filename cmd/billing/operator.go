package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/jmoiron/sqlx"

	"example.com/billing/internal/audit"
)

// operator is who acts and why, for a command that changes money-relevant
// state: --by and --reason, which the command records in operator_action,
// with what it is about to do, before it acts (billing audit lists them,
// billing explain shows those on an event or an order).
type operator struct {
	command string // "dlq replay", "resolve", ...
	by      *string
	reason  *string
}

// operatorFlags adds --by and --reason to fs, the flags of command.
func operatorFlags(fs *flag.FlagSet, command string) operator {
	return operator{
		command: command,
		by:      fs.String("by", "", "who acts, recorded in operator_action (default: the operating system's user)"),
		reason:  fs.String("reason", "", "why (required): recorded in operator_action with who and what, before the command acts; billing audit lists it"),
	}
}

// check fails, naming the command, when who or why is missing: before the
// command reads its configuration or connects to anything.
func (o operator) check() error {
	if *o.by == "" {
		*o.by = audit.DefaultBy()
	}
	if err := audit.Check(*o.by, *o.reason); err != nil {
		return fmt.Errorf("%s: %w", o.command, err)
	}
	return nil
}

// record records that the operator is about to act on subject, with
// details, and returns the action as recorded. An error means the command
// must not act; the caller says what it did not do.
func (o operator) record(ctx context.Context, db sqlx.QueryerContext, subject string, details any) (audit.Action, error) {
	return audit.Record(ctx, db, audit.Action{By: *o.by, Reason: *o.reason, Command: o.command, Subject: subject}, details)
}
