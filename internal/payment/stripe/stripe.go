// Package stripe speaks Stripe's PaymentIntents API as billing's
// payment.Protocol, and reads Stripe's webhooks as its payment.Webhook.
//
// A charge is one PaymentIntent, created and confirmed off-session in one
// request with the customer's saved card, under Idempotency-Key: <eventId>
// and with the event id in its metadata: Stripe has no lookup by
// idempotency key, so the metadata is how an attempt whose answer was lost
// is found again (Resolve), and how reconciliation ties a payment to its
// event (Charges).
//
// The requests are written by hand rather than through stripe-go's client:
// payment.Client owns the transport, the retries, the limits and the
// metrics, and a charge is two endpoints and a handful of parameters.
package stripe

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"example.com/billing/internal/payment"
)

// APIVersion is the Stripe-Version billing sends on every request, so that
// the answers keep the shape this package reads whatever the account's
// default version; Stripe's webhook endpoint for billing is created with
// it too. It is the version stripe-mock v0.203.0 validates billing's
// requests against (its -strict-version-check refuses any other), on the
// release train of the stripe-go module whose webhook package verifies
// notifications (v85, dahlia). Changing it is an upgrade of Stripe's API:
// read Stripe's changelog for PaymentIntents, errors and events first.
const APIVersion = "2026-08-26.dahlia"

// Protocol is Stripe's payment.Protocol.
type Protocol struct {
	base   string // e.g. https://api.stripe.com, without a trailing slash
	apiKey string // the secret key, sent as a bearer token; never logged
}

// New returns the protocol of the Stripe API at baseURL (the caller's
// default is https://api.stripe.com; a trailing slash is allowed),
// authorized with the secret key apiKey.
func New(baseURL, apiKey string) *Protocol {
	return &Protocol{base: strings.TrimRight(baseURL, "/"), apiKey: apiKey}
}

// chargePath creates PaymentIntents.
const chargePath = "/v1/payment_intents"

// Charge creates and confirms a PaymentIntent for r: POST
// /v1/payment_intents, form-encoded, under Idempotency-Key: <eventId>. The
// parameters are encoded in sorted order, so every try sends the same
// bytes, as Stripe's idempotency layer requires (the same key with other
// parameters is an idempotency_error).
func (p *Protocol) Charge(ctx context.Context, do payment.Doer, r payment.Request) (payment.Outcome, error) {
	form := url.Values{
		"amount":                {strconv.FormatInt(r.Amount, 10)},
		"currency":              {strings.ToLower(r.Currency)},
		"customer":              {r.CustomerRef},
		"payment_method":        {r.PaymentMethodRef},
		"confirm":               {"true"},
		"off_session":           {"true"},
		"metadata[event_id]":    {r.IdempotencyKey},
		"metadata[order_id]":    {strconv.FormatInt(r.OrderID, 10)},
		"metadata[customer_id]": {strconv.FormatInt(r.CustomerID, 10)},
	}
	resp, err := payment.PostCharge(ctx, do, p.base+chargePath, "application/x-www-form-urlencoded", r.IdempotencyKey, []byte(form.Encode()), p.authorize)
	if err != nil {
		return payment.Outcome{}, err
	}
	return p.classify(resp)
}

