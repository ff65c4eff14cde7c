// Package fakepsp is a local fake payment service provider (PSP) with
// Stripe-like idempotency and fault injection.
//
// It speaks one of three profiles (Options.Profile), the API of the provider
// billing is configured for, and keeps exact, concurrency-safe books of
// everything it did, so that tests, the demo and the chaos suite (which runs
// it as a separate process and drives it over HTTP) can check invariants
// such as "no order charged twice" against [Server.Stats],
// [Server.Charges] and [Server.Payments]. The routes of the other profile
// answer 404, so a billing configured for the wrong provider fails loudly.
//
// # The contract profile
//
// The default. It serves billing's own contract, POST /v1/charges with a
// JSON body. A POST /v1/charges is decided in this order; the first rule
// that applies answers it:
//
//  1. provider down (see [Server.SetDown]): 503, nothing changes;
//  2. more than RateLimit requests arrived within the last second: 429 with
//     Retry-After: 1, nothing stored;
//  3. APIKey set and Authorization missing or wrong: 401, nothing stored;
//  4. malformed request: 400, nothing stored;
//  5. injected failure (FailRate, or an order of FailOrders): 503, nothing
//     stored, so a retry with the same key creates the outcome;
//  6. key already used with a different body: 422, even while in flight,
//     since retrying cannot fix it;
//  7. key in flight: 409;
//  8. key with a stored outcome, younger than IdempotencyTTL: the stored
//     answer, byte for byte, with header Idempotent-Replayed: true (an older
//     key is forgotten and the request is new);
//  9. otherwise the request claims the key, waits Latency, and creates the
//     outcome: when ProcessingEvery divides the order id, a payment without
//     a verdict (202, status "processing"); else a decline (402) when
//     DeclineEvery divides the order id; else a charge (200). A charge or a
//     processing answer is then lost (the connection reset) with probability
//     ResetRate.
//
// A processing payment gets its verdict ProcessingDelay after it was
// created: declined when DeclineEvery divides the order id, else succeeded.
// The verdict is then sent to WebhookURL (see "Webhooks"); a repeated
// request under its key still replays the stored 202, as an idempotency
// layer replays the first answer. GET /v1/charges?idempotency_key=<key>
// tells the key's payment as it stands: succeeded, declined or processing.
//
// # The stripe profile
//
// Stripe's PaymentIntents API as billing calls it: POST /v1/payment_intents,
// form-encoded, with confirm=true and off_session=true, a customer and a
// saved payment method. A POST /v1/payment_intents is decided in this
// order:
//
//  1. provider down: 503 api_error, Stripe-Should-Retry: true;
//  2. more than RateLimit requests (any /v1 route) within the last second:
//     429 rate_limit, without Retry-After, Stripe-Should-Retry: true; Stripe's
//     rate limiter runs before its idempotency layer, so nothing is stored;
//  3. APIKey set and no matching bearer token: 401;
//  4. StripeVersion set and a Stripe-Version header other than it: 400;
//  5. a request Stripe would refuse before executing it (not form-encoded,
//     a missing, unknown or malformed parameter, an amount out of range):
//     400 invalid_request_error, nothing stored;
//  6. a customer or payment method that does not exist (see below): 404
//     resource_missing, nothing stored;
//  7. injected failure (FailRate, FailOrders by metadata[order_id]): 503,
//     Stripe-Should-Retry: true, nothing stored;
//  8. Idempotency-Key already used with other parameters: 400
//     idempotency_error, even while in flight;
//  9. key in flight: 409 idempotency_key_in_use, Stripe-Should-Retry: true;
//  10. key with a stored answer, younger than IdempotencyTTL (default 24h):
//     the stored answer byte for byte, whatever its status (200, 402, 500),
//     with Idempotent-Replayed: true;
//  11. otherwise (or without an Idempotency-Key, which Stripe allows) the
//     request waits Latency and creates a PaymentIntent whose outcome its
//     payment method chooses. With probability Stored500Rate the answer,
//     stored under the key, is a 500 api_error with Stripe-Should-Retry:
//     false, while the PaymentIntent is created all the same (Stripe's
//     "treat the result of a 500 as indeterminate"); a client learns what
//     happened only by looking it up or from its webhook. A 200 answer is
//     lost (connection reset) with probability ResetRate.
//
// Outcomes by payment method (Stripe's test ids, and fakes of our own):
//
//	pm_card_visa, any other pm_...           200 succeeded
//	pm_card_chargeDeclined                   402 card_error card_declined, decline_code generic_decline
//	pm_card_chargeDeclinedInsufficientFunds  402 card_error card_declined, decline_code insufficient_funds
//	pm_card_authenticationRequired           402 card_error authentication_required, decline_code authentication_required
//	pm_fakeDebit_success                     200 processing; ProcessingDelay later succeeded
//	pm_fakeDebit_failure                     200 processing; ProcessingDelay later failed (requires_payment_method, last_payment_error insufficient_funds)
//	pm_fakeDebit_neverSettles                200 processing, for ever
//	pm_missing..., or not pm_...             404 resource_missing (param payment_method)
//	customer cus_missing..., or not cus_...  404 resource_missing (param customer)
//
// A declined PaymentIntent exists (status requires_payment_method), as at
// Stripe, and the 402 embeds it in error.payment_intent. Lookups:
// GET /v1/payment_intents/{id}, GET /v1/payment_intents (list, newest
// first, by customer and created[...], paginated), and
// GET /v1/payment_intents/search?query=metadata['k']:'v', which, like
// Stripe's search, only finds a PaymentIntent SearchLag (default 60s) after
// it was created.
//
// # The adyen profile
//
// Adyen's Checkout API as billing calls it: POST /payments (under any
// version's root, /v71/payments), JSON, a merchant-initiated payment with
// a stored card (paymentMethod {type scheme, storedPaymentMethodId},
// shopperInteraction ContAuth, recurringProcessingModel
// UnscheduledCardOnFile), X-API-Key. A POST /payments is decided in this
// order:
//
//  1. provider down: 503, nothing stored;
//  2. more than RateLimit requests within the last second: 429, nothing
//     stored;
//  3. APIKey set and no matching X-API-Key: 401 errorType security;
//  4. a request Adyen would refuse before processing it (not JSON, an
//     unknown or missing field, an amount, currency or reference out of
//     range, not a stored-card ContAuth payment): 400 or 422 errorCode 000,
//     errorType validation, nothing stored;
//  5. AdyenMerchantAccount set and another merchantAccount: 403 errorCode
//     901;
//  6. injected failure (FailRate, FailOrders by merchantOrderReference):
//     503, nothing stored;
//  7. storedPaymentMethodId stored_invalid: 422 errorCode 101 (Adyen's
//     documented example of a validation error), nothing stored;
//  8. Idempotency-Key used with another body: 422 errorCode 00_422 (what
//     Adyen answers is not documented; billing parks either way), even
//     while in flight;
//  9. key in flight: 422 errorCode 704, "request already processed or in
//     progress", with transient-error: true;
//  10. key with a stored answer, younger than IdempotencyTTL (default 31
//     days): the stored first answer, byte for byte;
//  11. otherwise the request waits Latency and creates a payment whose
//     outcome its stored payment method chooses, answered 200 with its
//     resultCode and pspReference (none while the shopper would have to
//     act: Adyen gives it in /payments/details then). An authorisation,
//     or a payment pending, loses its answer (connection reset) with
//     probability ResetRate.
//
// Every answer to a request with an Idempotency-Key echoes it. Outcomes by
// storedPaymentMethodId:
//
//	any id not below                 Authorised
//	stored_refused                   Refused (refusalReason Refused, code 2)
//	stored_notEnoughBalance          Refused (Not enough balance, code 12)
//	stored_cancelled                 Cancelled
//	stored_error                     Error (Acquirer Error, code 4)
//	stored_pending                   Pending; ProcessingDelay later Authorised
//	stored_pendingRefused            Pending; ProcessingDelay later Refused
//	stored_pendingNeverSettles       Pending, for ever
//	stored_received                  Received; ProcessingDelay later Authorised
//	stored_redirectShopper           RedirectShopper (with a redirect action)
//	stored_identifyShopper           IdentifyShopper
//	stored_challengeShopper          ChallengeShopper
//	stored_invalid                   422 errorCode 101 (rule 7)
//
// Adyen has no lookup or list API, and neither has the profile: a request
// repeated under its key within IdempotencyTTL learns the stored answer,
// which for a payment that was pending stays Pending after its verdict.
//
// # Webhooks
//
// With WebhookURL set, the server posts a notification for every outcome
// of the contract's processing payments, and a Stripe event for every
// PaymentIntent that succeeds, fails or is processing (also immediate ones,
// as Stripe does), signed with WebhookSecret. Each is sent after a delay in
// [WebhookDelayMin, WebhookDelayMax] and retried with backoff (up to
// WebhookRetryMax between tries) until answered 2xx or the server is
// closed. Faults, drawn per notification: never sent (WebhookDropRate, or
// Stored500DropRate for a PaymentIntent whose answer was a stored 500), sent
// again once delivered (WebhookRepeatRate), a forged copy with a signature
// that does not verify, half of them also claiming the opposite outcome
// (WebhookForgeRate), and a copy whose signature is older than five minutes
// (WebhookStaleRate). Stats counts what the endpoint answered to each. The
// goroutines that wait and send stop when [Server.Close] is called.
//
// The adyen profile notifies every verdict (Authorised, Refused,
// Cancelled, Error, and a pending payment's when it comes; nothing while
// the shopper would have to act) with an AUTHORISATION item, success true
// or false with the refusal reason, signed with the first HMAC key of
// WebhookSecret (hex): additionalData.hmacSignature, base64 of the
// HMAC-SHA256 of
// pspReference:originalReference:merchantAccountCode:merchantReference:value:currency:eventCode:success.
// Items are sent in batches, {"live":"false","notificationItems":[...]}:
// those ready within WebhookBatchWait of the first go together, at most
// six, and a batch is retried until the endpoint answers 2xx with the body
// [accepted]. Its faults are drawn per item: never sent (WebhookDropRate
// for a verdict the answer gave, PendingDropRate for that of a payment
// answered Pending or Received), delivered once more, a forged copy (signed with another key, half of them claiming the
// opposite verdict) that joins whatever batch is ready; a batch of forged
// items only is posted once. WebhookStaleRate does not apply: Adyen signs
// no time.
//
// The contract's notification is the JSON object
// {"id":"ch_...","idempotencyKey":"<key>","status":"succeeded"|"declined"}
// (with "declineCode" for a decline) and header Signature; Stripe's is an
// Event, {"id":"evt_...","object":"event","type":"payment_intent.succeeded"
// (or .payment_failed, .processing),"data":{"object":<PaymentIntent>},...},
// with header Stripe-Signature. Both signatures read
// t=<unix>,v1=<hex HMAC-SHA256 of "<unix>.<body>">, one v1 per secret.
//
// Every charge request (every profile), whatever its outcome, is answered
// only after Latency; lookups are answered at once. The request that claims
// a key creates its outcome even if its client has gone away meanwhile, as
// a real provider would.
package fakepsp

