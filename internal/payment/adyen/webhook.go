package adyen

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"example.com/billing/internal/payment"
)

// ErrSignature: no item of a notification batch verifies with any key.
var ErrSignature = errors.New("adyen notification: no item's HMAC signature verifies")

// EventAuthorisation is the event code of a payment's verdict, the only
// one billing acts on.
const EventAuthorisation = "AUTHORISATION"

// Webhook reads Adyen's standard webhooks for billing's endpoint: a batch
// of notificationItems, each signed on its own with the endpoint's HMAC key
// (additionalData.hmacSignature).
type Webhook struct {
	// Keys are the endpoint's HMAC keys in hex (PAYMENT_WEBHOOK_SECRET),
	// any of which may verify: two while one is replaced, since Adyen
	// signs with the one the endpoint has at the time.
	Keys []string
	// MerchantAccount is ADYEN_MERCHANT_ACCOUNT: an endpoint configured
	// for the company account receives the notifications of its other
	// merchant accounts too, whose references are not billing's.
	MerchantAccount string
	// Ignored, when set, is told about every item that does not verify
	// in a batch whose other items do (the batch is taken and the item
	// ignored): its pspReference and why, never a key or a signature.
	Ignored func(pspReference string, err error)
}

// notification is Adyen's standard webhook body.
type notification struct {
	Live              string `json:"live"`
	NotificationItems []struct {
		Item item `json:"NotificationRequestItem"`
	} `json:"notificationItems"`
}

// item is a NotificationRequestItem, with the fields billing reads.
type item struct {
	// AdditionalData's values are mostly strings, but Adyen documents it
	// as a generic container: any JSON value decodes.
	AdditionalData map[string]any `json:"additionalData"`
	Amount         struct {
		Value    int64  `json:"value"`
		Currency string `json:"currency"`
	} `json:"amount"`
	EventCode           string `json:"eventCode"`
	EventDate           string `json:"eventDate"`
	MerchantAccountCode string `json:"merchantAccountCode"`
	MerchantReference   string `json:"merchantReference"`
	OriginalReference   string `json:"originalReference"`
	PspReference        string `json:"pspReference"`
	Reason              string `json:"reason"`
	Success             string `json:"success"`
}

// signed is the text an item's HMAC covers:
// pspReference:originalReference:merchantAccountCode:merchantReference:value:currency:eventCode:success,
// empty fields included as empty, nothing escaped.
func (it item) signed() string {
	return strings.Join([]string{it.PspReference, it.OriginalReference, it.MerchantAccountCode, it.MerchantReference,
		strconv.FormatInt(it.Amount.Value, 10), it.Amount.Currency, it.EventCode, it.Success}, ":")
}

func mac(key []byte, signed string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(signed))
	return h.Sum(nil)
}

// verify reports whether it carries the HMAC of its fields under one of
// keys.
func (w Webhook) verify(it item, keys [][]byte) error {
	raw, ok := it.AdditionalData["hmacSignature"].(string)
	if !ok || raw == "" {
		return errors.New("no hmacSignature")
	}
	sig, err := base64.StdEncoding.DecodeString(raw)
	if err != nil {
		return errors.New("hmacSignature is not base64")
	}
	signed := it.signed()
	for _, key := range keys {
		if hmac.Equal(sig, mac(key, signed)) {
			return nil
		}
	}
	return errors.New("hmacSignature does not verify with any key")
}

