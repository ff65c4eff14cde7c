package adyen

import (
	"context"
	"errors"
	"fmt"
	"time"

	"example.com/billing/internal/payment"
)

// Resolve asks Adyen what became of the attempt l. Adyen has no lookup: it
// sends the attempt's request again, the same bytes under the same key,
// and Adyen answers with the stored first answer (classify). That tells a
// verdict when the first answer was one whose delivery was lost; for a
// payment Adyen answered Pending it tells Pending again, and the
// AUTHORISATION notification is what settles it.
//
// So an attempt whose first answer billing recorded (its pspReference:
// Pending or Received) is not asked again: the answer would be that one,
// at the cost of a request of the rate budget, hourly for a month; it stays
// in progress until its notification comes.
//
// Only within the key's validity, measured from when billing recorded the
// attempt (which is before Adyen first saw it): past it Adyen may have
// forgotten the key, and the same request would be a new payment. There,
// and for an attempt without a recorded time, the answer is Unknown,
// without asking: a human reconciles it (billing_charge_attempts_unresolved).
func (p *Protocol) Resolve(ctx context.Context, do payment.Doer, l payment.Lookup) (payment.Outcome, error) {
	if l.IdempotencyKey == "" {
		return payment.Outcome{}, errors.New("adyen lookup: the attempt has no idempotency key to ask again under")
	}
	if l.Created.IsZero() || time.Since(l.Created) >= p.window {
		return payment.Outcome{Kind: payment.Unknown, Detail: fmt.Sprintf(
			"not asked again: recorded %s, past Adyen's idempotency window (%s), where the same request could be a new payment",
			l.Created.UTC().Format(time.RFC3339), p.window)}, nil
	}
	if l.Ref != "" {
		return payment.Outcome{Kind: payment.InProgress, Ref: l.Ref,
			Detail: "not asked again: Adyen would replay its first answer (Pending); the AUTHORISATION notification settles it"}, nil
	}
	return p.Charge(ctx, do, l.Request)
}

// ResolveResends reports that Resolve sends the payment request again
// (payment.Resender): a request Adyen never received would be a new
// payment, so a lookup waits like a charge while charging is paused.
func (p *Protocol) ResolveResends() bool { return true }

// ErrNoList: Adyen has no API that lists payments.
var ErrNoList = errors.New("adyen has no API that lists payments: billing reconcile reads the AUTHORISATION notifications billing kept")

// Charges returns ErrNoList: reconciliation for Adyen reads the
// notifications billing kept (package notified), not Adyen.
func (p *Protocol) Charges(context.Context, payment.Doer, time.Time, time.Time) ([]payment.ListedCharge, error) {
	return nil, ErrNoList
}