import (
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// The profiles: which provider's API the server speaks.
const (
	// ProfileContract is billing's own contract, POST /v1/charges.
	ProfileContract = "contract"
	// ProfileStripe is Stripe's PaymentIntents API.
	ProfileStripe = "stripe"
	// ProfileAdyen is Adyen's Checkout API.
	ProfileAdyen = "adyen"
)

// Defaults of the options whose zero value means "the provider's usual".
const (
	// DefaultIdempotencyTTL is how long Stripe keeps an idempotency key
	// (at least 24 hours), and billing's PAYMENT_IDEMPOTENCY_WINDOW.
	DefaultIdempotencyTTL = 24 * time.Hour
	// DefaultAdyenIdempotencyTTL is how long Adyen keeps an idempotency
	// key (at least 31 days), the adyen profile's default.
	DefaultAdyenIdempotencyTTL = 31 * 24 * time.Hour
	// DefaultWebhookBatchWait is how long the adyen profile's first
	// notification item ready waits for others to join its batch.
	DefaultWebhookBatchWait = 50 * time.Millisecond
	// DefaultSearchLag is about how long Stripe's search index lags behind
	// its objects ("under a minute" in normal operation).
	DefaultSearchLag = time.Minute
	// DefaultWebhookRetryMax caps the pause between two tries of a
	// webhook delivery.
	DefaultWebhookRetryMax = 10 * time.Second
)

// Options configures the provider and the faults it injects. The zero value
// is a well-behaved contract provider.
//
// In JSON (PUT /_faults, GET /_faults) durations are integer numbers of
// nanoseconds, as encoding/json writes a time.Duration.
type Options struct {
	// Profile is the API served: ProfileContract (also when empty),
	// ProfileStripe or ProfileAdyen. It may change at run time (PUT
	// /_faults); what each profile created stays in the books.
	Profile string `json:"profile,omitempty"`
	// Latency is added to every charge request (every profile) before it
	// is answered. The request that creates an outcome keeps its key in
	// flight for that long, so duplicates arriving meanwhile get 409
	// (Adyen: 422 errorCode 704).
	Latency time.Duration `json:"latency"`
	// FailRate is the probability of answering 503 without doing anything.
	FailRate float64 `json:"failRate"`
	// FailOrders are orders whose every charge request is answered 503
	// without doing anything, as long as they are listed: a key stuck on a
	// provider error among others that go through. Stripe: the order is
	// metadata[order_id]; Adyen: merchantOrderReference.
	FailOrders []int64 `json:"failOrders,omitempty"`
	// ResetRate is the probability of creating and storing a charge and then
	// closing the connection without answering ("provider said 200,
	// connection reset"). Declines (Adyen's refusals too) and stored 500s
	// are always answered.
	ResetRate float64 `json:"resetRate"`
	// DeclineEvery, when > 0, declines (402) contract orders whose id is a
	// multiple of it. 0 never declines. Stripe and Adyen decline by
	// payment method.
	DeclineEvery int64 `json:"declineEvery"`
	// RateLimit, when > 0, answers 429 to a request that arrives when
	// RateLimit requests already arrived within the last second, as a
	// provider's rate limit does (Stripe's sandbox and per-endpoint limit:
	// 25). Contract: charge requests count, and the 429 has Retry-After: 1.
	// Stripe: every /v1 request counts, and the 429 has no Retry-After.
	// Adyen: POST /payments counts, and the 429 has no Retry-After.
	RateLimit int `json:"rateLimit"`
	// APIKey, when set, is required as Authorization: Bearer <APIKey> on
	// the contract's POST /v1/charges and on every Stripe /v1 route, and
	// as X-API-Key on Adyen's POST /payments.
	APIKey string `json:"apiKey,omitempty"`
	// Seed seeds the fault randomness so that runs replay.
	Seed int64 `json:"seed"`

	// ProcessingEvery, when > 0, answers the contract's charge of an order
	// whose id is a multiple of it 202 {"status":"processing"}, and decides
	// it ProcessingDelay later. 0: every answer is final.
	ProcessingEvery int64 `json:"processingEvery"`
	// ProcessingDelay is how long a processing payment (contract, a
	// Stripe fake debit, an Adyen Pending or Received) waits for its
	// verdict.
	ProcessingDelay time.Duration `json:"processingDelay"`
	// IdempotencyTTL is how long a stored answer is kept under its key;
	// a key used again after that is new. 0 means the profile's provider's:
	// DefaultIdempotencyTTL (contract, stripe), DefaultAdyenIdempotencyTTL
	// (adyen).
	IdempotencyTTL time.Duration `json:"idempotencyTtl"`

	// AdyenMerchantAccount, when set, is the only merchantAccount the
	// adyen profile takes (403 errorCode 901 otherwise); empty takes any.
	AdyenMerchantAccount string `json:"adyenMerchantAccount,omitempty"`

	// StripeVersion, when set, is the only Stripe-Version header accepted
	// (400 otherwise, as stripe-mock's strict version check) and the
	// api_version of the events; else any version is taken and events
	// carry stripe-go's.
	StripeVersion string `json:"stripeVersion,omitempty"`
	// Stored500Rate is the probability that a new Stripe key's answer is
	// a stored 500 while its PaymentIntent is created anyway.
	Stored500Rate float64 `json:"stored500Rate"`
	// Stored500DropRate is the probability that an event of a
	// PaymentIntent answered with a stored 500 is never sent (in place of
	// WebhookDropRate), so that only a lookup finds its outcome.
	Stored500DropRate float64 `json:"stored500DropRate"`
	// SearchLag is how long after its creation a PaymentIntent appears in
	// search results. 0 means DefaultSearchLag; set 1ns for no lag.
	SearchLag time.Duration `json:"searchLag"`

	// WebhookURL is where notifications are posted; none are sent when it
	// is empty.
	WebhookURL string `json:"webhookUrl,omitempty"`
	// WebhookSecret signs the notifications. Comma-separated, each secret
	// adds a v1 signature, as Stripe signs with both secrets while one is
	// rolled. Adyen: HMAC keys in hex, of which the first signs, as Adyen
	// signs with the one key its endpoint has.
	WebhookSecret string `json:"webhookSecret,omitempty"`
	// WebhookDelayMin and WebhookDelayMax bound the delay before a
	// notification (or a repeated, forged or stale copy) is first sent,
	// drawn uniformly.
	WebhookDelayMin time.Duration `json:"webhookDelayMin"`
	WebhookDelayMax time.Duration `json:"webhookDelayMax"`
	// WebhookRetryMax caps the pause between the tries of a delivery the
	// endpoint did not answer 2xx (100ms, doubled each time). 0 means
	// DefaultWebhookRetryMax.
	WebhookRetryMax time.Duration `json:"webhookRetryMax"`
	// WebhookRepeatRate is the probability that a delivered notification
	// is delivered once more.
	WebhookRepeatRate float64 `json:"webhookRepeatRate"`
	// WebhookForgeRate is the probability that a forged copy of a
	// notification is posted too, once: signed with another secret, and
	// half of the time claiming the opposite outcome.
	WebhookForgeRate float64 `json:"webhookForgeRate"`
	// WebhookStaleRate is the probability that a copy signed ten minutes
	// ago (past the five minutes' tolerance) is posted too, once. Adyen
	// signs no time: the adyen profile ignores it.
	WebhookStaleRate float64 `json:"webhookStaleRate"`
	// WebhookDropRate is the probability that a notification is never
	// sent. Adyen: the notification of a verdict its answer gave (see
	// PendingDropRate for the others).
	WebhookDropRate float64 `json:"webhookDropRate"`
	// PendingDropRate is the probability that the adyen profile's
	// notification of a payment it answered Pending or Received (its
	// verdict, decided later) is never sent, in place of WebhookDropRate.
	// For such a payment the notification is the only word a client gets
	// (Adyen has no lookup, and the key replays Pending), and Adyen
	// retries one until it is accepted rather than lose it: losing it is
	// a fault of its own, which leaves the client's payment in progress
	// for a human.
	PendingDropRate float64 `json:"pendingDropRate"`
	// WebhookBatchWait is how long the adyen profile's first notification
	// item ready waits for others to join its batch (at most six items).
	// 0 means DefaultWebhookBatchWait; set 1ns for no wait.
	WebhookBatchWait time.Duration `json:"webhookBatchWait"`
}

// Validate rejects options that cannot be meant. PUT /_faults and the
// fakepsp command use it; New and SetOptions have no error to return, and
// out-of-range values there behave as the nearest valid one (an unknown
// profile serves no provider route).
func (o Options) Validate() error {
	rates := []struct {
		name string
		p    float64
	}{
		{"failRate", o.FailRate}, {"resetRate", o.ResetRate},
		{"stored500Rate", o.Stored500Rate}, {"stored500DropRate", o.Stored500DropRate},
		{"webhookRepeatRate", o.WebhookRepeatRate}, {"webhookForgeRate", o.WebhookForgeRate},
		{"webhookStaleRate", o.WebhookStaleRate}, {"webhookDropRate", o.WebhookDropRate},
		{"pendingDropRate", o.PendingDropRate},
	}
	for _, r := range rates {
		if r.p < 0 || r.p > 1 {
			return fmt.Errorf("%s must be within [0, 1]", r.name)
		}
	}
	durations := []struct {
		name string
		d    time.Duration
	}{
		{"latency", o.Latency}, {"processingDelay", o.ProcessingDelay},
		{"idempotencyTtl", o.IdempotencyTTL}, {"searchLag", o.SearchLag},
		{"webhookDelayMin", o.WebhookDelayMin}, {"webhookDelayMax", o.WebhookDelayMax},
		{"webhookRetryMax", o.WebhookRetryMax}, {"webhookBatchWait", o.WebhookBatchWait},
	}
	for _, d := range durations {
		if d.d < 0 {
			return fmt.Errorf("%s must not be negative", d.name)
		}
	}
	switch {
	case o.Profile != "" && o.Profile != ProfileContract && o.Profile != ProfileStripe && o.Profile != ProfileAdyen:
		return fmt.Errorf("profile must be %q, %q or %q, not %q", ProfileContract, ProfileStripe, ProfileAdyen, o.Profile)
	case o.Profile == ProfileAdyen && !hexKeys(o.WebhookSecret):
		return errors.New("webhookSecret must be Adyen HMAC keys in hex, comma-separated")
	case o.DeclineEvery < 0:
		return errors.New("declineEvery must not be negative")
	case o.ProcessingEvery < 0:
		return errors.New("processingEvery must not be negative")
	case o.RateLimit < 0:
		return errors.New("rateLimit must not be negative")
	case o.WebhookDelayMax < o.WebhookDelayMin:
		return errors.New("webhookDelayMax must not be less than webhookDelayMin")
	}
	return nil
}

// profile is the profile the options select, ProfileContract when empty.
func (o Options) profile() string {
	return cmp.Or(o.Profile, ProfileContract)
}

func (o Options) idempotencyTTL() time.Duration {
	if o.profile() == ProfileAdyen {
		return cmp.Or(o.IdempotencyTTL, DefaultAdyenIdempotencyTTL)
	}
	return cmp.Or(o.IdempotencyTTL, DefaultIdempotencyTTL)
}

func (o Options) webhookBatchWait() time.Duration {
	return cmp.Or(o.WebhookBatchWait, DefaultWebhookBatchWait)
}

// hexKeys reports whether secrets, comma-separated, are all hex (or there
// are none).
func hexKeys(secrets string) bool {
	if strings.TrimSpace(secrets) == "" {
		return true
	}
	for k := range strings.SplitSeq(secrets, ",") {
		if b, err := hex.DecodeString(strings.TrimSpace(k)); err != nil || len(b) == 0 {
			return false
		}
	}
	return true
}

func (o Options) searchLag() time.Duration {
	return cmp.Or(o.SearchLag, DefaultSearchLag)
}

func (o Options) webhookRetryMax() time.Duration {
	return cmp.Or(o.WebhookRetryMax, DefaultWebhookRetryMax)
}

// Charge is a payment of the contract profile: a succeeded charge in
// [Server.Charges] and GET /v1/charges, any status in the answer to
// GET /v1/charges?idempotency_key=.
type Charge struct {
	ID             string    `json:"id"`
	IdempotencyKey string    `json:"idempotencyKey"`
	OrderID        int64     `json:"orderId"`
	CustomerID     int64     `json:"customerId"`
	Amount         int64     `json:"amount"`
	Currency       string    `json:"currency"`
	Status         string    `json:"status"` // "succeeded", "declined" or "processing"
	DeclineCode    string    `json:"declineCode,omitempty"`
	Created        time.Time `json:"created"`
}

// Payment is one payment the server holds, whatever its profile, as it
// stands now: what a test compares with billing's charge table.
type Payment struct {
	Profile string `json:"profile"`
	// ID is the contract's ch_... or Stripe's PaymentIntent pi_....
	ID string `json:"id"`
	// IdempotencyKey is the key the payment was created under (empty for a
	// Stripe request sent without one).
	IdempotencyKey string `json:"idempotencyKey,omitempty"`
	// EventID is Stripe's metadata[event_id]; the contract's idempotency
	// key, which billing sets to the event id.
	EventID string `json:"eventId,omitempty"`
	// OrderID is the contract's orderId, Stripe's metadata[order_id] (0
	// when absent or not an integer).
	OrderID int64 `json:"orderId"`
	// Customer is the contract's customerId in decimal, Stripe's cus_....
	Customer      string `json:"customer"`
	PaymentMethod string `json:"paymentMethod,omitempty"`
	Amount        int64  `json:"amount"`
	// Currency is as sent: upper case (contract), lower case (Stripe).
	Currency string `json:"currency"`
	// Status is "succeeded", "declined" (Stripe: failed, the PaymentIntent
	// requires_payment_method) or "processing".
	Status string `json:"status"`
	// ProviderStatus is the status as the provider tells it (Stripe's
	// PaymentIntent status).
	ProviderStatus string `json:"providerStatus"`
	// DeclineCode is the decline code, else the error code, of a decline.
	DeclineCode string `json:"declineCode,omitempty"`
	// Answer is the HTTP status the creating request was answered with
	// (Stripe: 500 when it was a stored 500).
	Answer int `json:"answer"`
	// AnswerLost is set when that answer was never sent (ResetRate).
	AnswerLost bool      `json:"answerLost,omitempty"`
	Created    time.Time `json:"created"`
	// Decided is when a payment that was processing got its verdict.
	Decided time.Time `json:"decided,omitzero"`
}

// Stats counts what the server did. The top-level counters are the
// contract profile's, as they have always been: every POST /v1/charges
// increments Requests when it arrives and exactly one of ChargesCreated,
// Declines, Contract.Processing, Replays, Conflicts, Mismatches,
// BadRequests, Unauthorized, InjectedFailures and DownRejections when it is
// decided, so once no request is in flight Requests is their sum. Resets
// counts the charges among ChargesCreated (and the processing payments)
// whose answer was dropped.
type Stats struct {
	Requests           int64 `json:"requests"`           // every POST /v1/charges received
	DistinctKeys       int64 `json:"distinctKeys"`       // outcomes stored under a key (again after a key expired)
	ChargesCreated     int64 `json:"chargesCreated"`     // succeeded charges created at once (not replays)
	Declines           int64 `json:"declines"`           // declines created at once (not replays)
	Replays            int64 `json:"replays"`            // stored answers replayed
	Conflicts          int64 `json:"conflicts"`          // 409
	Mismatches         int64 `json:"mismatches"`         // 422
	BadRequests        int64 `json:"badRequests"`        // 400
	Unauthorized       int64 `json:"unauthorized"`       // 401
	InjectedFailures   int64 `json:"injectedFailures"`   // 503 from FailRate or FailOrders
	DownRejections     int64 `json:"downRejections"`     // 503 while down
	RateLimited        int64 `json:"rateLimited"`        // 429 from RateLimit
	Resets             int64 `json:"resets"`             // connections closed after charging
	OrdersChargedTwice int64 `json:"ordersChargedTwice"` // orders with more than one succeeded payment, every profile
	// PeakPerSecond is the most requests that arrived within any one
	// second (a sliding window): what a rate limit would have seen. The
	// contract's charge requests, every Stripe /v1 request and Adyen's
	// POST /payments count.
	PeakPerSecond int64 `json:"peakPerSecond"`
	// Contract counts what the contract profile added: processing
	// payments, key expiry, lookups and webhooks.
	Contract ContractStats `json:"contract"`
	// Stripe counts the stripe profile.
	Stripe StripeStats `json:"stripe"`
	// Adyen counts the adyen profile.
	Adyen AdyenStats `json:"adyen"`
	// PendingWebhooks is how many deliveries (every profile; repeated,
	// forged and stale copies included; Adyen's by item) wait or are being
	// tried: 0 once every notification was delivered, dropped or given up.
	PendingWebhooks int64 `json:"pendingWebhooks"`
}

// ContractStats counts the contract profile's processing payments,
// lookups and webhooks.
type ContractStats struct {
	Processing          int64        `json:"processing"`          // 202 created (not replays)
	ProcessingSucceeded int64        `json:"processingSucceeded"` // of those, decided succeeded
	ProcessingDeclined  int64        `json:"processingDeclined"`  // of those, decided declined
	KeysExpired         int64        `json:"keysExpired"`         // stored keys forgotten after IdempotencyTTL and used again
	Lookups             int64        `json:"lookups"`             // GET /v1/charges?idempotency_key=
	Webhooks            WebhookStats `json:"webhooks"`
}

// StripeStats counts the stripe profile. Every POST /v1/payment_intents
// increments Requests when it arrives and exactly one of Succeeded,
// Declined, Processing, Replays, IdempotencyErrors, Conflicts,
// RateLimited, NotFound, BadRequests, Unauthorized, InjectedFailures and
// DownRejections when it is decided.
type StripeStats struct {
	Requests            int64 `json:"requests"`            // every POST /v1/payment_intents received
	Succeeded           int64 `json:"succeeded"`           // PaymentIntents created succeeded
	Declined            int64 `json:"declined"`            // PaymentIntents created and declined (402)
	Processing          int64 `json:"processing"`          // PaymentIntents created processing
	ProcessingSucceeded int64 `json:"processingSucceeded"` // of those, later succeeded
	ProcessingFailed    int64 `json:"processingFailed"`    // of those, later failed
	Stored500s          int64 `json:"stored500s"`          // created PaymentIntents whose stored answer is a 500
	Resets              int64 `json:"resets"`              // created PaymentIntents whose answer was dropped
	Replays             int64 `json:"replays"`             // stored answers replayed (Idempotent-Replayed)
	IdempotencyErrors   int64 `json:"idempotencyErrors"`   // 400 idempotency_error
	Conflicts           int64 `json:"conflicts"`           // 409 idempotency_key_in_use
	RateLimited         int64 `json:"rateLimited"`         // 429
	NotFound            int64 `json:"notFound"`            // 404 resource_missing (customer or payment method)
	BadRequests         int64 `json:"badRequests"`         // 400 invalid_request_error
	Unauthorized        int64 `json:"unauthorized"`        // 401
	InjectedFailures    int64 `json:"injectedFailures"`    // 503 from FailRate or FailOrders
	DownRejections      int64 `json:"downRejections"`      // 503 while down
	KeysExpired         int64 `json:"keysExpired"`         // stored keys forgotten after IdempotencyTTL and used again

	Lookups  StripeLookups `json:"lookups"`
	Webhooks WebhookStats  `json:"webhooks"`
}

// AdyenStats counts the adyen profile. Every POST /payments increments
// Requests when it arrives and exactly one of Authorised, Refused,
// Cancelled, Errors, Pending, Received, ShopperActions, Replays, InFlight,
// Mismatches, Invalid, Unauthorized, Forbidden, RateLimited,
// InjectedFailures and DownRejections when it is decided.
type AdyenStats struct {
	Requests          int64 `json:"requests"`          // every POST /payments received
	Authorised        int64 `json:"authorised"`        // payments created Authorised
	Refused           int64 `json:"refused"`           // payments created Refused
	Cancelled         int64 `json:"cancelled"`         // payments created Cancelled
	Errors            int64 `json:"errors"`            // payments created Error
	Pending           int64 `json:"pending"`           // payments created Pending
	Received          int64 `json:"received"`          // payments created Received
	PendingAuthorised int64 `json:"pendingAuthorised"` // Pending or Received payments later authorised
	PendingRefused    int64 `json:"pendingRefused"`    // Pending or Received payments later refused
	ShopperActions    int64 `json:"shopperActions"`    // payments created RedirectShopper, IdentifyShopper, ChallengeShopper
	Resets            int64 `json:"resets"`            // created payments whose answer was dropped
	Replays           int64 `json:"replays"`           // stored answers replayed
	InFlight          int64 `json:"inFlight"`          // 422 errorCode 704: the key's request still in flight
	Mismatches        int64 `json:"mismatches"`        // 422 00_422: the key used with another body
	Invalid           int64 `json:"invalid"`           // 400 or 422 validation errors (malformed, stored_invalid)
	Unauthorized      int64 `json:"unauthorized"`      // 401
	Forbidden         int64 `json:"forbidden"`         // 403 901: another merchant account
	RateLimited       int64 `json:"rateLimited"`       // 429
	InjectedFailures  int64 `json:"injectedFailures"`  // 503 from FailRate or FailOrders
	DownRejections    int64 `json:"downRejections"`    // 503 while down
	KeysExpired       int64 `json:"keysExpired"`       // stored keys forgotten after IdempotencyTTL and used again

	// Webhooks counts notification items (Events, Dropped, NoEndpoint,
	// Delivered, Repeated, Forged) and batch POSTs (Sent, Refused,
	// Failed); ForgedAccepted counts batches of forged items only that
	// were answered [accepted] (a forged item beside genuine ones is
	// ignored, and its batch accepted).
	Webhooks WebhookStats `json:"webhooks"`
}

// StripeLookups counts the stripe profile's lookups, by kind.
type StripeLookups struct {
	Retrieve int64 `json:"retrieve"` // GET /v1/payment_intents/{id} received
	Search   int64 `json:"search"`   // GET /v1/payment_intents/search received
	List     int64 `json:"list"`     // GET /v1/payment_intents received
	NotFound int64 `json:"notFound"` // retrieves of an unknown id (404)
	Rejected int64 `json:"rejected"` // lookups answered with another error (429, 401, 400, 503)
}

// WebhookStats counts one profile's notifications and what the endpoint
// answered.
type WebhookStats struct {
	Events     int64 `json:"events"`     // notifications generated
	Dropped    int64 `json:"dropped"`    // never sent (WebhookDropRate, Stored500DropRate)
	NoEndpoint int64 `json:"noEndpoint"` // not sent: no WebhookURL when generated or when due
	Sent       int64 `json:"sent"`       // POSTs of notifications, retries and repeats included
	Delivered  int64 `json:"delivered"`  // notifications answered 2xx (once each)
	Repeated   int64 `json:"repeated"`   // delivered notifications delivered again and answered 2xx
	Refused    int64 `json:"refused"`    // POSTs of notifications answered other than 2xx
	Failed     int64 `json:"failed"`     // POSTs of notifications that got no answer
	// Forged copies are posted once and must be refused: ForgedAccepted
	// counts those answered 2xx all the same. Likewise Stale.
	Forged         int64 `json:"forged"`
	ForgedAccepted int64 `json:"forgedAccepted"`
	Stale          int64 `json:"stale"`
	StaleAccepted  int64 `json:"staleAccepted"`
	// Batches counts the adyen profile's batches answered [accepted], and
	// LargestBatch the most items one of them held.
	Batches      int64 `json:"batches,omitempty"`
	LargestBatch int64 `json:"largestBatch,omitempty"`
}

// ClientStats is what the server saw of one client address: the chaos
// suite runs replicas in network namespaces of their own, each with its
// own source address, and tells from these which replica still sends
// charges (a replica cut off from the brokers must stop) without billing
// knowing it is watched.
type ClientStats struct {
	// Requests counts the charge requests (POST /v1/charges, POST
	// /v1/payment_intents, Adyen's POST /payments) that arrived from the
	// address, whatever their answer.
	Requests int64 `json:"requests"`
	// Last is when the last of them arrived.
	Last time.Time `json:"last"`
}

// pcgStream is the second PCG parameter. Only Seed varies between runs; any
// fixed value keeps them replayable.
const pcgStream = 0x9e3779b97f4a7c15

// Server is the fake provider. It is an http.Handler; create it with New,
// and Close it once it has sent or decided anything later than its answers
// (processing payments, webhooks).
type Server struct {
	mux *http.ServeMux

	// ctx ends when the server is closed; every goroutine the server
	// starts waits on it, and wg counts them.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// webhooks posts the notifications; slots bounds how many are in
	// flight at once.
	webhooks *http.Client
	slots    chan struct{}

	mu     sync.Mutex // guards the fields below; never held while sleeping or sending
	closed bool
	opts   Options
	rng    *rand.Rand
	down   bool
	// keys holds every contract key that has a stored outcome or is in
	// flight.
	keys map[string]entry
	// contractPayments are the contract's payments, any status, in
	// creation order; entries point into it.
	contractPayments []contractPayment
	charges          []Charge // succeeded contract charges, in creation order
	// stripe is the stripe profile's state.
	stripe stripeBooks
	// adyen is the adyen profile's state.
	adyen adyenBooks
	// succeededPerOrder counts succeeded payments per order id (decimal
	// text), every profile, for Stats.OrdersChargedTwice.
	succeededPerOrder map[string]int
	stats             Stats
	// clients counts the charge requests per client IP address
	// (ClientStats).
	clients map[string]ClientStats
	// lastSecond holds the arrival times of the requests of the last
	// second, oldest first: the sliding window of RateLimit and
	// Stats.PeakPerSecond.
	lastSecond []time.Time
}

// New returns a server with opts.
func New(opts Options) *Server {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		mux:               http.NewServeMux(),
		ctx:               ctx,
		cancel:            cancel,
		webhooks:          newWebhookClient(),
		slots:             make(chan struct{}, maxWebhooksInFlight),
		keys:              make(map[string]entry),
		stripe:            newStripeBooks(),
		adyen:             newAdyenBooks(),
		succeededPerOrder: make(map[string]int),
		clients:           make(map[string]ClientStats),
	}
	s.SetOptions(opts)
	s.mux.HandleFunc("POST /v1/charges", s.handleCreateCharge)
	s.mux.HandleFunc("GET /v1/charges", s.handleListCharges)
	s.mux.HandleFunc("POST /v1/payment_intents", s.handleCreateIntent)
	s.mux.HandleFunc("GET /v1/payment_intents", s.handleListIntents)
	s.mux.HandleFunc("GET /v1/payment_intents/search", s.handleSearchIntents)
	s.mux.HandleFunc("GET /v1/payment_intents/{id}", s.handleRetrieveIntent)
	s.mux.HandleFunc("POST /payments", s.handleAdyenPayments)
	s.mux.HandleFunc("POST /{version}/payments", s.handleAdyenPayments)
	s.mux.HandleFunc("GET /_stats", s.handleStats)
	s.mux.HandleFunc("GET /_payments", s.handlePayments)
	s.mux.HandleFunc("POST /_down", s.handleSetDown(true))
	s.mux.HandleFunc("POST /_up", s.handleSetDown(false))
	s.mux.HandleFunc("GET /_faults", s.handleGetFaults)
	s.mux.HandleFunc("PUT /_faults", s.handlePutFaults)
	s.mux.HandleFunc("GET /healthz", handleHealthz)
	return s
}