// Verify checks every item of a notification batch and returns the
// outcomes of those that verify:
//
//	AUTHORISATION success=true   Succeeded (pspReference)
//	AUTHORISATION success=false  Declined (the reason, as an identifier)
//	any other eventCode          nothing (acknowledged, ignored)
//
// Items that do not verify are ignored (Ignored is told) and the others
// processed. A batch none of whose items verifies is refused (ErrSignature,
// answered 400) rather than acknowledged: Adyen signs a batch with one
// key, so a genuine batch that does not verify was signed with a key
// billing does not have yet (a key replaced at Adyen first), and Adyen
// sends it again for days until billing has the key; acknowledged, it
// would be lost. A forged batch changes nothing either way. Adyen signs no
// time, so there is no age limit: it retries for up to 30 days.
//
// Every other event code is acknowledged and ignored: CAPTURE,
// CAPTURE_FAILED, CANCELLATION, REFUND, CHARGEBACK, REPORT_AVAILABLE and
// the rest happen after the verdict billing records (refunds and disputes
// are not billing's), and OFFER_CLOSED closes a payment that waited for
// the shopper, which billing declined at once. Items of another merchant
// account are ignored too. A notification's IdempotencyKey is its
// merchantReference, billing's event id for its own payments.
func (w Webhook) Verify(_ http.Header, body []byte, _ time.Time) ([]payment.Notification, error) {
	var n notification
	if err := json.Unmarshal(body, &n); err != nil {
		return nil, fmt.Errorf("decode adyen notification: %w", err)
	}
	if len(n.NotificationItems) == 0 {
		return nil, errors.New("adyen notification: no notificationItems")
	}
	keys := w.keys()
	var (
		out      []payment.Notification
		verified int
		ignored  []item
		errs     []error
	)
	for _, ni := range n.NotificationItems {
		it := ni.Item
		if err := w.verify(it, keys); err != nil {
			ignored, errs = append(ignored, it), append(errs, err)
			continue
		}
		verified++
		if it.EventCode != EventAuthorisation || it.MerchantAccountCode != w.MerchantAccount {
			continue
		}
		if note, ok := it.notification(); ok {
			out = append(out, note)
		}
	}
	if verified == 0 {
		return nil, fmt.Errorf("%w (%d items; the first: %w)", ErrSignature, len(ignored), errs[0])
	}
	if w.Ignored != nil {
		for i, it := range ignored {
			w.Ignored(it.PspReference, errs[i])
		}
	}
	return out, nil
}

// Ack is what Adyen wants in answer to a batch it may consider delivered.
func (Webhook) Ack() []byte { return []byte("[accepted]") }

// keys are the Keys that decode as hex. An empty key is one anyone has: a
// list like "a,,b" must not make every item verify.
func (w Webhook) keys() [][]byte {
	var out [][]byte
	for _, k := range w.Keys {
		if b, err := hex.DecodeString(strings.TrimSpace(k)); err == nil && len(b) > 0 {
			out = append(out, b)
		}
	}
	return out
}

// notification is the outcome a verified AUTHORISATION item announces;
// ok is false for one that says neither true nor false.
func (it item) notification() (payment.Notification, bool) {
	note := payment.Notification{ID: EventAuthorisation + " " + it.PspReference, IdempotencyKey: it.MerchantReference}
	status := "succeeded"
	switch it.Success {
	case "true":
		note.Outcome = payment.Outcome{Kind: payment.Succeeded, Ref: it.PspReference}
	case "false":
		status = "declined"
		note.Outcome = payment.Outcome{Kind: payment.Declined, Ref: it.PspReference, Code: reasonCode(it.Reason, refused),
			Detail: payment.Snippet([]byte("AUTHORISATION success=false ("+it.Reason+"), pspReference "+it.PspReference), "")}
	default:
		return payment.Notification{}, false
	}
	// Adyen writes the event's time in ISO 8601 with an offset; one that
	// does not parse is kept without (the time it was received stands in).
	created, _ := time.Parse(time.RFC3339, it.EventDate)
	note.Payment = &payment.ListedCharge{
		ID:             it.PspReference,
		IdempotencyKey: it.MerchantReference,
		Amount:         it.Amount.Value,
		Currency:       strings.ToUpper(it.Amount.Currency),
		Status:         status,
		Created:        created.UTC(),
	}
	return note, true
}
