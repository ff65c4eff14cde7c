package fakepsp_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/payment"
	"example.com/billing/internal/payment/adyen"
	"example.com/billing/internal/testenv/wait"
)

// hmacKey is the adyen endpoint's HMAC key, hex.
const hmacKey = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056"

const merchantAccount = "BillingECOM"

// startAdyen serves a fake provider speaking Adyen until the test ends.
func startAdyen(t *testing.T, opts fakepsp.Options) (*fakepsp.Server, *httptest.Server) {
	t.Helper()
	opts.Profile = fakepsp.ProfileAdyen
	return start(t, opts)
}

// adyenBody is billing's /payments body for order with stored payment
// method pm, the event evt-<order>.
func adyenBody(order int64, pm string) string {
	return fmt.Sprintf(`{"merchantAccount":%q,"amount":{"value":1999,"currency":"EUR"},"reference":"evt-%d",`+
		`"merchantOrderReference":"%d","shopperReference":"shopper-45","paymentMethod":{"type":"scheme","storedPaymentMethodId":%q},`+
		`"shopperInteraction":"ContAuth","recurringProcessingModel":"UnscheduledCardOnFile"}`, merchantAccount, order, order, pm)
}

// postPayment posts body to POST /v71/payments under key (none when
// empty), with extra headers as name, value pairs.
func postPayment(t *testing.T, ts *httptest.Server, key, body string, header ...string) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, ts.URL+"/v71/payments", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	r, err := do(ts.Client(), req)
	if err != nil {
		t.Fatalf("POST /v71/payments: %v", err)
	}
	return r
}

// paymentAnswer is what a test reads of Adyen's answer.
type paymentAnswer struct {
	PspReference      string          `json:"pspReference"`
	ResultCode        string          `json:"resultCode"`
	MerchantReference string          `json:"merchantReference"`
	RefusalReason     string          `json:"refusalReason"`
	RefusalReasonCode string          `json:"refusalReasonCode"`
	Action            json.RawMessage `json:"action"`
}

// adyenErr is Adyen's error answer.
type adyenErr struct {
	Status    int    `json:"status"`
	ErrorCode string `json:"errorCode"`
	ErrorType string `json:"errorType"`
	Message   string `json:"message"`
}

func wantAdyenError(t *testing.T, r reply, status int, code string) {
	t.Helper()
	wantStatus(t, r, status)
	if e := decode[adyenErr](t, r.body); e.Status != status || e.ErrorCode != code || e.Message == "" || e.ErrorType == "" {
		t.Errorf("error %+v, want status %d, errorCode %s, a type and a message", e, status, code)
	}
}

// adyenNotices verifies every batch the receiver got with billing's own
// reader of Adyen's webhooks and returns the outcomes, in order; it fails
// the test on a batch none of whose items verifies.
func adyenNotices(t *testing.T, rc *receiver, keys ...string) (notes []payment.Notification, batches int) {
	t.Helper()
	w := adyen.Webhook{Keys: keys, MerchantAccount: merchantAccount}
	for _, n := range rc.notices() {
		got, err := w.Verify(n.header, n.body, time.Now())
		if err != nil {
			t.Fatalf("batch %s does not verify: %v", n.body, err)
		}
		notes = append(notes, got...)
		batches++
	}
	return notes, batches
}

// accepting is a receiver that takes every batch as Adyen wants.
func accepting(t *testing.T) *receiver {
	t.Helper()
	return newAcceptor(t, func(int, notice) (int, string) { return http.StatusOK, "[accepted]" })
}

// newAcceptor is a receiver whose answer, status and body, answer
// chooses (n counts the POSTs, from 0).
func newAcceptor(t *testing.T, answer func(n int, got notice) (int, string)) *receiver {
	t.Helper()
	rc := &receiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		got := notice{header: r.Header.Clone(), body: body}
		rc.mu.Lock()
		n := len(rc.got)
		rc.got = append(rc.got, got)
		rc.mu.Unlock()
		status, text := answer(n, got)
		w.WriteHeader(status)
		_, _ = io.WriteString(w, text)
	}))
	t.Cleanup(srv.Close)
	rc.URL = srv.URL
	return rc
}