// ServeHTTP serves
//
//	contract profile:
//	POST /v1/charges   create a charge (see the package documentation)
//	GET  /v1/charges   {"data":[Charge...]}: the succeeded charges in
//	                   creation order, optionally limited to
//	                   created_gte <= created < created_lt (RFC 3339 query
//	                   parameters); with idempotency_key=<key> instead, the
//	                   key's payment whatever its status, or no data when
//	                   the key is unknown (never used, in flight, expired)
//	stripe profile:
//	POST /v1/payment_intents          create and confirm a PaymentIntent
//	GET  /v1/payment_intents/{id}     retrieve one
//	GET  /v1/payment_intents          list, newest first: customer,
//	                                  created[gt|gte|lt|lte] (unix
//	                                  seconds), limit, starting_after
//	GET  /v1/payment_intents/search   query=metadata['k']:'v' [AND ...],
//	                                  limit, page
//	adyen profile:
//	POST /payments, /{version}/payments   make a payment
//	every profile:
//	GET  /_stats       Stats, and "clients": Clients, "stripeVersions":
//	                   StripeVersions
//	GET  /_payments    {"data":[Payment...]} (Server.Payments)
//	POST /_down        switch the provider down
//	POST /_up          switch the provider up
//	GET  /_faults      the current Options, without APIKey and
//	                   WebhookSecret
//	PUT  /_faults      replace the Options; APIKey and WebhookSecret are
//	                   kept unless the body sets them, since GET /_faults
//	                   never shows them
//	GET  /healthz      200
//
// The routes of the profiles not served answer 404. The contract requires
// the API key only on POST /v1/charges, and its GET /v1/charges works while
// the provider is down; Stripe's /v1 routes all require the key and are
// down together. The other routes belong to tests and tools.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mux.ServeHTTP(w, r)
}

