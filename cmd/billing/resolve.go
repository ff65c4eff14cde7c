package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/gofrs/uuid/v5"
	"github.com/prometheus/client_golang/prometheus"

	"example.com/billing/internal/billing"
	"example.com/billing/internal/charge"
	"example.com/billing/internal/config"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/postgres"
)

const resolveHelp = `
Records a human's decision on a charge attempt billing cannot settle by
itself: one older than PAYMENT_IDEMPOTENCY_WINDOW that the provider cannot
find, or in progress with no provider id (billing_charge_attempts_unresolved;
docs/operations.md, "an unresolved charge attempt"). Look the payment up at
the provider first, then:

  --outcome succeeded --provider-id ID   the provider charged it (ID: its
                                         payment, pi_..., ch_..., a
                                         pspReference)
  --outcome declined [--decline-code C]  the provider declined it, or the
                                         order is not to be charged
  --outcome resend                       the provider has no payment and
                                         forgot the key: send the attempt
                                         again, as a new request under the
                                         same key

A verdict goes through billing's own settle, as a webhook's would: the
attempt leaves pending or in_progress once, its outcome event
(payment.succeeded.v1 or payment.declined.v1) is recorded in the same
transaction, a deferred outcome is counted, and the events waiting for the
order are decided (already charged, or the next becomes the order's
attempt). resend makes it pending again with a new window; serve's
recovery sends it at its next round and settles it like any other.

It refuses an attempt billing may still send: a pending one younger than
PAYMENT_IDEMPOTENCY_WINDOW + PAYMENT_RECOVER_AFTER (no request starts past
the window, and one started before is answered within PAYMENT_TIMEOUT). It
refuses to resend an attempt the provider has an id for (record that
payment's outcome instead). Give it serve's PAYMENT_* values.

Before it changes anything it records who (--by), why (--reason, required)
and what in operator_action; when the record fails, nothing changes.
billing audit lists it, billing explain shows it on the event.`

// resolveRecord is what resolve records in operator_action before it acts.
type resolveRecord struct {
	OrderID          int64  `json:"orderId"`
	Was              string `json:"was"`
	Outcome          string `json:"outcome"`
	ProviderChargeID string `json:"providerChargeId,omitempty"`
	DeclineCode      string `json:"declineCode,omitempty"`
}

// resolveCmd records an operator's verdict on a charge attempt.
func resolveCmd(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	var cfg config.Resolve
	fs := newFlagSet("resolve", about{synopsis: "<eventId> --outcome succeeded|declined|resend --reason TEXT [flags]", description: resolveHelp, env: &cfg,
		example: `DATABASE_URL=... PAYMENT_PROVIDER=stripe billing resolve 0190f3a2-... --outcome succeeded --provider-id pi_3Q... --reason "INC-42: paid, says the Dashboard"`})
	outcome := fs.String("outcome", "", "succeeded, declined or resend (required)")
	providerID := fs.String("provider-id", "", "succeeded: the provider's id of the payment (required unless the attempt records one)")
	declineCode := fs.String("decline-code", "", "declined: the provider's decline code, if any (it goes into payment.declined.v1)")
	op := operatorFlags(fs, "resolve")
	arg, help, err := parseWithArgument(fs, args, stdout)
	if help || err != nil {
		return err
	}
	id, err := uuid.FromString(arg)
	if err != nil {
		return fmt.Errorf("resolve: %q is not an event id (a UUID)", arg)
	}
	v := billing.Verdict{Outcome: *outcome, ProviderChargeID: *providerID, DeclineCode: *declineCode}
	switch {
	case v.Outcome != charge.Succeeded && v.Outcome != charge.Declined && v.Outcome != billing.Resend:
		return fmt.Errorf("resolve: --outcome must be succeeded, declined or resend, got %q", v.Outcome)
	case v.ProviderChargeID != "" && v.Outcome != charge.Succeeded:
		return errors.New("resolve: --provider-id goes with --outcome succeeded")
	case v.DeclineCode != "" && v.Outcome != charge.Declined:
		return errors.New("resolve: --decline-code goes with --outcome declined")
	}
	if err := op.check(); err != nil {
		return err
	}
	if err := config.Load(environ, &cfg); err != nil {
		return err
	}
	log := newLogger(stderr, cfg.Log)
	db, err := postgres.Open(cfg.Database.URL, 2)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer db.Close()
	hand := billing.NewHand(db, walletOf(cfg.Provider), billing.Horizon{ProviderWindow: cfg.IdempotencyWindow},
		cfg.RecoverAfter, metrics.New(prometheus.NewRegistry()), log)

	a, err := hand.Check(ctx, id, v)
	if err != nil {
		if postgres.IsConfigError(err) {
			return fmt.Errorf("DATABASE_URL: %w", err)
		}
		return fmt.Errorf("resolve: nothing done: %w", err)
	}
	action, err := op.record(ctx, db, id.String(), resolveRecord{OrderID: a.OrderID, Was: a.Status, Outcome: v.Outcome,
		ProviderChargeID: v.ProviderChargeID, DeclineCode: v.DeclineCode})
	if err != nil {
		return fmt.Errorf("resolve: nothing done: %w", err)
	}
	v.Note = fmt.Sprintf("resolved by hand (operator action %d)", action.ID)
	if v.Outcome == billing.Resend {
		v.Note += ": the provider has no payment; sent again"
	}
	got, err := hand.Record(ctx, a.Row, v)
	if err != nil {
		return fmt.Errorf("resolve: operator action %d recorded, attempt %s unchanged: %w", action.ID, id, err)
	}
	log.Info("charge attempt resolved by hand", "event_id", id.String(), "order_id", got.OrderID, "was", a.Status,
		"status", got.Status, "action", action.ID, "by", action.By)
	switch v.Outcome {
	case billing.Resend:
		fmt.Fprintf(stdout, "attempt %s of order %d: %s -> pending, a new request under the same key; serve's recovery sends it at its next round (operator action %d)\n",
			id, got.OrderID, a.Status, action.ID)
	default:
		fmt.Fprintf(stdout, "attempt %s of order %d: %s -> %s; its outcome event is recorded and the order's waiting events decided (operator action %d)\n",
			id, got.OrderID, a.Status, got.Status, action.ID)
	}
	return nil
}