// notifyingAdyen are the options of an adyen provider that notifies rc
// at once, batching for 1ms.
func notifyingAdyen(rc *receiver) fakepsp.Options {
	return fakepsp.Options{Profile: fakepsp.ProfileAdyen, WebhookURL: rc.URL, WebhookSecret: hmacKey, WebhookBatchWait: time.Millisecond,
		WebhookRetryMax: 20 * time.Millisecond, ProcessingDelay: 5 * time.Millisecond, Seed: 1}
}

// The stored payment method chooses the outcome: the answer, the
// payment's state then and later, and the AUTHORISATION items sent.
func TestAdyen_OutcomeByStoredPaymentMethod(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pm         string
		resultCode string // in the answer
		reason     string
		final      string // the payment's provider status once decided
		status     string // Payment.Status once decided
		notified   []payment.Kind
		wantStats  fakepsp.AdyenStats
	}{
		{pm: "8415718415172200", resultCode: "Authorised", final: "Authorised", status: "succeeded",
			notified: []payment.Kind{payment.Succeeded}, wantStats: fakepsp.AdyenStats{Authorised: 1}},
		{pm: "stored_refused", resultCode: "Refused", reason: "Refused", final: "Refused", status: "declined",
			notified: []payment.Kind{payment.Declined}, wantStats: fakepsp.AdyenStats{Refused: 1}},
		{pm: "stored_notEnoughBalance", resultCode: "Refused", reason: "Not enough balance", final: "Refused", status: "declined",
			notified: []payment.Kind{payment.Declined}, wantStats: fakepsp.AdyenStats{Refused: 1}},
		{pm: "stored_cancelled", resultCode: "Cancelled", final: "Cancelled", status: "declined",
			notified: []payment.Kind{payment.Declined}, wantStats: fakepsp.AdyenStats{Cancelled: 1}},
		{pm: "stored_error", resultCode: "Error", reason: "Acquirer Error", final: "Error", status: "declined",
			notified: []payment.Kind{payment.Declined}, wantStats: fakepsp.AdyenStats{Errors: 1}},
		{pm: "stored_pending", resultCode: "Pending", final: "Authorised", status: "succeeded",
			notified: []payment.Kind{payment.Succeeded}, wantStats: fakepsp.AdyenStats{Pending: 1, PendingAuthorised: 1}},
		{pm: "stored_pendingRefused", resultCode: "Pending", final: "Refused", status: "declined",
			notified: []payment.Kind{payment.Declined}, wantStats: fakepsp.AdyenStats{Pending: 1, PendingRefused: 1}},
		{pm: "stored_pendingNeverSettles", resultCode: "Pending", final: "Pending", status: "processing",
			wantStats: fakepsp.AdyenStats{Pending: 1}},
		{pm: "stored_received", resultCode: "Received", final: "Authorised", status: "succeeded",
			notified: []payment.Kind{payment.Succeeded}, wantStats: fakepsp.AdyenStats{Received: 1, PendingAuthorised: 1}},
		{pm: "stored_redirectShopper", resultCode: "RedirectShopper", final: "RedirectShopper", status: "declined",
			wantStats: fakepsp.AdyenStats{ShopperActions: 1}},
		{pm: "stored_identifyShopper", resultCode: "IdentifyShopper", final: "IdentifyShopper", status: "declined",
			wantStats: fakepsp.AdyenStats{ShopperActions: 1}},
		{pm: "stored_challengeShopper", resultCode: "ChallengeShopper", final: "ChallengeShopper", status: "declined",
			wantStats: fakepsp.AdyenStats{ShopperActions: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.pm, func(t *testing.T) {
			t.Parallel()
			rc := accepting(t)
			psp, ts := start(t, notifyingAdyen(rc))
			r := postPayment(t, ts, "evt-1", adyenBody(1, tt.pm))
			wantStatus(t, r, http.StatusOK)
			if r.header.Get("Idempotency-Key") != "evt-1" {
				t.Errorf("the answer does not echo the key: %v", r.header)
			}
			a := decode[paymentAnswer](t, r.body)
			waitsForTheShopper := strings.HasSuffix(tt.resultCode, "Shopper")
			if a.ResultCode != tt.resultCode || a.RefusalReason != tt.reason || (len(a.PspReference) != 16) != waitsForTheShopper || a.MerchantReference != "evt-1" {
				t.Errorf("answer %s: want resultCode %s, refusalReason %q, a pspReference and the reference", r.body, tt.resultCode, tt.reason)
			}
			if (tt.resultCode == "RedirectShopper") != (a.Action != nil) {
				t.Errorf("action %s with resultCode %s", a.Action, a.ResultCode)
			}
			wait.For(t, 5*time.Second, "the verdict", func() bool {
				return len(psp.Payments()) == 1 && psp.Payments()[0].ProviderStatus == tt.final
			})
			waitIdle(t, psp)
			p := psp.Payments()[0]
			if p.Profile != "adyen" || (p.ID != a.PspReference && !waitsForTheShopper) || p.EventID != "evt-1" || p.IdempotencyKey != "evt-1" || p.OrderID != 1 ||
				p.Customer != "shopper-45" || p.PaymentMethod != tt.pm || p.Amount != 1999 || p.Currency != "EUR" || p.Status != tt.status {
				t.Errorf("payment %+v", p)
			}
			notes, _ := adyenNotices(t, rc, hmacKey)
			var kinds []payment.Kind
			for _, n := range notes {
				kinds = append(kinds, n.Outcome.Kind)
				if n.IdempotencyKey != "evt-1" || n.Outcome.Ref != a.PspReference || n.Payment.Amount != 1999 || n.Payment.Currency != "EUR" {
					t.Errorf("notification %+v (%+v)", n, *n.Payment)
				}
			}
			if !slices.Equal(kinds, tt.notified) {
				t.Errorf("notified %v, want %v", kinds, tt.notified)
			}
			st := psp.Stats().Adyen
			want := tt.wantStats
			want.Requests = 1
			n := int64(len(tt.notified))
			want.Webhooks = fakepsp.WebhookStats{Events: n, Sent: n, Delivered: n, Batches: n, LargestBatch: min(n, 1)}
			if st != want {
				t.Errorf("stats\n got  %+v\n want %+v", st, want)
			}
		})
	}
}