// SetOptions replaces all options, APIKey and WebhookSecret included. It
// also restarts the fault randomness from opts.Seed, so the faults drawn
// after the call replay across runs whatever happened before it. Requests
// already received keep the options they arrived under.
func (s *Server) SetOptions(opts Options) {
	s.setOptions(opts, false, false)
}

func (s *Server) setOptions(opts Options, keepAPIKey, keepWebhookSecret bool) {
	rng := rand.New(rand.NewPCG(uint64(opts.Seed), pcgStream))
	s.mu.Lock()
	defer s.mu.Unlock()
	if keepAPIKey {
		opts.APIKey = s.opts.APIKey
	}
	if keepWebhookSecret {
		opts.WebhookSecret = s.opts.WebhookSecret
	}
	opts.FailOrders = slices.Clone(opts.FailOrders)
	s.opts = opts
	s.rng = rng
}

// SetDown switches the provider down (every charge request answers 503 and
// changes nothing, as do Stripe's lookups) or back up.
func (s *Server) SetDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = down
}

// Close stops the server's own goroutines: processing payments never get
// their verdict and pending webhooks are not sent any more. It waits for
// them to end. The server still answers requests afterwards, but starts
// nothing new. It returns nil; the error is for io.Closer.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	s.webhooks.CloseIdleConnections()
	return nil
}

