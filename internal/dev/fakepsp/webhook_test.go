package fakepsp_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/testenv/wait"
)

// notifying is a contract provider whose every charge is processing and
// decided at once, so that each charge makes one notification to url.
func notifying(url string) fakepsp.Options {
	return fakepsp.Options{ProcessingEvery: 1, WebhookURL: url, WebhookSecret: webhookSecret,
		WebhookRetryMax: 20 * time.Millisecond, Seed: 1}
}

// A notification is retried until the endpoint answers 2xx, whatever it
// answered before, and is sent to the endpoint as configured at each try.
func TestWebhook_RetriedUntilAccepted(t *testing.T) {
	t.Parallel()
	refusals := []int{http.StatusInternalServerError, http.StatusServiceUnavailable, http.StatusNotFound, http.StatusFound}
	rc := newReceiver(t, func(n int, _ notice) int {
		if n < len(refusals) {
			return refusals[n]
		}
		return http.StatusNoContent
	})
	// No one listens there: the first tries get no answer.
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	psp, ts := start(t, notifying(dead.URL))
	wantStatus(t, charge(t, ts, "key-1", validBody), http.StatusAccepted)
	wait.For(t, 10*time.Second, "tries without an answer", func() bool { return psp.Stats().Contract.Webhooks.Failed >= 2 })

	opts := notifying(rc.URL)
	wantStatus(t, call(t, ts, http.MethodPut, "/_faults", string(marshalJSON(t, opts))), http.StatusOK)
	waitIdle(t, psp)

	got := rc.notices()
	if len(got) != len(refusals)+1 {
		t.Fatalf("the endpoint got %d POSTs, want %d", len(got), len(refusals)+1)
	}
	for i, n := range got {
		if !bytes.Equal(n.body, got[0].body) || !verifyContract(n, time.Minute, webhookSecret) {
			t.Errorf("try %d: body %s, signature %q: want the same notification, signed", i, n.body, n.header.Get("Signature"))
		}
	}
	st := psp.Stats().Contract.Webhooks
	failed := st.Failed
	want := fakepsp.WebhookStats{Events: 1, Sent: failed + 5, Delivered: 1, Refused: 4, Failed: failed}
	if st != want {
		t.Errorf("webhook stats = %+v, want %+v", st, want)
	}
}

// Each webhook fault does what it says, and the books tell what the
// endpoint answered.
func TestWebhook_Faults(t *testing.T) {
	t.Parallel()
	// verifying answers as billing must: 400 to what does not verify.
	verifying := func(_ int, got notice) int {
		if !verifyContract(got, 5*time.Minute, webhookSecret) {
			return http.StatusBadRequest
		}
		return http.StatusOK
	}
	tests := []struct {
		name   string
		answer func(int, notice) int
		faults func(*fakepsp.Options)
		want   fakepsp.WebhookStats
		check  func(t *testing.T, got []notice)
	}{
		{
			name:   "Dropped",
			faults: func(o *fakepsp.Options) { o.WebhookDropRate = 1 },
			want:   fakepsp.WebhookStats{Events: 1, Dropped: 1},
			check:  wantNotices(0),
		},
		{
			name:   "NoEndpoint",
			faults: func(o *fakepsp.Options) { o.WebhookURL = "" },
			want:   fakepsp.WebhookStats{Events: 1, NoEndpoint: 1},
			check:  wantNotices(0),
		},
		{
			name:   "Repeated",
			faults: func(o *fakepsp.Options) { o.WebhookRepeatRate = 1 },
			want:   fakepsp.WebhookStats{Events: 1, Sent: 2, Delivered: 1, Repeated: 1},
			check: func(t *testing.T, got []notice) {
				wantNotices(2)(t, got)
				if !bytes.Equal(got[0].body, got[1].body) || !verifyContract(got[1], time.Minute, webhookSecret) {
					t.Errorf("repeat %s is not the notification %s, signed", got[1].body, got[0].body)
				}
			},
		},
		{
			name:   "ForgedRefused",
			answer: verifying,
			faults: func(o *fakepsp.Options) { o.WebhookForgeRate = 1 },
			want:   fakepsp.WebhookStats{Events: 1, Sent: 1, Delivered: 1, Forged: 1},
			check:  wantForged,
		},
		{
			name:   "ForgedAccepted",
			faults: func(o *fakepsp.Options) { o.WebhookForgeRate = 1 },
			want:   fakepsp.WebhookStats{Events: 1, Sent: 1, Delivered: 1, Forged: 1, ForgedAccepted: 1},
			check:  wantForged,
		},
		{
			name:   "StaleRefused",
			answer: verifying,
			faults: func(o *fakepsp.Options) { o.WebhookStaleRate = 1 },
			want:   fakepsp.WebhookStats{Events: 1, Sent: 1, Delivered: 1, Stale: 1},
			check:  wantStale,
		},
		{
			name:   "StaleAccepted",
			faults: func(o *fakepsp.Options) { o.WebhookStaleRate = 1 },
			want:   fakepsp.WebhookStats{Events: 1, Sent: 1, Delivered: 1, Stale: 1, StaleAccepted: 1},
			check:  wantStale,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rc := newReceiver(t, tt.answer)
			opts := notifying(rc.URL)
			tt.faults(&opts)
			psp, ts := start(t, opts)
			wantStatus(t, charge(t, ts, "key-1", validBody), http.StatusAccepted)
			wait.For(t, 10*time.Second, "the verdict", func() bool { return psp.Stats().Contract.ProcessingSucceeded == 1 })
			waitIdle(t, psp)
			if got := psp.Stats().Contract.Webhooks; got != tt.want {
				t.Errorf("webhook stats = %+v, want %+v", got, tt.want)
			}
			tt.check(t, rc.notices())
		})
	}
}

