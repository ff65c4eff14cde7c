// Package adyen speaks Adyen's Checkout API as billing's payment.Protocol,
// and reads Adyen's standard webhooks (notifications) as its
// payment.Webhook.
//
// A charge is one POST /payments with the customer's stored card,
// merchant-initiated (shopperInteraction ContAuth, recurringProcessingModel
// UnscheduledCardOnFile), under Idempotency-Key: <eventId> and with the
// event id as its reference. Adyen answers a decline with HTTP 200 and
// resultCode Refused, and a payment it decides later with Pending or
// Received, whose verdict comes as an AUTHORISATION notification.
//
// Adyen has no API to look a payment up, nor to list payments. Its
// idempotency layer stands in for the lookup: within the key's validity
// (at least 31 days by Adyen's current documentation) the same request
// under the same key returns the stored first answer (Resolve). Past it,
// the same request could be a new payment, so billing does not send it.
// Reconciliation reads the notifications billing kept instead of a list
// (package notified).
//
// The requests are written by hand rather than through Adyen's Go library:
// payment.Client owns the transport, the retries, the limits and the
// metrics, and a charge is one endpoint and a handful of fields.
package adyen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"example.com/billing/internal/payment"
)

// Protocol is Adyen's payment.Protocol.
type Protocol struct {
	payments string // {base}/payments
	apiKey   string // sent as X-API-Key; never logged
	merchant string // ADYEN_MERCHANT_ACCOUNT
	// window is how long Adyen keeps an idempotency key
	// (PAYMENT_IDEMPOTENCY_WINDOW): Resolve asks again within it only.
	window time.Duration
}

// New returns the protocol of the Checkout API at baseURL, the API's root
// with its version (e.g. https://checkout-test.adyen.com/v71; a trailing
// slash is allowed), charging for merchantAccount, authorized with the API
// key apiKey. window is how long Adyen keeps an idempotency key: Resolve
// sends a request again only within it.
func New(baseURL, apiKey, merchantAccount string, window time.Duration) *Protocol {
	return &Protocol{
		payments: strings.TrimRight(baseURL, "/") + "/payments",
		apiKey:   apiKey,
		merchant: merchantAccount,
		window:   window,
	}
}

// paymentRequest is the body of POST /payments. Its fields marshal in
// this order, so every try of an attempt sends the same bytes.
type paymentRequest struct {
	MerchantAccount string `json:"merchantAccount"`
	Amount          amount `json:"amount"`
	// Reference is the event id: Adyen names the payment by it in its
	// notifications (merchantReference), which is how one is tied to its
	// attempt.
	Reference              string        `json:"reference"`
	MerchantOrderReference string        `json:"merchantOrderReference"`
	ShopperReference       string        `json:"shopperReference"`
	PaymentMethod          storedPayment `json:"paymentMethod"`
	// ShopperInteraction ContAuth: the shopper is known and not present;
	// the merchant charges a stored card.
	ShopperInteraction string `json:"shopperInteraction"`
	// RecurringProcessingModel UnscheduledCardOnFile: a charge on a
	// non-fixed schedule for a variable amount (an order), initiated by the
	// merchant.
	RecurringProcessingModel string `json:"recurringProcessingModel"`
}

type amount struct {
	Value    int64  `json:"value"`    // minor units
	Currency string `json:"currency"` // ISO 4217, upper case
}

// storedPayment is a stored card: Adyen's token payments name its type,
// scheme, and the token.
type storedPayment struct {
	Type                  string `json:"type"`
	StoredPaymentMethodID string `json:"storedPaymentMethodId"`
}

// Charge sends POST {base}/payments for r under Idempotency-Key: <eventId>
// and classifies the answer (classify).
func (p *Protocol) Charge(ctx context.Context, do payment.Doer, r payment.Request) (payment.Outcome, error) {
	// Strings and integers: marshalling cannot fail.
	body, _ := json.Marshal(paymentRequest{
		MerchantAccount:          p.merchant,
		Amount:                   amount{Value: r.Amount, Currency: strings.ToUpper(r.Currency)},
		Reference:                r.IdempotencyKey,
		MerchantOrderReference:   strconv.FormatInt(r.OrderID, 10),
		ShopperReference:         r.CustomerRef,
		PaymentMethod:            storedPayment{Type: "scheme", StoredPaymentMethodID: r.PaymentMethodRef},
		ShopperInteraction:       "ContAuth",
		RecurringProcessingModel: "UnscheduledCardOnFile",
	})
	resp, err := payment.PostCharge(ctx, do, p.payments, "application/json", r.IdempotencyKey, body,
		func(req *http.Request) { req.Header.Set("X-API-Key", p.apiKey) })
	if err != nil {
		return payment.Outcome{}, err
	}
	return p.classify(resp)
}