// goLocked runs f on a goroutine of its own, which Close waits for, unless
// the server is closed. s.mu must be held, so that Close cannot start
// waiting between the check and the Add.
func (s *Server) goLocked(f func(ctx context.Context)) bool {
	if s.closed {
		return false
	}
	s.wg.Go(func() { f(s.ctx) })
	return true
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Clients returns what the server saw of each client IP address, keyed by
// the address as text (the remote address of the connection, without its
// port).
func (s *Server) Clients() map[string]ClientStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.clients)
}

// StripeVersions counts the POST /v1/payment_intents received by their
// Stripe-Version header ("" for none): which API version billing pins.
func (s *Server) StripeVersions() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.stripe.versions)
}

// Charges returns every succeeded charge of the contract profile, in
// creation order (a processing payment joins when it succeeds, at the
// place of its creation).
func (s *Server) Charges() []Charge {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.charges)
}

// Payments returns every payment the server holds, every profile, any
// status, in creation order.
func (s *Server) Payments() []Payment {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Payment, 0, len(s.contractPayments)+len(s.stripe.intents)+len(s.adyen.payments))
	for _, p := range s.contractPayments {
		out = append(out, p.payment())
	}
	for _, in := range s.stripe.intents {
		out = append(out, in.payment())
	}
	for _, p := range s.adyen.payments {
		out = append(out, p.payment())
	}
	slices.SortStableFunc(out, func(a, b Payment) int { return a.Created.Compare(b.Created) })
	return out
}