// classify is what Stripe's answer to a charge means:
//
//	2xx PaymentIntent            its status (paymentIntent.outcome)
//	2xx anything else            transient bad_response
//	idempotency_error, any status  Rejected
//	Stripe-Should-Retry: true    transient, as the status names it
//	402 Stripe error             Declined (decline_code, else code)
//	400 Stripe error             Rejected (invalid_request_error)
//	404 resource_missing         Rejected
//	409                          transient conflict
//	429                          transient rate_limited
//	401                          transient unauthorized
//	403                          transient forbidden
//	500                          Indeterminate
//	other 5xx                    transient server_error; Indeterminate with Stripe-Should-Retry: false
//	anything else                transient client_error
//
// Only Stripe's own error object parks or declines an event: a 400, 402 or
// 404 from something in front of Stripe (a proxy, a wrong base URL, whose
// 404 is Stripe's invalid_request_error without resource_missing) would
// otherwise park every event, when the fault is the environment's.
func (p *Protocol) classify(resp payment.Response) (payment.Outcome, error) {
	replayed := resp.Header.Get("Idempotent-Replayed") == "true"
	status := resp.Status
	if status >= 200 && status < 300 {
		var pi paymentIntent
		if err := json.Unmarshal(resp.Body, &pi); err != nil || pi.ID == "" || pi.Status == "" {
			// A success we cannot read is not a charge we can record;
			// asking again with the same key gets the stored answer.
			return payment.Outcome{}, payment.Transient("bad_response", 0,
				fmt.Errorf("unexpected answer %d %s", status, payment.Snippet(resp.Body, p.apiKey)))
		}
		out := pi.outcome(p.apiKey)
		out.Replayed = replayed
		return out, nil
	}
	e, fromStripe := decodeError(resp.Body)
	detail := func() string {
		if fromStripe {
			return payment.Snippet([]byte(fmt.Sprintf("%d %s", status, e)), p.apiKey)
		}
		return fmt.Sprintf("%d %s", status, payment.Snippet(resp.Body, p.apiKey))
	}
	retry := resp.Header.Get("Stripe-Should-Retry")
	switch {
	case fromStripe && e.Type == "idempotency_error":
		// The key was used with other parameters: every try gets this
		// answer, whatever its status (Stripe's docs say 400, other
		// sources 409 or 422).
		return payment.Outcome{Kind: payment.Rejected, Code: e.code(), Detail: detail(), Replayed: replayed}, nil
	case retry == "true":
		// Stripe knows whether its idempotency layer stored the answer
		// and whether another try may fare better: its word comes before
		// the status.
		return payment.Outcome{}, payment.TransientStatus(status, resp.Header, detail(), forbidden)
	case status == http.StatusPaymentRequired && fromStripe:
		return payment.Outcome{Kind: payment.Declined, Ref: e.paymentIntentID(), Code: e.declineCode(), Detail: detail(), Replayed: replayed}, nil
	case status == http.StatusBadRequest && fromStripe,
		status == http.StatusNotFound && fromStripe && e.Code == "resource_missing":
		// Malformed (amount_too_small, a currency the account cannot
		// take) or naming what Stripe does not have (a customer or
		// payment method of another account): asking again cannot help.
		return payment.Outcome{Kind: payment.Rejected, Ref: e.paymentIntentID(), Code: e.code(), Detail: detail(), Replayed: replayed}, nil
	case status == http.StatusInternalServerError,
		status > http.StatusInternalServerError && retry == "false":
		// Stripe stores a 500 under the key and replays it: re-sending
		// cannot learn more, and the payment may still go through
		// ("treat the result of a 500 as indeterminate"). billing looks
		// it up instead.
		return payment.Outcome{Kind: payment.Indeterminate, Ref: e.paymentIntentID(), Code: payment.Code(e.Code), Detail: detail(), Replayed: replayed}, nil
	}
	return payment.Outcome{}, payment.TransientStatus(status, resp.Header, detail(), forbidden)
}

// forbidden is what a 403 says the key lacks.
const forbidden = "PAYMENT_API_KEY lacks a permission"

// authorize sets what every request to Stripe carries: the key and the
// pinned version.
func (p *Protocol) authorize(req *http.Request) {
	req.Header.Set("Authorization", "Bearer "+p.apiKey)
	req.Header.Set("Stripe-Version", APIVersion)
}

// stripeError is Stripe's error object, {"error":{...}}.
type stripeError struct {
	Type          string         `json:"type"`
	Code          string         `json:"code"`
	DeclineCode   string         `json:"decline_code"`
	Message       string         `json:"message"`
	PaymentIntent *paymentIntent `json:"payment_intent"`
}

// decodeError reads Stripe's error object from body; ok is false when body
// is not one (an answer from something in front of Stripe).
func decodeError(body []byte) (e stripeError, ok bool) {
	var answer struct {
		Error *stripeError `json:"error"`
	}
	if json.Unmarshal(body, &answer) != nil || answer.Error == nil || answer.Error.Type == "" {
		return stripeError{}, false
	}
	return *answer.Error, true
}

// declineCode is the decline's reason: decline_code (insufficient_funds),
// else code (card_declined, authentication_required).
func (e stripeError) declineCode() string {
	if c := payment.Code(e.DeclineCode); c != "" {
		return c
	}
	return payment.Code(e.Code)
}

// code is a rejection's reason: its code, else its type
// (idempotency_error carries no code).
func (e stripeError) code() string {
	if c := payment.Code(e.Code); c != "" {
		return c
	}
	return payment.Code(e.Type)
}

// paymentIntentID is the id of the PaymentIntent an error names, "" when
// it names none.
func (e stripeError) paymentIntentID() string {
	if e.PaymentIntent == nil {
		return ""
	}
	return e.PaymentIntent.ID
}

// String is the error for a human: "card_error/card_declined/insufficient_funds: Your card ...".
func (e stripeError) String() string {
	var b bytes.Buffer
	for _, s := range []string{e.Type, e.Code, e.DeclineCode} {
		if s == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('/')
		}
		b.WriteString(s)
	}
	if e.Message != "" {
		if b.Len() > 0 {
			b.WriteString(": ")
		}
		b.WriteString(e.Message)
	}
	return b.String()
}
