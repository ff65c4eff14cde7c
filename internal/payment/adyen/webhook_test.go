package adyen_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"example.com/billing/internal/payment"
	"example.com/billing/internal/payment/adyen"
)

// The HMAC test vector of Adyen's own Go library
// (github.com/adyen/adyen-go-api-library, src/hmacvalidator/hmacvalidator_test.go:
// key, notificationRequestItem and expectedSign): the item
// pspReference:originalReference:merchantAccount:reference:1000:EUR:EVENT:true
// signed with this key is ipnxGCaUZ4l8TUW75a71/ghd2Fe5ffvX0pV4TLTntIc=.
// Python's hmac gives the same, independently:
//
//	base64.b64encode(hmac.new(bytes.fromhex(KEY),
//	    b"pspReference:originalReference:merchantAccount:reference:1000:EUR:EVENT:true",
//	    hashlib.sha256).digest())
const (
	vectorKey = "DFB1EB5485895CFA84146406857104ABB4CBCABDC8AAF103A624C8F6A3EAAB00"
	vectorSig = "ipnxGCaUZ4l8TUW75a71/ghd2Fe5ffvX0pV4TLTntIc="
)

// vectorItem is the library's item, as Adyen posts it.
const vectorItem = `{"NotificationRequestItem":{"additionalData":{"hmacSignature":"` + vectorSig + `"},` +
	`"amount":{"currency":"EUR","value":1000},"eventCode":"EVENT","eventDate":"1970-01-01T00:00:00+00:00",` +
	`"merchantAccountCode":"merchantAccount","merchantReference":"reference","originalReference":"originalReference",` +
	`"paymentMethod":"VISA","pspReference":"pspReference","reason":"reason","success":"true"}}`

func batch(items ...string) []byte {
	return []byte(`{"live":"false","notificationItems":[` + strings.Join(items, ",") + `]}`)
}

func TestWebhook_AdyensTestVector(t *testing.T) {
	w := adyen.Webhook{Keys: []string{vectorKey}, MerchantAccount: "merchantAccount"}
	// EVENT is no event billing acts on: verified, acknowledged, nothing.
	if got, err := w.Verify(nil, batch(vectorItem), time.Time{}); err != nil || len(got) != 0 {
		t.Fatalf("Verify(the vector) = %+v, %v; want it verified and nothing to act on", got, err)
	}
	for name, tampered := range map[string]string{
		"Amount":    strings.Replace(vectorItem, `"value":1000`, `"value":1001`, 1),
		"Success":   strings.Replace(vectorItem, `"success":"true"`, `"success":"false"`, 1),
		"Reference": strings.Replace(vectorItem, `"merchantReference":"reference"`, `"merchantReference":"referenc"`, 1),
		"Signature": strings.Replace(vectorItem, vectorSig, "jpnxGCaUZ4l8TUW75a71/ghd2Fe5ffvX0pV4TLTntIc=", 1),
	} {
		if got, err := w.Verify(nil, batch(tampered), time.Time{}); !errors.Is(err, adyen.ErrSignature) {
			t.Errorf("%s tampered: Verify = %+v, %v; want ErrSignature", name, got, err)
		}
	}
	// The key is hex, case aside.
	lower := adyen.Webhook{Keys: []string{strings.ToLower(vectorKey)}, MerchantAccount: "merchantAccount"}
	if _, err := lower.Verify(nil, batch(vectorItem), time.Time{}); err != nil {
		t.Errorf("the key in lower case: %v", err)
	}
}

const (
	key        = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056"
	oldKey     = "0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF"
	foreignKey = "FEDCBA9876543210FEDCBA9876543210FEDCBA9876543210FEDCBA9876543210"
)

// notice is one NotificationRequestItem's fields.
type notice struct {
	psp, merchantAccount, reference, event, success, reason string
	value                                                   int64
}

func authorisation(psp, success string) notice {
	n := notice{psp: psp, merchantAccount: merchant, reference: eventID, event: "AUTHORISATION", success: success, value: 1999}
	if success == "false" {
		n.reason = "Not enough balance"
	}
	return n
}

// signedWith is the item as Adyen posts it, signed with hexKey by an HMAC
// of the test's own.
func (n notice) signedWith(hexKey string) string {
	k, err := hex.DecodeString(hexKey)
	if err != nil {
		panic(err)
	}
	h := hmac.New(sha256.New, k)
	fmt.Fprintf(h, "%s::%s:%s:%d:EUR:%s:%s", n.psp, n.merchantAccount, n.reference, n.value, n.event, n.success)
	sig := base64.StdEncoding.EncodeToString(h.Sum(nil))
	b, _ := json.Marshal(map[string]any{"NotificationRequestItem": map[string]any{
		"additionalData":      map[string]any{"hmacSignature": sig, "expiryDate": "03/2030", "authCode": 12345},
		"amount":              map[string]any{"value": n.value, "currency": "EUR"},
		"eventCode":           n.event,
		"eventDate":           "2026-12-06T12:00:00+01:00",
		"merchantAccountCode": n.merchantAccount,
		"merchantReference":   n.reference,
		"paymentMethod":       "visa",
		"pspReference":        n.psp,
		"reason":              n.reason,
		"success":             n.success,
	}})
	return string(b)
}