// Adyen's idempotency: the stored first answer replayed byte for byte; the
// key used with another body refused; the key in flight 704 with
// transient-error; a key forgotten after its TTL is new.
func TestAdyen_Idempotency(t *testing.T) {
	t.Parallel()
	psp, ts := startAdyen(t, fakepsp.Options{IdempotencyTTL: time.Hour})
	first := postPayment(t, ts, "evt-1", adyenBody(1, "stored_refused"))
	wantStatus(t, first, http.StatusOK)
	again := postPayment(t, ts, "evt-1", adyenBody(1, "stored_refused"))
	wantStatus(t, again, http.StatusOK)
	if string(again.body) != string(first.body) {
		t.Errorf("replay %s, want the first answer %s", again.body, first.body)
	}
	// Other bytes, the same request: replayed too.
	spaced := strings.ReplaceAll(adyenBody(1, "stored_refused"), ",", ", ")
	if r := postPayment(t, ts, "evt-1", spaced); string(r.body) != string(first.body) {
		t.Errorf("the same request, spaced: %s", r.body)
	}
	wantAdyenError(t, postPayment(t, ts, "evt-1", adyenBody(1, "8415718415172200")), http.StatusUnprocessableEntity, "00_422")
	if len(psp.Payments()) != 1 {
		t.Errorf("%d payments, want 1", len(psp.Payments()))
	}
	st := psp.Stats().Adyen
	if st.Requests != 4 || st.Refused != 1 || st.Replays != 2 || st.Mismatches != 1 {
		t.Errorf("stats %+v", st)
	}

	slow, sts := startAdyen(t, fakepsp.Options{Latency: 300 * time.Millisecond})
	done := make(chan reply, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, sts.URL+"/v71/payments", strings.NewReader(adyenBody(2, "x")))
		req.Header.Set("Idempotency-Key", "evt-2")
		r, _ := do(sts.Client(), req)
		done <- r
	}()
	wait.For(t, 5*time.Second, "the first request in flight", func() bool { return slow.Stats().Adyen.Requests == 1 })
	inFlight := postPayment(t, sts, "evt-2", adyenBody(2, "x"))
	wantAdyenError(t, inFlight, http.StatusUnprocessableEntity, "704")
	if inFlight.header.Get("Transient-Error") != "true" {
		t.Errorf("704 without transient-error: true: %v", inFlight.header)
	}
	wantStatus(t, <-done, http.StatusOK)
	if st := slow.Stats().Adyen; st.InFlight != 1 || st.Authorised != 1 {
		t.Errorf("stats %+v: want one 704 and one payment", st)
	}

	// A key Adyen has forgotten is new: a second payment.
	short, shts := startAdyen(t, fakepsp.Options{IdempotencyTTL: time.Nanosecond})
	wantStatus(t, postPayment(t, shts, "evt-3", adyenBody(3, "x")), http.StatusOK)
	wantStatus(t, postPayment(t, shts, "evt-3", adyenBody(3, "x")), http.StatusOK)
	if st := short.Stats(); st.Adyen.Authorised != 2 || st.Adyen.KeysExpired != 1 || st.OrdersChargedTwice != 1 {
		t.Errorf("stats %+v: want two payments of order 3, the key expired once", st)
	}
}