// The result codes of a /payments answer billing reads (Adyen's "Result
// codes" page).
const (
	authorised       = "Authorised"
	refused          = "Refused"
	cancelled        = "Cancelled"
	resultError      = "Error"
	pending          = "Pending"
	received         = "Received"
	redirectShopper  = "RedirectShopper"
	identifyShopper  = "IdentifyShopper"
	challengeShopper = "ChallengeShopper"
	presentToShopper = "PresentToShopper"
)

// errorCodeInFlight is Adyen's error 704, "request already processed or in
// progress": a request under the key is still being processed (HTTP 409 or
// 422, with the header transient-error: true).
const errorCodeInFlight = "704"

// The decline codes billing gives a payment the shopper would have to
// complete, which off-session they cannot. authentication_required is the
// code the Stripe adapter gives the same case (3D Secure), so that the
// consumers of payment.declined.v1 read one code whatever the provider.
const (
	codeAuthenticationRequired = "authentication_required"
	codeShopperActionRequired  = "shopper_action_required"
)

// classify is what Adyen's answer to POST /payments means:
//
//	2xx resultCode Authorised                  Succeeded (pspReference)
//	2xx Refused, Cancelled                     Declined (refusalReason)
//	2xx Error                                  Declined (refusalReason, e.g. acquirer_error)
//	2xx Pending, Received                      InProgress (pspReference)
//	2xx RedirectShopper, IdentifyShopper,
//	    ChallengeShopper                       Declined authentication_required
//	2xx PresentToShopper                       Declined shopper_action_required
//	2xx another resultCode                     InProgress
//	2xx unreadable, Authorised without pspReference  transient bad_response
//	errorCode 704 (409 or 422)                 transient conflict
//	transient-error: true                      transient, as the status names it
//	400, 422 with Adyen's error object         Rejected (errorCode)
//	409                                        transient conflict
//	429                                        transient rate_limited
//	401                                        transient unauthorized
//	403                                        transient forbidden
//	5xx                                        transient server_error
//	anything else                              transient client_error
//
// Error is final at Adyen ("There was an error when the payment was being
// processed ... This is a final state"), and the key replays it, so
// parking the event would change nothing a replay could fix. It is a
// decline rather than a rejection because Adyen's AUTHORISATION
// notification of the same payment says only success=false with the reason,
// as for a refusal: whichever of the answer, a re-sent request or the
// notification billing records first, the attempt ends in the same state.
// Its code (acquirer_error, issuer_unavailable) tells a consumer it was
// not the card's refusal.
//
// A 5xx or a timeout is asked again under the key: Adyen returns the
// stored first answer once the payment is processed. Only Adyen's own
// error object parks an event: a 400 or 422 from something in front of
// Adyen (a proxy, a wrong base URL) would otherwise park every event, when
// the fault is the environment's.
func (p *Protocol) classify(resp payment.Response) (payment.Outcome, error) {
	status := resp.Status
	if status >= 200 && status < 300 {
		var a paymentResponse
		// An answer that asks the shopper to act may come without a
		// pspReference (Adyen gives it in /payments/details then); a
		// success billing cannot record without one.
		if err := json.Unmarshal(resp.Body, &a); err != nil || a.ResultCode == "" || (a.ResultCode == authorised && a.PspReference == "") {
			// An answer we cannot read is not an outcome we can record;
			// asking again under the key gets the stored answer.
			return payment.Outcome{}, payment.Transient("bad_response", 0,
				fmt.Errorf("unexpected answer %d %s", status, payment.Snippet(resp.Body, p.apiKey)))
		}
		return a.outcome(p.apiKey), nil
	}
	e, fromAdyen := decodeError(resp.Body)
	detail := func() string {
		if fromAdyen {
			return payment.Snippet(fmt.Appendf(nil, "%d %s", status, e), p.apiKey)
		}
		return fmt.Sprintf("%d %s", status, payment.Snippet(resp.Body, p.apiKey))
	}
	switch {
	case fromAdyen && e.ErrorCode == errorCodeInFlight:
		// Our own earlier request under the key is still being processed
		// (a timeout's, or another replica's): its stored answer comes
		// once it is done. Never a bad event.
		return payment.Outcome{}, payment.Transient("conflict", 0, errors.New(detail()))
	case strings.EqualFold(resp.Header.Get("Transient-Error"), "true"):
		// Adyen says another try may fare better: its word comes before
		// the status.
		return payment.Outcome{}, payment.TransientStatus(status, resp.Header, detail(), forbidden)
	case fromAdyen && (status == http.StatusUnprocessableEntity || status == http.StatusBadRequest):
		// A validation error (a stored card Adyen does not have, an
		// amount or currency the account cannot take): asking again
		// cannot help.
		return payment.Outcome{Kind: payment.Rejected, Ref: e.PspReference, Code: payment.Code(e.ErrorCode), Detail: detail()}, nil
	}
	return payment.Outcome{}, payment.TransientStatus(status, resp.Header, detail(), forbidden)
}