var eventAt = time.Date(2026, 12, 6, 11, 0, 0, 0, time.UTC)

func succeeded(psp string) payment.Notification {
	return payment.Notification{ID: "AUTHORISATION " + psp, IdempotencyKey: eventID,
		Outcome: payment.Outcome{Kind: payment.Succeeded, Ref: psp},
		Payment: &payment.ListedCharge{ID: psp, IdempotencyKey: eventID, Amount: 1999, Currency: "EUR", Status: "succeeded", Created: eventAt}}
}

func TestWebhook_Batches(t *testing.T) {
	refusal := payment.Notification{ID: "AUTHORISATION PSP0000000000002", IdempotencyKey: eventID,
		Outcome: payment.Outcome{Kind: payment.Declined, Ref: "PSP0000000000002", Code: "not_enough_balance"},
		Payment: &payment.ListedCharge{ID: "PSP0000000000002", IdempotencyKey: eventID, Amount: 1999, Currency: "EUR", Status: "declined", Created: eventAt}}
	capture := authorisation("PSP0000000000003", "true")
	capture.event = "CAPTURE"
	elsewhere := authorisation("PSP0000000000004", "true")
	elsewhere.merchantAccount = "OtherECOM"
	notBillings := authorisation("PSP0000000000005", "true")
	notBillings.reference = "order-77"
	neither := authorisation("PSP0000000000006", "maybe")
	forgedSuccess := authorisation("PSP0000000000002", "true")

	tests := []struct {
		name    string
		keys    []string
		items   []string
		want    []payment.Notification // compared without Outcome.Detail
		ignored []string               // the pspReferences Ignored is told
	}{
		{name: "Succeeded", keys: []string{key}, items: []string{authorisation("PSP0000000000001", "true").signedWith(key)},
			want: []payment.Notification{succeeded("PSP0000000000001")}},
		{name: "SuccessFalseIsADecline", keys: []string{key}, items: []string{authorisation("PSP0000000000002", "false").signedWith(key)},
			want: []payment.Notification{refusal}},
		{name: "SignedWithTheOldKeyDuringARotation", keys: []string{key, oldKey}, items: []string{authorisation("PSP0000000000001", "true").signedWith(oldKey)},
			want: []payment.Notification{succeeded("PSP0000000000001")}},
		{name: "SignedWithTheNewKeyDuringARotation", keys: []string{oldKey, key}, items: []string{authorisation("PSP0000000000001", "true").signedWith(key)},
			want: []payment.Notification{succeeded("PSP0000000000001")}},
		{name: "AForgedItemBesideAGoodOne", keys: []string{key},
			items:   []string{forgedSuccess.signedWith(foreignKey), authorisation("PSP0000000000001", "true").signedWith(key)},
			want:    []payment.Notification{succeeded("PSP0000000000001")},
			ignored: []string{"PSP0000000000002"}},
		{name: "AnItemTamperedAfterSigning", keys: []string{key},
			items: []string{
				strings.Replace(authorisation("PSP0000000000002", "false").signedWith(key), `"success":"false"`, `"success":"true"`, 1),
				authorisation("PSP0000000000001", "true").signedWith(key)},
			want:    []payment.Notification{succeeded("PSP0000000000001")},
			ignored: []string{"PSP0000000000002"}},
		{name: "OtherEventCodesAreAcknowledgedAndIgnored", keys: []string{key}, items: []string{capture.signedWith(key)}},
		{name: "AnotherMerchantAccountsIsIgnored", keys: []string{key}, items: []string{elsewhere.signedWith(key)}},
		{name: "APaymentBillingDidNotMake", keys: []string{key}, items: []string{notBillings.signedWith(key)},
			want: []payment.Notification{{ID: "AUTHORISATION PSP0000000000005", IdempotencyKey: "order-77",
				Outcome: payment.Outcome{Kind: payment.Succeeded, Ref: "PSP0000000000005"},
				Payment: &payment.ListedCharge{ID: "PSP0000000000005", IdempotencyKey: "order-77", Amount: 1999, Currency: "EUR", Status: "succeeded", Created: eventAt}}}},
		{name: "NeitherSuccessNorFailure", keys: []string{key}, items: []string{neither.signedWith(key)}},
		{name: "ABatchOfSeveral", keys: []string{key},
			items: []string{capture.signedWith(key), authorisation("PSP0000000000001", "true").signedWith(key), authorisation("PSP0000000000002", "false").signedWith(key)},
			want:  []payment.Notification{succeeded("PSP0000000000001"), refusal}},
		// An empty key is one anyone has, and a key that is not hex none.
		{name: "EmptyAndBadKeysAreSkipped", keys: []string{"", "not hex", key},
			items:   []string{authorisation("PSP0000000000002", "true").signedWith(foreignKey), authorisation("PSP0000000000001", "true").signedWith(key)},
			want:    []payment.Notification{succeeded("PSP0000000000001")},
			ignored: []string{"PSP0000000000002"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ignored []string
			w := adyen.Webhook{Keys: tt.keys, MerchantAccount: merchant, Ignored: func(psp string, err error) {
				if err == nil || strings.Contains(err.Error(), key) {
					t.Errorf("Ignored(%s, %v): want a reason without the key", psp, err)
				}
				ignored = append(ignored, psp)
			}}
			got, err := w.Verify(nil, batch(tt.items...), time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("Verify = %+v, want %+v", got, tt.want)
			}
			for i := range got {
				detail := got[i].Outcome.Detail
				got[i].Outcome.Detail = ""
				if g, w := *got[i].Payment, *tt.want[i].Payment; g != w {
					t.Errorf("payment %+v, want %+v", g, w)
				}
				got[i].Payment, tt.want[i].Payment = nil, nil
				if got[i] != tt.want[i] {
					t.Errorf("notification %+v, want %+v", got[i], tt.want[i])
				}
				if got[i].Outcome.Kind == payment.Declined && !strings.Contains(detail, "Not enough balance") {
					t.Errorf("a decline's Detail %q does not give Adyen's reason", detail)
				}
			}
			if strings.Join(ignored, ",") != strings.Join(tt.ignored, ",") {
				t.Errorf("ignored %q, want %q", ignored, tt.ignored)
			}
		})
	}
}