// What Adyen refuses before it processes a payment stores nothing: the
// same key then creates the payment.
func TestAdyen_RefusedBeforeProcessing(t *testing.T) {
	t.Parallel()
	psp, ts := startAdyen(t, fakepsp.Options{APIKey: "AQE_key", AdyenMerchantAccount: merchantAccount})
	auth := []string{"X-API-Key", "AQE_key"}
	wantAdyenError(t, postPayment(t, ts, "evt-1", adyenBody(1, "x")), http.StatusUnauthorized, "000")
	wantAdyenError(t, postPayment(t, ts, "evt-1", adyenBody(1, "x"), "X-API-Key", "wrong"), http.StatusUnauthorized, "000")
	wantAdyenError(t, postPayment(t, ts, "evt-1", `{"merchantAccount":`, auth...), http.StatusBadRequest, "000")
	wantAdyenError(t, postPayment(t, ts, "evt-1", strings.Replace(adyenBody(1, "x"), `"reference":"evt-1",`, ``, 1), auth...), http.StatusUnprocessableEntity, "000")
	wantAdyenError(t, postPayment(t, ts, "evt-1", strings.Replace(adyenBody(1, "x"), `"ContAuth"`, `"Ecommerce"`, 1), auth...), http.StatusUnprocessableEntity, "000")
	wantAdyenError(t, postPayment(t, ts, "evt-1", strings.Replace(adyenBody(1, "x"), `"EUR"`, `"eur"`, 1), auth...), http.StatusUnprocessableEntity, "000")
	wantAdyenError(t, postPayment(t, ts, "evt-1", strings.Replace(adyenBody(1, "x"), `"value":1999`, `"value":0`, 1), auth...), http.StatusUnprocessableEntity, "000")
	wantAdyenError(t, postPayment(t, ts, "evt-1", strings.Replace(adyenBody(1, "x"), merchantAccount, "OtherECOM", 1), auth...), http.StatusForbidden, "901")
	wantAdyenError(t, postPayment(t, ts, "evt-1", adyenBody(1, "stored_invalid"), auth...), http.StatusUnprocessableEntity, "101")
	wantAdyenError(t, postPayment(t, ts, strings.Repeat("k", 65), adyenBody(1, "x"), auth...), http.StatusBadRequest, "000")
	wantStatus(t, postPayment(t, ts, "evt-1", adyenBody(1, "x"), auth...), http.StatusOK)
	st := psp.Stats().Adyen
	want := fakepsp.AdyenStats{Requests: 11, Unauthorized: 2, Invalid: 7, Forbidden: 1, Authorised: 1,
		Webhooks: fakepsp.WebhookStats{Events: 1, NoEndpoint: 1}}
	if st != want {
		t.Errorf("stats\n got  %+v\n want %+v", st, want)
	}
	// Only the root with a version, or none.
	wantStatus(t, call(t, ts, http.MethodPost, "/checkout/payments", adyenBody(2, "x")), http.StatusNotFound)
}

