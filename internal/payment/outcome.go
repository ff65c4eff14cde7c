package payment

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Request is one charge, as every try of it sends it.
type Request struct {
	IdempotencyKey string // the event id
	OrderID        int64
	CustomerID     int64
	Amount         int64 // minor units
	Currency       string
	// CustomerRef and PaymentMethodRef are the customer's saved card at
	// the provider (Stripe's cus_ and pm_, Adyen's shopperReference and
	// storedPaymentMethodId), read from payment_method when the attempt
	// was recorded, so that every try sends the same request; "" for a
	// provider that charges by customer id (the contract).
	CustomerRef      string
	PaymentMethodRef string
	// Ready, when set, is asked once the request has its turn (a slot, a
	// token of the rate limit, no pause in force), just before it is
	// sent: a turn can take seconds, and the caller may no longer want
	// the request by then (the message's partition is another consumer's).
	// An error leaves it unsent: Charge returns a *TransientError that
	// wraps ErrNotSent and it. It is not part of what the provider sees.
	// While charging is paused it is asked every second as well.
	Ready func() error
	// Leave, when set, is asked instead of Ready at the last moment, when
	// nothing but the network stands between the request and the provider:
	// nil lets it go, and commits the caller to wait for its answer. Ready
	// may be asked many times before; Leave is the one answer that sends.
	Leave func() error
}

// Kind is what a provider's answer means for a charge attempt. billing's
// phases see these and never a status code: what an answer means is its
// Protocol's knowledge.
type Kind uint8

const (
	// Unknown: the provider has no verdict to give; from a lookup, no
	// payment was found under the attempt's key or metadata.
	Unknown Kind = iota
	// Succeeded: the provider charged; Outcome.Ref is its id.
	Succeeded
	// Declined: the provider refused the payment (a card declined, a
	// shopper who would have to act). A final business outcome.
	Declined
	// Rejected: the provider refused the request itself (malformed, its
	// key reused with another body, an unknown customer or card): the
	// event is parked; asking again cannot help.
	Rejected
	// InProgress: the provider accepted the payment and gives its verdict
	// later (Stripe's processing, Adyen's Pending): not asked again,
	// settled by the provider's notification or a lookup.
	InProgress
	// Indeterminate: the provider stored an answer without a verdict
	// (Stripe's 500, replayed under the key): re-sending gets the same
	// answer, so billing looks the payment up instead.
	Indeterminate
)

// String is the kind's name, as billing_payment_lookups_total labels it.
func (k Kind) String() string {
	switch k {
	case Succeeded:
		return "succeeded"
	case Declined:
		return "declined"
	case Rejected:
		return "rejected"
	case InProgress:
		return "in_progress"
	case Indeterminate:
		return "indeterminate"
	}
	return "unknown"
}

// Final reports whether k settles an attempt for good.
func (k Kind) Final() bool { return k == Succeeded || k == Declined || k == Rejected }

// Outcome is what the provider said about a charge.
type Outcome struct {
	Kind Kind
	// Ref is the provider's id of the payment (contract ch_, Stripe's
	// PaymentIntent pi_, Adyen's pspReference), "" when it gave none.
	Ref string
	// Code is the provider's reason: the decline code of a decline (a
	// short identifier: it goes into an outcome event other services
	// read), the error code of a rejection; "" when it gave none.
	Code string
	// Detail is the provider's words, short and single-line, for a human
	// (logs, the charge table's last_error, dead-letter headers).
	Detail string
	// Replayed: the provider answered from its idempotency store.
	Replayed bool
}

// Lookup is what billing knows of an attempt whose outcome it asks the
// provider for.
type Lookup struct {
	Request
	// Ref is the provider's id of the payment, "" when billing never
	// learned it.
	Ref string
	// Created is when billing recorded the attempt: the provider created
	// the payment, if it did, after it.
	Created time.Time
}

