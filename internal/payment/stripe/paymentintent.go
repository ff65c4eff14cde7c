package stripe

import (
	"fmt"

	"example.com/billing/internal/payment"
)

// paymentIntent is what billing reads of Stripe's PaymentIntent: its
// answer to a charge, a lookup's and a listing's entries, a webhook's
// object. These fields have kept their names and meaning across Stripe's
// API versions since requires_payment_method (2019-02-11).
type paymentIntent struct {
	ID                 string            `json:"id"`
	Status             string            `json:"status"`
	Amount             int64             `json:"amount"`   // minor units
	Currency           string            `json:"currency"` // lower case
	Created            int64             `json:"created"`  // unix seconds
	Metadata           map[string]string `json:"metadata"`
	LastPaymentError   *stripeError      `json:"last_payment_error"`
	CancellationReason string            `json:"cancellation_reason"`
}

// eventID is the billing event whose charge created pi, "" for a payment
// billing did not ask for.
func (pi paymentIntent) eventID() string { return pi.Metadata["event_id"] }

// outcome is what pi's status says of its payment, billing having created
// it with an off-session confirm (a charge's answer, a lookup):
//
//	succeeded                  Succeeded
//	processing                 InProgress (a bank debit: up to days)
//	requires_payment_method    Declined, with last_payment_error's code; InProgress without one
//	requires_action            Declined (authentication_required unless last_payment_error says)
//	canceled                   Declined
//	requires_capture,
//	requires_confirmation,
//	anything else              InProgress
//
// An off-session confirm that fails leaves the PaymentIntent in
// requires_payment_method with last_payment_error set. Without it the
// confirmation has not failed, it has not finished (a stored 500, which
// Stripe may still roll forward): calling that a decline could settle as
// declined a payment that then succeeds.
//
// billing never uses manual capture or a separate confirm, so
// requires_capture and requires_confirmation mean someone else changed the
// PaymentIntent (a capture method set on the account, a confirm undone).
// Neither is a decline (money may still move: an operator captures, or
// confirms) nor a request to send again (the key replays the same answer,
// so that would loop); InProgress leaves the attempt to the webhook or a
// lookup, which settle it when Stripe reaches a verdict (an uncaptured
// authorization is canceled after days), and to the in-progress age alert
// until then. A status Stripe adds later is treated the same way.
func (pi paymentIntent) outcome(secret string) payment.Outcome {
	out := payment.Outcome{Ref: pi.ID}
	switch pi.Status {
	case "succeeded":
		out.Kind = payment.Succeeded
		return out
	case "requires_payment_method":
		if pi.LastPaymentError != nil {
			out.Kind = payment.Declined
			out.Code = pi.LastPaymentError.declineCode()
		} else {
			out.Kind = payment.InProgress
		}
	case "requires_action":
		// Off-session the customer cannot authenticate: Stripe's code for
		// it is authentication_required.
		out.Kind, out.Code = payment.Declined, "authentication_required"
		if pi.LastPaymentError != nil && pi.LastPaymentError.declineCode() != "" {
			out.Code = pi.LastPaymentError.declineCode()
		}
	case "canceled":
		out.Kind = payment.Declined
		if pi.LastPaymentError != nil {
			out.Code = pi.LastPaymentError.declineCode()
		}
	default:
		out.Kind = payment.InProgress
	}
	out.Detail = pi.detail(secret)
	return out
}

// detail says for a human what pi's status is and why.
func (pi paymentIntent) detail(secret string) string {
	s := fmt.Sprintf("payment_intent %s %s", pi.ID, pi.Status)
	if pi.CancellationReason != "" {
		s += " (" + pi.CancellationReason + ")"
	}
	if pi.LastPaymentError != nil {
		s += ": " + pi.LastPaymentError.String()
	}
	return payment.Snippet([]byte(s), secret)
}