// Down, failing orders and the rate limit answer without processing; a
// lost answer's payment exists and its stored answer is replayed.
func TestAdyen_Faults(t *testing.T) {
	t.Parallel()
	psp, ts := startAdyen(t, fakepsp.Options{FailOrders: []int64{7}, RateLimit: 100})
	psp.SetDown(true)
	wantAdyenError(t, postPayment(t, ts, "evt-1", adyenBody(1, "x")), http.StatusServiceUnavailable, "000")
	psp.SetDown(false)
	wantAdyenError(t, postPayment(t, ts, "evt-7", adyenBody(7, "x")), http.StatusServiceUnavailable, "000")
	wantStatus(t, postPayment(t, ts, "evt-1", adyenBody(1, "x")), http.StatusOK)
	if st := psp.Stats().Adyen; st.DownRejections != 1 || st.InjectedFailures != 1 || st.Authorised != 1 {
		t.Errorf("stats %+v", st)
	}

	limited, lts := startAdyen(t, fakepsp.Options{RateLimit: 1})
	wantStatus(t, postPayment(t, lts, "evt-1", adyenBody(1, "x")), http.StatusOK)
	wantAdyenError(t, postPayment(t, lts, "evt-2", adyenBody(2, "x")), http.StatusTooManyRequests, "000")
	if st := limited.Stats(); st.Adyen.RateLimited != 1 || st.PeakPerSecond != 2 {
		t.Errorf("stats %+v", st)
	}

	lossy, los := startAdyen(t, fakepsp.Options{ResetRate: 1})
	req, _ := http.NewRequest(http.MethodPost, los.URL+"/v71/payments", strings.NewReader(adyenBody(1, "x")))
	req.Header.Set("Idempotency-Key", "evt-1")
	// Go's transport may resend the request on a reset reused connection
	// and get the stored answer; either way Adyen made one payment.
	_, _ = do(&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}, req)
	r := postPayment(t, los, "evt-1", adyenBody(1, "x"))
	wantStatus(t, r, http.StatusOK)
	if st := lossy.Stats().Adyen; st.Resets != 1 || st.Authorised != 1 || st.Replays < 1 {
		t.Errorf("stats %+v: want one payment whose answer was lost, then replayed", st)
	}
	if p := lossy.Payments(); len(p) != 1 || !p[0].AnswerLost || decode[paymentAnswer](t, r.body).PspReference != p[0].ID {
		t.Errorf("payments %+v", p)
	}
	// A refusal is always answered.
	refusing, rts := startAdyen(t, fakepsp.Options{ResetRate: 1})
	wantStatus(t, postPayment(t, rts, "evt-2", adyenBody(2, "stored_refused")), http.StatusOK)
	if st := refusing.Stats().Adyen; st.Resets != 0 {
		t.Errorf("a refusal's answer was lost: %+v", st)
	}
}

// The items ready together go in one batch, at most six, each signed with
// the first key; a batch is retried until the answer is [accepted].
func TestAdyen_WebhookBatches(t *testing.T) {
	t.Parallel()
	rc := newAcceptor(t, func(n int, _ notice) (int, string) {
		switch n {
		case 0:
			return http.StatusOK, "ok" // 2xx, but not [accepted]
		case 1:
			return http.StatusInternalServerError, ""
		}
		return http.StatusOK, "[accepted]"
	})
	opts := notifyingAdyen(rc)
	opts.WebhookSecret = hmacKey + "," + strings.Repeat("AB", 32)
	opts.WebhookBatchWait = 300 * time.Millisecond
	psp, ts := start(t, opts)
	for i := range 8 {
		wantStatus(t, postPayment(t, ts, fmt.Sprint("evt-", i+1), adyenBody(int64(i+1), "x")), http.StatusOK)
	}
	waitIdle(t, psp)
	got := rc.notices()
	if len(got) != 4 {
		t.Fatalf("%d POSTs, want a batch of 6 tried three times and one of 2", len(got))
	}
	for i, n := range got {
		var b struct {
			Live  string            `json:"live"`
			Items []json.RawMessage `json:"notificationItems"`
		}
		if err := json.Unmarshal(n.body, &b); err != nil || b.Live != "false" {
			t.Fatalf("POST %d: %s", i, n.body)
		}
		want := []int{6, 6, 6, 2}[i]
		if len(b.Items) != want {
			t.Errorf("POST %d holds %d items, want %d", i, len(b.Items), want)
		}
		if n.header.Get("Content-Type") != "application/json" {
			t.Errorf("Content-Type %q", n.header.Get("Content-Type"))
		}
	}
	if string(got[0].body) != string(got[2].body) {
		t.Errorf("the retried batch changed")
	}
	// The first key signs; the second verifies nothing.
	if _, err := (adyen.Webhook{Keys: []string{strings.Repeat("AB", 32)}, MerchantAccount: merchantAccount}).Verify(nil, got[3].body, time.Now()); err == nil {
		t.Errorf("a batch verifies with the second key")
	}
	notes, _ := adyenNotices(t, newReceiverOf(got[2:]), hmacKey)
	if len(notes) != 8 {
		t.Errorf("%d outcomes, want 8", len(notes))
	}
	st := psp.Stats().Adyen.Webhooks
	want := fakepsp.WebhookStats{Events: 8, Sent: 4, Delivered: 8, Refused: 2, Batches: 2, LargestBatch: 6}
	if st != want {
		t.Errorf("webhook stats %+v, want %+v", st, want)
	}
}

