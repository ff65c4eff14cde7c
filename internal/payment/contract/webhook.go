package contract

import (
	"crypto/hmac"
	"crypto/sha256"
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

// Tolerance is how old a notification's signature may be: an older one is
// refused, so that a notification captured once cannot be played again
// later (Stripe's default, which the contract follows).
const Tolerance = 5 * time.Minute

// SignatureHeader carries a notification's signature:
// t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">.
const SignatureHeader = "Signature"

// Webhook reads the contract's notifications,
// {"id":"ch_...","idempotencyKey":"<eventId>","status":"succeeded"|"declined","declineCode":...},
// signed with any of its secrets (several during a rotation).
type Webhook struct {
	Secrets []string
}

// ErrSignature: a notification whose signature does not verify with any
// secret, or is older than Tolerance.
var ErrSignature = errors.New("webhook signature does not verify")

// Verify checks the signature and returns the notification's outcome;
// statuses other than succeeded and declined are no news.
func (w Webhook) Verify(header http.Header, body []byte, now time.Time) ([]payment.Notification, error) {
	if err := Check(header.Get(SignatureHeader), body, w.Secrets, now); err != nil {
		return nil, err
	}
	var n struct {
		ID             string `json:"id"`
		IdempotencyKey string `json:"idempotencyKey"`
		Status         string `json:"status"`
		DeclineCode    string `json:"declineCode"`
	}
	if err := json.Unmarshal(body, &n); err != nil {
		return nil, fmt.Errorf("decode notification: %w", err)
	}
	kind := kindOf(n.Status)
	if !kind.Final() {
		return nil, nil
	}
	out := payment.Outcome{Kind: kind, Ref: n.ID, Code: payment.Code(n.DeclineCode)}
	if kind == payment.Declined {
		out.Detail = "declined (notification " + n.ID + ")"
	}
	return []payment.Notification{{ID: n.ID, IdempotencyKey: n.IdempotencyKey, Outcome: out}}, nil
}

// Ack is the contract's acknowledgement: any 2xx, this body.
func (Webhook) Ack() []byte { return []byte(`{"received":true}`) }

// Check verifies a signature header of body against secrets: one of its
// v1 signatures must be the HMAC of "<t>.<body>" under one of the secrets,
// and t no older than Tolerance (nor further ahead of now).
func Check(header string, body []byte, secrets []string, now time.Time) error {
	var t int64 = -1
	var sigs [][]byte
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return fmt.Errorf("%w: bad timestamp", ErrSignature)
			}
			t = n
		case "v1":
			if sig, err := hex.DecodeString(v); err == nil {
				sigs = append(sigs, sig)
			}
		}
	}
	if t < 0 || len(sigs) == 0 {
		return fmt.Errorf("%w: no timestamp or no v1 signature", ErrSignature)
	}
	if age := now.Sub(time.Unix(t, 0)); age > Tolerance || age < -Tolerance {
		return fmt.Errorf("%w: signed %s ago, more than the %s allowed", ErrSignature, age.Round(time.Second), Tolerance)
	}
	for _, secret := range secrets {
		want := mac(secret, t, body)
		for _, sig := range sigs {
			if hmac.Equal(sig, want) {
				return nil
			}
		}
	}
	return ErrSignature
}

// Sign returns the signature header of body at t under secret.
func Sign(body []byte, secret string, t time.Time) string {
	return fmt.Sprintf("t=%d,v1=%s", t.Unix(), hex.EncodeToString(mac(secret, t.Unix(), body)))
}

func mac(secret string, t int64, body []byte) []byte {
	h := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(h, "%d.", t)
	h.Write(body)
	return h.Sum(nil)
}