// countSucceededLocked counts a succeeded payment of order (decimal text;
// "" when unknown, which is not counted) for Stats.OrdersChargedTwice.
// s.mu must be held.
func (s *Server) countSucceededLocked(order string) {
	if order == "" {
		return
	}
	s.succeededPerOrder[order]++
	if s.succeededPerOrder[order] == 2 {
		s.stats.OrdersChargedTwice++
	}
}

// countClientLocked counts a charge request from client at now. s.mu must
// be held.
func (s *Server) countClientLocked(client string, now time.Time) {
	c := s.clients[client]
	c.Requests++
	c.Last = now.UTC()
	s.clients[client] = c
}

// faults returns the current options without the secrets, for GET /_faults.
func (s *Server) faults() Options {
	s.mu.Lock()
	defer s.mu.Unlock()
	opts := s.opts
	opts.APIKey = ""
	opts.WebhookSecret = ""
	return opts
}

func (s *Server) handleStats(w http.ResponseWriter, _ *http.Request) {
	// Stats stays a comparable struct of counters; the clients and the
	// versions sit beside its fields in the same JSON object.
	s.mu.Lock()
	body := struct {
		Stats
		Clients        map[string]ClientStats `json:"clients"`
		StripeVersions map[string]int64       `json:"stripeVersions"`
	}{s.stats, maps.Clone(s.clients), maps.Clone(s.stripe.versions)}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, marshal(body))
}