// newReceiverOf is a receiver that got ns, for adyenNotices.
func newReceiverOf(ns []notice) *receiver {
	return &receiver{got: ns}
}

// Each webhook fault does what it says: a dropped item is never sent, a
// repeated one delivered twice, a forged one goes with the others and
// verifies with no key billing has, and a batch of forged items only is
// posted once.
func TestAdyen_WebhookFaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		set   func(*fakepsp.Options)
		check func(t *testing.T, psp *fakepsp.Server, rc *receiver)
	}{
		{"Drop", func(o *fakepsp.Options) { o.WebhookDropRate = 1 }, func(t *testing.T, psp *fakepsp.Server, rc *receiver) {
			if len(rc.notices()) != 0 {
				t.Errorf("dropped items were sent")
			}
			if st := psp.Stats().Adyen.Webhooks; st != (fakepsp.WebhookStats{Events: 1, Dropped: 1}) {
				t.Errorf("stats %+v", st)
			}
		}},
		{"Repeat", func(o *fakepsp.Options) { o.WebhookRepeatRate = 1 }, func(t *testing.T, psp *fakepsp.Server, rc *receiver) {
			notes, batches := adyenNotices(t, rc, hmacKey)
			if batches != 2 || len(notes) != 2 || notes[0].Outcome != notes[1].Outcome || *notes[0].Payment != *notes[1].Payment {
				t.Errorf("%d batches, %+v: want the item twice", batches, notes)
			}
			if st := psp.Stats().Adyen.Webhooks; st.Delivered != 1 || st.Repeated != 1 {
				t.Errorf("stats %+v", st)
			}
		}},
		{"Forge", func(o *fakepsp.Options) { o.WebhookForgeRate = 1; o.WebhookBatchWait = 200 * time.Millisecond }, func(t *testing.T, psp *fakepsp.Server, rc *receiver) {
			got := rc.notices()
			if len(got) != 1 {
				t.Fatalf("%d POSTs, want one batch of the item and its forged copy", len(got))
			}
			var ignored []string
			w := adyen.Webhook{Keys: []string{hmacKey}, MerchantAccount: merchantAccount, Ignored: func(psp string, _ error) { ignored = append(ignored, psp) }}
			notes, err := w.Verify(nil, got[0].body, time.Now())
			if err != nil || len(notes) != 1 || len(ignored) != 1 || ignored[0] != notes[0].Outcome.Ref {
				t.Errorf("Verify = %+v, %v; ignored %v: want the genuine item, its forged copy ignored", notes, err, ignored)
			}
			if st := psp.Stats().Adyen.Webhooks; st.Forged != 1 || st.ForgedAccepted != 0 || st.Delivered != 1 || st.Batches != 1 {
				t.Errorf("stats %+v", st)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rc := accepting(t)
			opts := notifyingAdyen(rc)
			tt.set(&opts)
			psp, ts := start(t, opts)
			wantStatus(t, postPayment(t, ts, "evt-1", adyenBody(1, "x")), http.StatusOK)
			waitIdle(t, psp)
			tt.check(t, psp, rc)
		})
	}

	// A batch of forged items only, refused, is posted once.
	refusing := newAcceptor(t, func(_ int, got notice) (int, string) {
		if _, err := (adyen.Webhook{Keys: []string{hmacKey}, MerchantAccount: merchantAccount}).Verify(nil, got.body, time.Now()); err != nil {
			return http.StatusBadRequest, "forged"
		}
		return http.StatusOK, "[accepted]"
	})
	opts := notifyingAdyen(refusing)
	opts.WebhookForgeRate = 1
	// With this seed the forged copy is drawn ready long after the item:
	// a batch of its own.
	opts.WebhookDelayMax = time.Second
	psp, ts := start(t, opts)
	wantStatus(t, postPayment(t, ts, "evt-1", adyenBody(1, "x")), http.StatusOK)
	waitIdle(t, psp)
	posts := refusing.notices()
	if len(posts) != 2 {
		t.Fatalf("%d POSTs, want the item's batch and the forged copy's, once each", len(posts))
	}
	st := psp.Stats().Adyen.Webhooks
	if st.Forged != 1 || st.ForgedAccepted != 0 || st.Delivered != 1 || st.Sent != 1 || st.Refused != 0 {
		t.Errorf("stats %+v: want the forged item posted once, refused, and not counted as sent", st)
	}
}