func wantNotices(n int) func(t *testing.T, got []notice) {
	return func(t *testing.T, got []notice) {
		t.Helper()
		if len(got) != n {
			t.Fatalf("the endpoint got %d POSTs, want %d", len(got), n)
		}
	}
}

// wantForged checks that of two notices, one verifies and the other does
// not.
func wantForged(t *testing.T, got []notice) {
	t.Helper()
	wantNotices(2)(t, got)
	verified := 0
	for _, n := range got {
		if verifyContract(n, time.Minute, webhookSecret) {
			verified++
		}
	}
	if verified != 1 {
		t.Errorf("%d of the genuine and the forged notification verify, want 1", verified)
	}
}

// wantStale checks that of two identical notices, one verifies and the
// other only with a tolerance above ten minutes.
func wantStale(t *testing.T, got []notice) {
	t.Helper()
	wantNotices(2)(t, got)
	if !bytes.Equal(got[0].body, got[1].body) {
		t.Errorf("stale copy %s differs from %s", got[1].body, got[0].body)
	}
	fresh := 0
	for _, n := range got {
		switch {
		case verifyContract(n, 5*time.Minute, webhookSecret):
			fresh++
		case !verifyContract(n, 11*time.Minute, webhookSecret):
			t.Errorf("stale copy signed %q does not verify even with a tolerance of 11 minutes", n.header.Get("Signature"))
		}
	}
	if fresh != 1 {
		t.Errorf("%d notices verify within 5 minutes, want 1", fresh)
	}
}

// Half of the forged copies claim the opposite outcome, half copy the
// genuine notification; none verifies.
func TestWebhook_ForgedCopiesChangeTheOutcomeOrNot(t *testing.T) {
	t.Parallel()
	const n = 40
	rc := newReceiver(t, nil)
	opts := notifying(rc.URL)
	opts.WebhookForgeRate = 1
	psp, ts := start(t, opts)
	for i := range n {
		wantStatus(t, charge(t, ts, fmt.Sprint("key-", i), chargeBody(int64(i+1), 45, 1999, "EUR")), http.StatusAccepted)
	}
	wait.For(t, 10*time.Second, "the verdicts", func() bool { return psp.Stats().Contract.ProcessingSucceeded == n })
	waitIdle(t, psp)
	flipped, copies := 0, 0
	for _, got := range rc.notices() {
		if verifyContract(got, time.Minute, webhookSecret) {
			continue
		}
		if strings.Contains(string(got.body), `"status":"declined"`) {
			flipped++
		} else {
			copies++
		}
	}
	if flipped+copies != n || flipped == 0 || copies == 0 {
		t.Errorf("%d forged copies claim a decline and %d copy the success, want %d in all, some of each", flipped, copies, n)
	}
}

// While a secret is rolled (two secrets), each signs a v1 of its own.
func TestWebhook_SignsWithEverySecret(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	opts := notifying(rc.URL)
	opts.WebhookSecret = "whsec_old,whsec_new"
	psp, ts := start(t, opts)
	wantStatus(t, charge(t, ts, "key-1", validBody), http.StatusAccepted)
	wait.For(t, 10*time.Second, "the webhook", func() bool { return len(rc.notices()) == 1 })
	got := rc.notices()[0]
	if n := strings.Count(got.header.Get("Signature"), "v1="); n != 2 {
		t.Errorf("Signature %q has %d v1 signatures, want 2", got.header.Get("Signature"), n)
	}
	for _, secret := range []string{"whsec_old", "whsec_new"} {
		if !verifyContract(got, time.Minute, secret) {
			t.Errorf("no signature verifies with %s", secret)
		}
	}
	waitIdle(t, psp)
}

// A notification waits at least WebhookDelayMin before it is sent.
func TestWebhook_Delay(t *testing.T) {
	t.Parallel()
	const delay = 300 * time.Millisecond
	rc := newReceiver(t, nil)
	opts := notifying(rc.URL)
	opts.WebhookDelayMin, opts.WebhookDelayMax = delay, delay
	psp, ts := start(t, opts)
	sent := time.Now()
	wantStatus(t, charge(t, ts, "key-1", validBody), http.StatusAccepted)
	wait.For(t, 10*time.Second, "the webhook", func() bool { return len(rc.notices()) == 1 })
	if took := time.Since(sent); took < delay {
		t.Errorf("the webhook arrived %s after the charge, want at least %s", took, delay)
	}
	waitIdle(t, psp)
}