// paymentResponse is what billing reads of Adyen's answer to /payments.
type paymentResponse struct {
	ResultCode        string `json:"resultCode"`
	PspReference      string `json:"pspReference"`
	MerchantReference string `json:"merchantReference"`
	RefusalReason     string `json:"refusalReason"`
	RefusalReasonCode string `json:"refusalReasonCode"`
}

// outcome is what a's resultCode says of its payment (classify's table).
func (a paymentResponse) outcome(secret string) payment.Outcome {
	out := payment.Outcome{Ref: a.PspReference, Detail: a.detail(secret)}
	switch a.ResultCode {
	case authorised:
		out.Kind, out.Detail = payment.Succeeded, ""
	case refused, cancelled, resultError:
		out.Kind, out.Code = payment.Declined, reasonCode(a.RefusalReason, a.ResultCode)
	case redirectShopper, identifyShopper, challengeShopper:
		out.Kind, out.Code = payment.Declined, codeAuthenticationRequired
	case presentToShopper:
		out.Kind, out.Code = payment.Declined, codeShopperActionRequired
	default:
		// Pending and Received: Adyen decides later and notifies. Any
		// other result code (PartiallyAuthorised, which billing never
		// asks for; one Adyen adds later) is neither a verdict billing can
		// record nor a reason to send again (the key replays the same
		// answer): the notification, or the in-progress age alert, settles
		// it.
		out.Kind = payment.InProgress
	}
	return out
}

// detail says for a human what the answer was: "Refused (12 Not enough
// balance), pspReference ...".
func (a paymentResponse) detail(secret string) string {
	s := "resultCode " + a.ResultCode
	switch {
	case a.RefusalReasonCode != "" && a.RefusalReason != "":
		s += " (" + a.RefusalReasonCode + " " + a.RefusalReason + ")"
	case a.RefusalReason != "":
		s += " (" + a.RefusalReason + ")"
	}
	switch a.ResultCode {
	case redirectShopper, identifyShopper, challengeShopper, presentToShopper:
		s += ": the shopper would have to act, which off-session they cannot"
	}
	if a.PspReference != "" {
		s += ", pspReference " + a.PspReference
	}
	return payment.Snippet([]byte(s), secret)
}

// reasonCode is a decline's code from Adyen's refusal reason, as an
// identifier: "Not enough balance" is not_enough_balance, "CVC Declined"
// cvc_declined. Adyen's notification of the same payment carries the
// reason's text and not its number, so the text makes the code whichever
// of the two settles the attempt. Without a reason, the result code's.
func reasonCode(reason, resultCode string) string {
	var b strings.Builder
	gap := false
	for _, r := range strings.ToLower(reason) {
		if ('a' <= r && r <= 'z') || ('0' <= r && r <= '9') || r == '-' || r == '.' {
			if gap && b.Len() > 0 {
				b.WriteByte('_')
			}
			b.WriteRune(r)
			gap = false
			continue
		}
		gap = true
	}
	if c := payment.Code(b.String()); c != "" {
		return c
	}
	return strings.ToLower(resultCode)
}

// adyenError is Adyen's error answer: {"status","errorCode","message",
// "errorType","pspReference"}, or its RFC 7807 form with title and detail.
type adyenError struct {
	Status       int    `json:"status"`
	ErrorCode    string `json:"errorCode"`
	ErrorType    string `json:"errorType"`
	Message      string `json:"message"`
	Title        string `json:"title"`
	Detail       string `json:"detail"`
	PspReference string `json:"pspReference"`
}

// decodeError reads Adyen's error object from body; ok is false when body
// is not one (an answer from something in front of Adyen).
func decodeError(body []byte) (e adyenError, ok bool) {
	if json.Unmarshal(body, &e) != nil || e.ErrorCode == "" {
		return adyenError{}, false
	}
	return e, true
}

// String is the error for a human: "validation 101: Invalid card number".
func (e adyenError) String() string {
	s := e.ErrorCode
	if e.ErrorType != "" {
		s = e.ErrorType + " " + s
	}
	for _, m := range []string{e.Message, e.Detail, e.Title} {
		if m != "" {
			s += ": " + m
			break
		}
	}
	return s
}

// forbidden is what a 403 says the key lacks.
const forbidden = "PAYMENT_API_KEY lacks a role, or ADYEN_MERCHANT_ACCOUNT is not its"