func (s *Server) handlePayments(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, marshal(struct {
		Data []Payment `json:"data"`
	}{s.Payments()}))
}

func (s *Server) handleSetDown(down bool) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		s.SetDown(down)
		writeJSON(w, http.StatusOK, marshal(struct {
			Down bool `json:"down"`
		}{down}))
	}
}

func (s *Server) handleGetFaults(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, marshal(s.faults()))
}

func (s *Server) handlePutFaults(w http.ResponseWriter, r *http.Request) {
	// The outer secrets shadow the embedded ones, so a nil pointer tells
	// "not sent" apart from "sent empty" (which turns authentication, or
	// signing, off).
	var body struct {
		Options
		APIKey        *string `json:"apiKey"`
		WebhookSecret *string `json:"webhookSecret"`
	}
	err := decodeJSON(w, r, &body)
	if err == nil {
		// Checked with the secret it will sign with, sent or kept: the
		// adyen profile needs hex keys.
		check := body.Options
		s.mu.Lock()
		check.WebhookSecret = s.opts.WebhookSecret
		s.mu.Unlock()
		if body.WebhookSecret != nil {
			check.WebhookSecret = *body.WebhookSecret
		}
		err = check.Validate()
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	if body.APIKey != nil {
		body.Options.APIKey = *body.APIKey
	}
	if body.WebhookSecret != nil {
		body.Options.WebhookSecret = *body.WebhookSecret
	}
	s.setOptions(body.Options, body.APIKey == nil, body.WebhookSecret == nil)
	writeJSON(w, http.StatusOK, marshal(s.faults()))
}

func handleHealthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, []byte(`{"status":"ok"}`))
}