// Close stops what waits (a verdict, a delivery's delay) and what is being
// sent, promptly; the server still answers afterwards, and starts nothing.
func TestClose_StopsWaitingAndSending(t *testing.T) {
	t.Parallel()
	hanging := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		// Reading the body lets the server notice the client leave.
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done() // never answers while the client waits
	}))
	t.Cleanup(hanging.Close)
	psp, ts := start(t, fakepsp.Options{ProcessingEvery: 1, ProcessingDelay: time.Hour,
		WebhookURL: hanging.URL, WebhookSecret: webhookSecret})
	wantStatus(t, charge(t, ts, "waits-for-its-verdict", chargeBody(1, 45, 1999, "EUR")), http.StatusAccepted)
	psp.SetOptions(fakepsp.Options{ProcessingEvery: 1, WebhookURL: hanging.URL, WebhookSecret: webhookSecret})
	wantStatus(t, charge(t, ts, "being-sent", chargeBody(2, 45, 1999, "EUR")), http.StatusAccepted)
	psp.SetOptions(fakepsp.Options{ProcessingEvery: 1, WebhookURL: hanging.URL, WebhookSecret: webhookSecret,
		WebhookDelayMin: time.Hour, WebhookDelayMax: time.Hour})
	wantStatus(t, charge(t, ts, "waits-to-be-sent", chargeBody(3, 45, 1999, "EUR")), http.StatusAccepted)
	wait.For(t, 10*time.Second, "two webhooks pending", func() bool { return psp.Stats().PendingWebhooks == 2 })

	closed := make(chan error, 1)
	go func() { closed <- psp.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return within 5s")
	}
	if st := psp.Stats(); st.PendingWebhooks != 0 || st.Contract.ProcessingSucceeded != 2 {
		t.Errorf("after Close: %d webhooks pending, %d verdicts, want 0 and 2", st.PendingWebhooks, st.Contract.ProcessingSucceeded)
	}
	wantStatus(t, charge(t, ts, "after-close", chargeBody(4, 45, 1999, "EUR")), http.StatusAccepted)
	if err := psp.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// marshalJSON encodes v, failing the test if it cannot.
func marshalJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// GET /_faults never shows the webhook secret; a PUT of what it shows (as
// the chaos suite changes one option) keeps the secret, and one that sets
// it replaces it. Options that cannot be meant are refused.
func TestFaults_WebhookSecretAndNewOptions(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	psp, ts := start(t, notifying(rc.URL))
	r := call(t, ts, http.MethodGet, "/_faults", "")
	wantStatus(t, r, http.StatusOK)
	if bytes.Contains(r.body, []byte("webhookSecret")) || bytes.Contains(r.body, []byte(webhookSecret)) {
		t.Fatalf("GET /_faults reveals the webhook secret: %s", r.body)
	}
	shown := decode[map[string]any](t, r.body)
	shown["webhookRepeatRate"] = 0.0
	wantStatus(t, call(t, ts, http.MethodPut, "/_faults", string(marshalJSON(t, shown))), http.StatusOK)
	wantStatus(t, charge(t, ts, "key-1", chargeBody(1, 45, 1999, "EUR")), http.StatusAccepted)
	wait.For(t, 10*time.Second, "the first webhook", func() bool { return len(rc.notices()) == 1 })
	if !verifyContract(rc.notices()[0], time.Minute, webhookSecret) {
		t.Error("the secret was not kept by a PUT without it")
	}

	shown["webhookSecret"] = "whsec_rotated"
	wantStatus(t, call(t, ts, http.MethodPut, "/_faults", string(marshalJSON(t, shown))), http.StatusOK)
	wantStatus(t, charge(t, ts, "key-2", chargeBody(2, 45, 1999, "EUR")), http.StatusAccepted)
	wait.For(t, 10*time.Second, "the second webhook", func() bool { return len(rc.notices()) == 2 })
	if !verifyContract(rc.notices()[1], time.Minute, "whsec_rotated") {
		t.Error("the secret set by a PUT does not sign")
	}

	for _, body := range []string{
		`{"profile":"paypal"}`,
		// The kept secret, whsec_rotated, is no Adyen HMAC key.
		`{"profile":"adyen"}`,
		`{"profile":"adyen","webhookSecret":"whsec_rotated,` + strings.Repeat("AB", 32) + `"}`,
		`{"webhookBatchWait":-1}`,
		`{"processingEvery":-1}`,
		`{"processingDelay":-1}`,
		`{"idempotencyTtl":-1}`,
		`{"searchLag":-1}`,
		`{"stored500Rate":1.5}`,
		`{"stored500DropRate":-0.5}`,
		`{"webhookRepeatRate":2}`,
		`{"webhookForgeRate":2}`,
		`{"webhookStaleRate":2}`,
		`{"webhookDropRate":2}`,
		`{"webhookDelayMin":2000,"webhookDelayMax":1000}`,
		`{"webhookRetryMax":-1}`,
	} {
		r := call(t, ts, http.MethodPut, "/_faults", body)
		wantStatus(t, r, http.StatusBadRequest)
		wantErrorType(t, r, "invalid_request_error")
	}
	waitIdle(t, psp)
}
