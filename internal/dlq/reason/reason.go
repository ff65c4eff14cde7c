// Package reason is the dead-letter topic's vocabulary: why a message was
// parked, as a stable code and a detail for a human, written as
// "<code>: <detail>" in its x-dlq-reason header. billing decides the
// reasons, package dlq writes and reads them, and both take them from
// here: every code in one block.
package reason

import "strings"

// Code is the stable, kebab-case start of x-dlq-reason.
type Code string

// The reasons a message is parked. Each is a fault of the message itself,
// which no wait can change; a failure of the environment is retried, never
// parked.
const (
	// InvalidEvent: not an order.confirmed.v1 event (bad JSON, a missing
	// or wrong field, an eventId time too far ahead), or data the database
	// refuses.
	InvalidEvent Code = "invalid-event"
	// StaleEvent: billing cannot judge the event without a human: older
	// than the dedup retention, on a day whose records were dropped, or
	// with a charge attempt past the provider's idempotency window.
	StaleEvent Code = "stale-event"
	// PayloadMismatch: an eventId already processed arrives with another
	// payload.
	PayloadMismatch Code = "payload-mismatch"
	// ProviderRejected: the provider refused the request itself (422, 400,
	// Stripe's invalid_request_error or resource_missing, Adyen's
	// validation errors).
	ProviderRejected Code = "provider-rejected"
	// NoPaymentMethod: the provider charges a saved payment method and the
	// customer has none in payment_method; nothing was sent. A replay
	// after `billing payment-methods import` charges it.
	NoPaymentMethod Code = "no-payment-method"
	// Oversize: too large for the dead-letter topic even compressed: parked
	// as a reference, its detail the reason it was parked for.
	Oversize Code = "oversize"
)

// Codes are all the codes, for listings and validation.
var Codes = []Code{InvalidEvent, StaleEvent, PayloadMismatch, ProviderRejected, NoPaymentMethod, Oversize}

// Reason is why one message was parked.
type Reason struct {
	Code   Code
	Detail string
}

// String is the x-dlq-reason value: "<code>: <detail>".
func (r Reason) String() string { return string(r.Code) + ": " + r.Detail }

// Parse reads an x-dlq-reason value back; a value without ":" is all code.
func Parse(header string) Reason {
	code, detail, _ := strings.Cut(header, ":")
	return Reason{Code: Code(strings.TrimSpace(code)), Detail: strings.TrimPrefix(detail, " ")}
}