// WebhookDropRate drops the notification of a verdict the answer gave,
// PendingDropRate that of a payment answered Pending or Received: the only
// word a client gets of it.
func TestAdyen_DropRatesByKindOfVerdict(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		set           func(*fakepsp.Options)
		wantNotified  []string // references notified, in order
		wantDropped   int64
		wantDelivered int64
	}{
		{"WebhookDropRate", func(o *fakepsp.Options) { o.WebhookDropRate = 1 }, []string{"evt-2"}, 1, 1},
		{"PendingDropRate", func(o *fakepsp.Options) { o.PendingDropRate = 1 }, []string{"evt-1"}, 1, 1},
		{"Both", func(o *fakepsp.Options) { o.WebhookDropRate, o.PendingDropRate = 1, 1 }, nil, 2, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rc := accepting(t)
			opts := notifyingAdyen(rc)
			tt.set(&opts)
			psp, ts := start(t, opts)
			wantStatus(t, postPayment(t, ts, "evt-1", adyenBody(1, "x")), http.StatusOK)
			wantStatus(t, postPayment(t, ts, "evt-2", adyenBody(2, "stored_pending")), http.StatusOK)
			wait.For(t, 10*time.Second, "the pending payment decided", func() bool { return psp.Stats().Adyen.PendingAuthorised == 1 })
			waitIdle(t, psp)
			notes, _ := adyenNotices(t, rc, hmacKey)
			var got []string
			for _, n := range notes {
				got = append(got, n.IdempotencyKey)
			}
			if !slices.Equal(got, tt.wantNotified) {
				t.Errorf("notified %v, want %v", got, tt.wantNotified)
			}
			if st := psp.Stats().Adyen.Webhooks; st.Events != 2 || st.Dropped != tt.wantDropped || st.Delivered != tt.wantDelivered {
				t.Errorf("stats %+v: want 2 events, %d dropped, %d delivered", st, tt.wantDropped, tt.wantDelivered)
			}
		})
	}
}

// OrdersChargedTwice counts authorised payments by merchantOrderReference,
// whatever their keys; a refusal, or a payment still pending, does not
// count.
func TestAdyen_OrdersChargedTwice(t *testing.T) {
	t.Parallel()
	psp, ts := startAdyen(t, fakepsp.Options{ProcessingDelay: time.Hour})
	for i, pm := range []string{"x", "stored_refused", "stored_pending", "y"} {
		wantStatus(t, postPayment(t, ts, fmt.Sprint("k-", i), adyenBody(5, pm)), http.StatusOK)
	}
	if st := psp.Stats(); st.OrdersChargedTwice != 1 {
		t.Errorf("OrdersChargedTwice = %d, want 1", st.OrdersChargedTwice)
	}
}
