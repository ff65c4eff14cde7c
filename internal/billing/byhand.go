package billing

// An attempt billing cannot settle by itself (the provider finds no payment
// for it, or billing knows no id to ask about) waits for a human, who
// looks at the provider and decides (billing resolve). The decision is
// recorded as any answer is: through the settle, which moves the attempt
// out of pending or in_progress once, records its outcome event in the
// same transaction, counts a deferred outcome and decides the order's
// waiting events. Never by a bare UPDATE, which would announce nothing and
// leave the waiting events waiting for ever.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel/trace/noop"

	"example.com/billing/internal/charge"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/payment"
)

// Resend is the Verdict outcome of an attempt the provider has no payment
// for, to be sent again as a new request under the same key (the provider
// forgot it).
const Resend = "resend"

// Verdict is what an operator decided about an open attempt.
type Verdict struct {
	// Outcome is charge.Succeeded, charge.Declined or Resend.
	Outcome string
	// ProviderChargeID, for Succeeded, is the provider's id of the
	// payment; it may be left out when the attempt records one.
	ProviderChargeID string
	// DeclineCode, for Declined, is the provider's reason, if any; it goes
	// into the payment.declined.v1 event.
	DeclineCode string
	// Note is what the attempt's last_error says of the decision
	// (declined, resend), e.g. the operator action that recorded it.
	Note string
}

// Hand records the verdicts operators give on attempts billing cannot
// settle by itself.
type Hand struct {
	s *settler
	// window is the provider's idempotency window, idle how long a
	// request may be in flight unanswered (PAYMENT_RECOVER_AFTER): a
	// pending attempt older than both can have no request in flight.
	window, idle time.Duration
}

// NewHand returns the recorder of verdicts on db's attempts. wallet is the
// provider whose saved payment methods the requests charge ("" for the
// contract): a waiting event that becomes its order's next attempt is
// recorded with its customer's. horizon's ProviderWindow and idle
// (PAYMENT_RECOVER_AFTER) say when a pending attempt can have no request
// in flight.
func NewHand(db *sqlx.DB, wallet string, horizon Horizon, idle time.Duration, m *metrics.Metrics, log *slog.Logger) *Hand {
	s := newSettler(db, nil, horizon.ResolveAfter, m, noop.NewTracerProvider(), log)
	s.wallet = wallet
	return &Hand{s: s, window: horizon.ProviderWindow, idle: idle}
}

// ErrNotResolvable: the attempt is not one to resolve by hand (settled
// already, or billing may still send it); the error says why.
var ErrNotResolvable = errors.New("not resolvable by hand")

// Check reads attempt id and says whether v may be recorded on it now: it
// is open, and no request of billing's can be in flight for it or start.
// A pending attempt within the provider's window is billing's to complete
// (it sends it again under its key, and the provider answers from its
// store); past the window nothing new is sent (a request whose turn comes
// later is refused by its Ready), and one sent before is answered within
// PAYMENT_TIMEOUT, shorter than idle: so a pending attempt must be older
// than the window and idle. (Recovery's lookups touch it meanwhile; they
// send nothing, and a verdict one of them finds first wins.) billing never
// sends an in_progress attempt again. Only an attempt the provider has no
// id for may be sent again: otherwise the provider has a payment, whose
// outcome is the verdict to record.
func (h *Hand) Check(ctx context.Context, id uuid.UUID, v Verdict) (charge.Aged, error) {
	a, err := charge.GetAged(ctx, h.s.db, id)
	if err != nil {
		return a, err
	}
	recorded := deref(a.ProviderChargeID)
	switch {
	case !charge.Open(a.Status):
		return a, fmt.Errorf("%w: attempt %s is %s already", ErrNotResolvable, id, a.Status)
	case a.Status == charge.Pending && a.Age <= h.window+h.idle:
		return a, fmt.Errorf("%w: attempt %s is pending, created %s ago: billing may still send it until it is older than PAYMENT_IDEMPOTENCY_WINDOW + PAYMENT_RECOVER_AFTER (%s), and completes it by itself meanwhile; resolve it by hand after %s",
			ErrNotResolvable, id, a.Age.Round(time.Second), h.window+h.idle, (h.window + h.idle - a.Age).Round(time.Second))
	case v.Outcome == Resend && recorded != "":
		return a, fmt.Errorf("%w: the provider has a payment for attempt %s (%s): record its outcome (succeeded or declined) instead of sending it again", ErrNotResolvable, id, recorded)
	case v.Outcome == charge.Succeeded && v.ProviderChargeID == "" && recorded == "":
		return a, fmt.Errorf("%w: a succeeded attempt needs the provider's id of the payment (--provider-id); attempt %s records none", ErrNotResolvable, id)
	case v.Outcome == charge.Succeeded && v.ProviderChargeID != "" && recorded != "" && v.ProviderChargeID != recorded:
		return a, fmt.Errorf("%w: attempt %s records the provider's payment %s, not %s", ErrNotResolvable, id, recorded, v.ProviderChargeID)
	}
	return a, nil
}

// ErrSettledMeanwhile: another worker (a notification, a lookup) recorded
// the attempt's outcome between Check and Record; the verdict was not.
var ErrSettledMeanwhile = errors.New("the attempt was settled meanwhile by billing itself; the verdict was not recorded")

// Record records v on attempt a, which Check accepted, and returns the
// attempt as recorded. A verdict goes through the settle, as a
// notification's would: once, with its outcome event, its deferred count
// and the order's waiting events decided. Resend makes it a new pending
// attempt that recovery sends at its next round.
func (h *Hand) Record(ctx context.Context, a charge.Row, v Verdict) (charge.Row, error) {
	if v.Outcome == Resend {
		changed, err := charge.SendAgain(ctx, h.s.db, a.EventID, v.Note, h.window+h.idle)
		if err != nil {
			return a, err
		}
		if !changed {
			return a, ErrSettledMeanwhile
		}
		rows, err := charge.Get(ctx, h.s.db, []uuid.UUID{a.EventID})
		if err != nil || len(rows) == 0 {
			return a, err
		}
		return rows[0], nil
	}
	out := payment.Outcome{Kind: payment.Succeeded, Ref: v.ProviderChargeID, Detail: v.Note}
	if v.Outcome == charge.Declined {
		out = payment.Outcome{Kind: payment.Declined, Code: v.DeclineCode, Detail: v.Note}
	}
	c := newCall(a, true)
	c.sent, c.out = true, out
	if unsettled := h.s.settleBatch(ctx, []*call{c}); len(unsettled) > 0 {
		return a, fmt.Errorf("record the verdict on attempt %s: %w", a.EventID, unsettled[0].settleErr)
	}
	if !c.settledHere {
		return c.a, ErrSettledMeanwhile
	}
	return c.a, nil
}
