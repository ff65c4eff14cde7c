package stripe_test

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	stripego "github.com/stripe/stripe-go/v85"
	"github.com/stripe/stripe-go/v85/webhook"

	"example.com/billing/internal/payment"
	"example.com/billing/internal/payment/stripe"
)

const (
	secret    = "whsec_current"
	oldSecret = "whsec_previous"
)

var now = time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)

// event is a Stripe event of type typ about a PaymentIntent of billing's
// (pi_1 for eventID) in status, with extra fields of the PaymentIntent.
func event(typ, status, extra string) []byte {
	return []byte(`{"id":"evt_1","object":"event","api_version":"` + stripe.APIVersion + `","created":1765022400,"livemode":false,` +
		`"type":"` + typ + `","data":{"object":{"id":"pi_1","object":"payment_intent","amount":1999,"currency":"eur","status":"` + status + `",` +
		`"metadata":{"event_id":"` + eventID + `","order_id":"123","customer_id":"45"}` + extra + `}}}`)
}

// signed returns the header of body signed by Stripe's own test signer at
// t under secret.
func signed(body []byte, secret string, t time.Time) http.Header {
	p := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: secret, Timestamp: t})
	return http.Header{stripe.SignatureHeader: {p.Header}}
}

func TestWebhook_Outcomes(t *testing.T) {
	tests := []struct {
		name string
		body []byte
		want []payment.Notification // compared without Detail
	}{
		{name: "Succeeded", body: event("payment_intent.succeeded", "succeeded", ""),
			want: []payment.Notification{{ID: "evt_1", IdempotencyKey: eventID, Outcome: payment.Outcome{Kind: payment.Succeeded, Ref: "pi_1"}}}},
		{name: "PaymentFailed", body: event("payment_intent.payment_failed", "requires_payment_method", insufficientFunds),
			want: []payment.Notification{{ID: "evt_1", IdempotencyKey: eventID, Outcome: payment.Outcome{Kind: payment.Declined, Ref: "pi_1", Code: "insufficient_funds"}}}},
		{name: "Canceled", body: event("payment_intent.canceled", "canceled", `,"cancellation_reason":"abandoned"`),
			want: []payment.Notification{{ID: "evt_1", IdempotencyKey: eventID, Outcome: payment.Outcome{Kind: payment.Declined, Ref: "pi_1"}}}},
		{name: "NotBillings", body: []byte(`{"id":"evt_2","object":"event","type":"payment_intent.succeeded","data":{"object":{"id":"pi_2","object":"payment_intent","status":"succeeded","metadata":{}}}}`),
			want: []payment.Notification{{ID: "evt_2", Outcome: payment.Outcome{Kind: payment.Succeeded, Ref: "pi_2"}}}},
		{name: "AnotherAPIVersion", body: []byte(strings.Replace(string(event("payment_intent.succeeded", "succeeded", "")), stripe.APIVersion, "2024-06-20", 1)),
			want: []payment.Notification{{ID: "evt_1", IdempotencyKey: eventID, Outcome: payment.Outcome{Kind: payment.Succeeded, Ref: "pi_1"}}}},
		{name: "Processing", body: event("payment_intent.processing", "processing", "")},
		{name: "Created", body: event("payment_intent.created", "requires_payment_method", "")},
		{name: "RequiresAction", body: event("payment_intent.requires_action", "requires_action", "")},
		// Another object, with fields a PaymentIntent does not have: not read.
		{name: "ChargeSucceeded", body: []byte(`{"id":"evt_3","object":"event","type":"charge.succeeded","data":{"object":{"id":"ch_1","object":"charge","amount":{"odd":true},"status":"succeeded"}}}`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := stripe.Webhook{Secrets: []string{secret}}
			got, err := w.Verify(signed(tt.body, secret, now), tt.body, now)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("Verify = %+v, want %+v", got, tt.want)
			}
			for i := range got {
				detail := got[i].Outcome.Detail
				got[i].Outcome.Detail = ""
				if got[i] != tt.want[i] {
					t.Errorf("notification %+v, want %+v", got[i], tt.want[i])
				}
				if got[i].Outcome.Kind == payment.Declined && !strings.Contains(detail, "evt_1") {
					t.Errorf("a decline's Detail %q does not name its event", detail)
				}
			}
		})
	}
}