// Notification is one outcome a provider announced on its own (a
// webhook), once its signature verified.
type Notification struct {
	// ID names the notification at the provider (logs only).
	ID string
	// IdempotencyKey is the attempt's key (its event id) when the
	// notification carries it (Stripe's metadata[event_id], Adyen's
	// merchantReference, the contract's idempotencyKey); "" for a payment
	// billing did not ask for, which is no news to it.
	IdempotencyKey string
	Outcome        Outcome
	// Payment is the payment as the notification describes it, for a
	// provider whose payments billing cannot list (Adyen): billing keeps
	// it, and reconciliation compares the charge table with what was
	// kept. nil for a provider with a list API (contract, Stripe).
	Payment *ListedCharge
}

// Response is a provider's answer, read whole.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// Doer sends one request to the provider and reads its answer whole: the
// transport every Protocol shares. Its errors are *TransientError (the
// provider was not reached or did not answer in time).
type Doer interface {
	Do(req *http.Request) (Response, error)
}

// PostCharge sends one try of a charge through do: body, of contentType,
// POSTed to url under the attempt's Idempotency-Key, with the provider's
// credentials set by authorize. Every adapter's charge is this request;
// only the body, the address and the credentials differ.
func PostCharge(ctx context.Context, do Doer, url, contentType, key string, body []byte, authorize func(*http.Request)) (Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return Response{}, Transient("client_error", 0, fmt.Errorf("build request: %w", err))
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Idempotency-Key", key)
	authorize(req)
	return do.Do(req)
}

// Protocol is one provider's API: how a charge, a lookup and a listing
// are asked for, and what the answers mean. A Client wraps it with what
// every provider shares (turns, rate, breaker, metrics, connections).
type Protocol interface {
	// Charge sends r once. Every try of an attempt sends the same
	// request, so that the provider recognises a repeat. It returns the
	// outcome, or a *TransientError: ask again later with the same key.
	Charge(ctx context.Context, do Doer, r Request) (Outcome, error)
	// Resolve asks the provider what became of an attempt: its payment by
	// l.Ref, else by what the request carried. An Outcome of kind Unknown
	// says that no payment was found; an error, that the provider could
	// not be asked.
	Resolve(ctx context.Context, do Doer, l Lookup) (Outcome, error)
	// Charges lists every payment the provider created in [from, to), for
	// reconciliation, following the provider's pages.
	Charges(ctx context.Context, do Doer, from, to time.Time) ([]ListedCharge, error)
}

// Webhook reads a provider's notifications.
type Webhook interface {
	// Verify checks the signature of a notification request and returns
	// the outcomes it announces that billing acts on (none for events it
	// does not act on: acknowledged and ignored). An error means nothing
	// in it verified: the request changes nothing and is answered 400.
	Verify(header http.Header, body []byte, now time.Time) ([]Notification, error)
	// Ack is the answer's body that tells the provider a notification is
	// taken.
	Ack() []byte
}

// Snippet keeps an answer short and single-line for error texts (logs,
// dead-letter headers), with secret masked: a provider, or a proxy in
// front of it, may echo a key back.
func Snippet(b []byte, secret string) string {
	const limit = 200
	s := strings.Join(strings.Fields(string(b)), " ")
	if secret != "" {
		s = strings.ReplaceAll(s, secret, "xxxxx")
	}
	if len(s) > limit {
		s = s[:limit] + "…"
	}
	return s
}

// Code returns code when it is a short identifier ([A-Za-z0-9_.-], at most
// 64 bytes), else "": a decline code goes into an event other services
// read, and a provider's free text must not.
func Code(code string) string {
	if len(code) > 64 {
		return ""
	}
	for _, r := range code {
		if !(r == '_' || r == '-' || r == '.' || ('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z') || ('0' <= r && r <= '9')) {
			return ""
		}
	}
	return code
}

// ListedCharge is a payment as the provider's list API returns it: its side
// of a reconciliation, in the contract's terms whatever the provider.
type ListedCharge struct {
	ID             string    `json:"id"`
	IdempotencyKey string    `json:"idempotencyKey,omitempty"`
	OrderID        int64     `json:"orderId"`
	CustomerID     int64     `json:"customerId"`
	Amount         int64     `json:"amount"`   // minor units
	Currency       string    `json:"currency"` // ISO 4217, upper case
	Status         string    `json:"status"`   // "succeeded" for money moved
	Created        time.Time `json:"created"`
}