// serves reports whether the server speaks profile now; when it does not,
// it answers the request 404 as the profile it speaks would.
func (s *Server) serves(profile string, w http.ResponseWriter, r *http.Request) bool {
	s.mu.Lock()
	current := s.opts.profile()
	s.mu.Unlock()
	switch {
	case current == profile:
		return true
	case current == ProfileStripe:
		writeStripeError(w, http.StatusNotFound, stripeError{Type: "invalid_request_error",
			Message: fmt.Sprintf("Unrecognized request URL (%s: %s).", r.Method, r.URL.Path)})
	case current == ProfileAdyen:
		writeAdyenNotFound(w)
	default:
		http.NotFound(w, r)
	}
	return false
}

// maxBodyBytes bounds request bodies; real ones are under 1 KiB.
const maxBodyBytes = 64 << 10

// decodeJSON decodes exactly one JSON value from the request body into v,
// rejecting unknown fields so that a typo in a test's request fails loudly
// instead of being ignored.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("invalid JSON body: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("invalid JSON body: data after the JSON value")
	}
	return nil
}

// marshal encodes v, which must be one of this package's plain data types:
// encoding them cannot fail, so an error is a programming mistake.
func marshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("fakepsp: encoding %T: %v", v, err))
	}
	return b
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// A failed write means the client has gone; there is no one to tell.
	_, _ = w.Write(body)
}

// errorBody is the contract's Stripe-like error answer.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
	// DeclineCode says why a card was declined, as Stripe's does.
	DeclineCode string `json:"decline_code,omitempty"`
}

func errorJSON(errType, message string) []byte {
	return marshal(errorBody{Error: errorDetail{Type: errType, Message: message}})
}

func writeError(w http.ResponseWriter, status int, errType, message string) {
	writeJSON(w, status, errorJSON(errType, message))
}