// A batch none of whose items verifies changes nothing and is refused:
// Adyen sends it again, which a genuine batch signed with a key billing
// does not have yet needs.
func TestWebhook_NothingVerifies(t *testing.T) {
	good := authorisation("PSP0000000000001", "true")
	noSignature := strings.Replace(good.signedWith(key), `"hmacSignature"`, `"hmacSig"`, 1)
	notBase64 := strings.Replace(good.signedWith(key), `"hmacSignature":"`, `"hmacSignature":"%%%`, 1)
	for name, tt := range map[string]struct {
		keys  []string
		items []string
	}{
		"Forged":                {[]string{key}, []string{good.signedWith(foreignKey)}},
		"AllForged":             {[]string{key}, []string{good.signedWith(foreignKey), authorisation("PSP0000000000002", "false").signedWith(oldKey)}},
		"SignedWithARetiredKey": {[]string{key}, []string{good.signedWith(oldKey)}},
		"NoSignature":           {[]string{key}, []string{noSignature}},
		"SignatureNotBase64":    {[]string{key}, []string{notBase64}},
		"NoKeys":                {nil, []string{good.signedWith(key)}},
		"OnlyAnEmptyKey":        {[]string{""}, []string{good.signedWith(key)}},
	} {
		t.Run(name, func(t *testing.T) {
			called := false
			w := adyen.Webhook{Keys: tt.keys, MerchantAccount: merchant, Ignored: func(string, error) { called = true }}
			got, err := w.Verify(nil, batch(tt.items...), time.Now())
			if !errors.Is(err, adyen.ErrSignature) || got != nil {
				t.Errorf("Verify = %+v, %v; want ErrSignature and nothing", got, err)
			}
			if err != nil && strings.Contains(err.Error(), key) {
				t.Errorf("the error %q shows the key", err)
			}
			if called {
				t.Errorf("Ignored was told about a batch refused whole (the handler counts it once)")
			}
		})
	}
}

func TestWebhook_NotABatch(t *testing.T) {
	w := adyen.Webhook{Keys: []string{key}, MerchantAccount: merchant}
	for name, body := range map[string]string{
		"NotJSON":    `[accepted]`,
		"NoItems":    `{"live":"false","notificationItems":[]}`,
		"ItemsOmits": `{"live":"false"}`,
		"OddAmount":  `{"live":"false","notificationItems":[{"NotificationRequestItem":{"amount":{"value":"many"}}}]}`,
	} {
		if got, err := w.Verify(nil, []byte(body), time.Now()); err == nil || got != nil {
			t.Errorf("%s: Verify = %+v, %v; want an error", name, got, err)
		}
	}
}

func TestWebhook_Ack(t *testing.T) {
	if got := string(adyen.Webhook{}.Ack()); got != "[accepted]" {
		t.Errorf("Ack = %s, want [accepted]", got)
	}
}
