package stripe

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v85/webhook"

	"example.com/billing/internal/payment"
)

// SignatureHeader carries a notification's signature:
// t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">[,v1=...].
const SignatureHeader = "Stripe-Signature"

// Tolerance is how far from now a notification's signature time may be:
// an older one is refused, so that a notification captured once cannot be
// played again later (Stripe's default).
const Tolerance = webhook.DefaultTolerance

// ErrSignature: a notification whose signature does not verify with any
// secret, or whose time is further than Tolerance from now.
var ErrSignature = errors.New("stripe webhook signature does not verify")

// Webhook reads Stripe's notifications (events) for billing's endpoint,
// signed with any of Secrets (the endpoint's whsec_ signing secrets; two
// during a rotation, when Stripe also signs with both).
//
// The signature is checked with stripe-go's webhook package; the time
// against the caller's now, which stripe-go cannot be given (it reads the
// clock itself, and bounds only the past). Unlike stripe-go's
// ConstructEvent, Verify does not refuse an event whose api_version is not
// APIVersion: billing reads only the event's type and its PaymentIntent's
// id, status, metadata and last_payment_error, which every version since
// 2019 names alike, and a verified notification refused with 400 would be
// retried by Stripe for days and then switch the endpoint off, losing the
// in-progress payments' outcomes to their lookups.
type Webhook struct {
	Secrets []string
}

// Verify checks the Stripe-Signature of a notification and returns the
// outcome it announces:
//
//	payment_intent.succeeded       Succeeded
//	payment_intent.payment_failed  Declined (last_payment_error's code)
//	payment_intent.canceled        Declined
//	anything else                  nothing (acknowledged, ignored)
//
// The notification's IdempotencyKey is the PaymentIntent's
// metadata[event_id], "" for a payment billing did not create.
func (w Webhook) Verify(header http.Header, body []byte, now time.Time) ([]payment.Notification, error) {
	sig := header.Get(SignatureHeader)
	at, err := signedAt(sig)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSignature, err)
	}
	if age := now.Sub(at); age > Tolerance || age < -Tolerance {
		return nil, fmt.Errorf("%w: signed %s from now, more than the %s allowed", ErrSignature, age.Round(time.Second), Tolerance)
	}
	if !w.verifies(sig, body) {
		return nil, ErrSignature
	}

	var ev struct {
		ID   string `json:"id"`
		Type string `json:"type"`
		Data struct {
			Object json.RawMessage `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &ev); err != nil {
		return nil, fmt.Errorf("decode stripe event: %w", err)
	}
	var kind payment.Kind
	switch ev.Type {
	case "payment_intent.succeeded":
		kind = payment.Succeeded
	case "payment_intent.payment_failed", "payment_intent.canceled":
		kind = payment.Declined
	default:
		// created and processing: no verdict yet. requires_action: the
		// charge's answer, or a lookup, reads it as the decline it is
		// off-session. charge.* and the rest: the payment_intent events
		// say the same of billing's payments.
		return nil, nil
	}
	// Only an event billing acts on is read further: other objects need
	// not decode as a PaymentIntent.
	var pi paymentIntent
	if err := json.Unmarshal(ev.Data.Object, &pi); err != nil {
		return nil, fmt.Errorf("decode stripe event %s: %w", ev.ID, err)
	}
	if pi.ID == "" {
		return nil, fmt.Errorf("stripe event %s (%s) names no PaymentIntent", ev.ID, ev.Type)
	}
	out := payment.Outcome{Kind: kind, Ref: pi.ID}
	if kind == payment.Declined {
		if pi.LastPaymentError != nil {
			out.Code = pi.LastPaymentError.declineCode()
		}
		out.Detail = pi.detail("") + " (event " + ev.ID + ")"
	}
	return []payment.Notification{{ID: ev.ID, IdempotencyKey: pi.eventID(), Outcome: out}}, nil
}

// Ack is what billing answers a notification it took: Stripe wants any
// 2xx; this body is its own examples'.
func (Webhook) Ack() []byte { return []byte(`{"received":true}`) }

// verifies reports whether one of the header's v1 signatures is body's
// under one of the secrets.
func (w Webhook) verifies(sig string, body []byte) bool {
	for _, secret := range w.Secrets {
		// An empty secret is an HMAC key anyone has: a list like "a,,b"
		// must not make every notification verify.
		if secret == "" {
			continue
		}
		if webhook.ValidatePayloadIgnoringTolerance(body, sig, secret) == nil {
			return true
		}
	}
	return false
}

// signedAt reads the time of a Stripe-Signature header. It must hold one
// t= exactly: stripe-go signs with the last one it reads, so with two the
// time checked here could be another than the time signed.
func signedAt(sig string) (time.Time, error) {
	var at time.Time
	n := 0
	for _, part := range strings.Split(sig, ",") {
		// Read as stripe-go reads it: key=value, untrimmed.
		k, v, _ := strings.Cut(part, "=")
		if k != "t" {
			continue
		}
		n++
		s, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return time.Time{}, fmt.Errorf("bad timestamp %q", v)
		}
		at = time.Unix(s, 0)
	}
	if n != 1 {
		return time.Time{}, fmt.Errorf("%d timestamps, want 1", n)
	}
	return at, nil
}