func TestWebhook_Signatures(t *testing.T) {
	body := event("payment_intent.succeeded", "succeeded", "")
	rotated := func(t time.Time) http.Header {
		// During a rotation Stripe signs with both secrets: t=,v1=,v1=.
		old := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: oldSecret, Timestamp: t})
		cur := webhook.ComputeSignature(t, body, secret)
		return http.Header{stripe.SignatureHeader: {old.Header + ",v1=" + hex.EncodeToString(cur)}}
	}
	tests := []struct {
		name    string
		secrets []string
		header  http.Header
		body    []byte
		ok      bool
	}{
		{name: "Good", secrets: []string{secret}, header: signed(body, secret, now), ok: true},
		{name: "SecondOfTwoSecrets", secrets: []string{oldSecret, secret}, header: signed(body, secret, now), ok: true},
		{name: "FirstOfTwoSecrets", secrets: []string{oldSecret, secret}, header: signed(body, oldSecret, now), ok: true},
		{name: "RotatedHeaderNewSecretOnly", secrets: []string{secret}, header: rotated(now), ok: true},
		{name: "RotatedHeaderOldSecretOnly", secrets: []string{oldSecret}, header: rotated(now), ok: true},
		{name: "FourMinutesOld", secrets: []string{secret}, header: signed(body, secret, now.Add(-4*time.Minute)), ok: true},
		{name: "Stale", secrets: []string{secret}, header: signed(body, secret, now.Add(-5*time.Minute-time.Second))},
		{name: "FromTheFuture", secrets: []string{secret}, header: signed(body, secret, now.Add(5*time.Minute+time.Second))},
		{name: "Forged", secrets: []string{secret}, header: signed(body, "whsec_attacker", now)},
		{name: "RetiredSecret", secrets: []string{secret}, header: signed(body, oldSecret, now)},
		{name: "TamperedBody", secrets: []string{secret}, header: signed(body, secret, now),
			body: []byte(strings.Replace(string(body), `"event_id":"`+eventID, `"event_id":"01907a4e-0000-7b3a-9f1e-2c4d6e8fa0b1`, 1))},
		{name: "NoHeader", secrets: []string{secret}, header: http.Header{}},
		{name: "NoSecrets", header: signed(body, secret, now)},
		// An empty secret is a key anyone has.
		{name: "EmptySecret", secrets: []string{"", secret}, header: signed(body, "", now)},
		// A stale time signed, a fresh one added in front: the time checked
		// must be the time signed.
		{name: "TwoTimestamps", secrets: []string{secret},
			header: http.Header{stripe.SignatureHeader: {fmt.Sprintf("t=%d,", now.Unix()) + signed(body, secret, now.Add(-time.Hour)).Get(stripe.SignatureHeader)}}},
		{name: "BadTimestamp", secrets: []string{secret}, header: http.Header{stripe.SignatureHeader: {"t=soon,v1=00"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := body
			if tt.body != nil {
				b = tt.body
			}
			got, err := stripe.Webhook{Secrets: tt.secrets}.Verify(tt.header, b, now)
			switch {
			case tt.ok && err != nil:
				t.Fatalf("Verify: %v", err)
			case tt.ok && (len(got) != 1 || got[0].Outcome.Kind != payment.Succeeded):
				t.Errorf("Verify = %+v, want the succeeded notification", got)
			case !tt.ok && (err == nil || !errors.Is(err, stripe.ErrSignature) || got != nil):
				t.Errorf("Verify = %+v, %v; want ErrSignature and nothing", got, err)
			}
		})
	}
}

func TestWebhook_VerifiedButNoEvent(t *testing.T) {
	w := stripe.Webhook{Secrets: []string{secret}}
	for name, body := range map[string][]byte{
		"NotJSON":     []byte(`not json`),
		"NoPayment":   []byte(`{"id":"evt_4","type":"payment_intent.succeeded","data":{"object":{"object":"payment_intent"}}}`),
		"OddDocument": []byte(`{"id":"evt_5","type":"payment_intent.succeeded","data":{"object":{"id":"pi_1","amount":"many"}}}`),
	} {
		if got, err := w.Verify(signed(body, secret, now), body, now); err == nil || errors.Is(err, stripe.ErrSignature) {
			t.Errorf("%s: Verify = %+v, %v; want an error other than the signature's", name, got, err)
		}
	}
}

func TestWebhook_Ack(t *testing.T) {
	if got := string(stripe.Webhook{}.Ack()); got != `{"received":true}` {
		t.Errorf("Ack = %s", got)
	}
}

// The pinned version and the stripe-go module that verifies webhooks are
// of one release train: within it Stripe's monthly versions only add, and
// stripe-go calls an event of another train incompatible. Upgrading
// either is a decision about both.
func TestAPIVersion_OnStripeGosTrain(t *testing.T) {
	train := func(v string) string { _, tr, _ := strings.Cut(v, "."); return tr }
	if train(stripe.APIVersion) == "" || train(stripe.APIVersion) != train(stripego.APIVersion) {
		t.Errorf("Stripe-Version %s is not on the release train of stripe-go's %s", stripe.APIVersion, stripego.APIVersion)
	}
}
