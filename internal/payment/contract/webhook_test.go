package contract_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"example.com/billing/internal/payment"
	"example.com/billing/internal/payment/contract"
)

func TestWebhook_Verify(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	body := []byte(`{"id":"ch_1","idempotencyKey":"01938d2e-8a41-7e5c-b3f2-5d0c3a9e7b21","status":"declined","declineCode":"insufficient_funds"}`)
	header := func(sig string) http.Header { return http.Header{contract.SignatureHeader: {sig}} }
	tests := []struct {
		name    string
		secrets []string
		header  http.Header
		body    []byte
		want    payment.Kind // Unknown: no notification
		err     bool
	}{
		{"OK", []string{"s1"}, header(contract.Sign(body, "s1", now)), body, payment.Declined, false},
		{"OK_SecondSecretDuringARotation", []string{"old", "s1"}, header(contract.Sign(body, "s1", now)), body, payment.Declined, false},
		{"OK_FourMinutesOld", []string{"s1"}, header(contract.Sign(body, "s1", now.Add(-4*time.Minute))), body, payment.Declined, false},
		{"OK_ProcessingIsNoNews", []string{"s1"}, header(contract.Sign([]byte(`{"id":"ch_1","idempotencyKey":"k","status":"processing"}`), "s1", now)),
			[]byte(`{"id":"ch_1","idempotencyKey":"k","status":"processing"}`), payment.Unknown, false},
		{"ErrForged", []string{"s1"}, header(contract.Sign(body, "not-the-secret", now)), body, 0, true},
		{"ErrTampered", []string{"s1"}, header(contract.Sign(body, "s1", now)), []byte(`{"id":"ch_1","idempotencyKey":"01938d2e-8a41-7e5c-b3f2-5d0c3a9e7b21","status":"succeeded"}`), 0, true},
		{"ErrStale", []string{"s1"}, header(contract.Sign(body, "s1", now.Add(-6*time.Minute))), body, 0, true},
		{"ErrFromTheFuture", []string{"s1"}, header(contract.Sign(body, "s1", now.Add(6*time.Minute))), body, 0, true},
		{"ErrNoSignature", []string{"s1"}, http.Header{}, body, 0, true},
		{"ErrNoSecret", nil, header(contract.Sign(body, "s1", now)), body, 0, true},
		{"ErrGarbledHeader", []string{"s1"}, header("t=abc,v1=zz"), body, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			notes, err := contract.Webhook{Secrets: tt.secrets}.Verify(tt.header, tt.body, now)
			if tt.err {
				if !errors.Is(err, contract.ErrSignature) || notes != nil {
					t.Fatalf("Verify = %v, %v; want ErrSignature and nothing", notes, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.want == payment.Unknown {
				if len(notes) != 0 {
					t.Fatalf("notes %+v, want none", notes)
				}
				return
			}
			if len(notes) != 1 || notes[0].Outcome.Kind != tt.want || notes[0].IdempotencyKey != "01938d2e-8a41-7e5c-b3f2-5d0c3a9e7b21" ||
				notes[0].Outcome.Ref != "ch_1" || notes[0].Outcome.Code != "insufficient_funds" {
				t.Fatalf("notes %+v, want one decline of the key with its code", notes)
			}
		})
	}
}

func TestResolve_ByIdempotencyKey(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/charges" || r.Method != http.MethodGet {
			http.NotFound(w, r)
			return
		}
		switch r.URL.Query().Get("idempotency_key") {
		case "paid":
			_, _ = w.Write([]byte(`{"data":[{"id":"ch_9","status":"succeeded"}]}`))
		case "refused":
			_, _ = w.Write([]byte(`{"data":[{"id":"ch_8","status":"declined","declineCode":"card_declined"}]}`))
		case "busy":
			_, _ = w.Write([]byte(`{"data":[{"id":"ch_7","status":"processing"}]}`))
		case "broken":
			http.Error(w, "oops", http.StatusInternalServerError)
		default:
			_, _ = w.Write([]byte(`{"data":[]}`))
		}
	}))
	t.Cleanup(srv.Close)
	c, _ := newClient(t, srv.URL, "", 0)
	tests := []struct {
		key  string
		want payment.Outcome
		err  bool
	}{
		{"paid", payment.Outcome{Kind: payment.Succeeded, Ref: "ch_9"}, false},
		{"refused", payment.Outcome{Kind: payment.Declined, Ref: "ch_8", Code: "card_declined"}, false},
		{"busy", payment.Outcome{Kind: payment.InProgress, Ref: "ch_7"}, false},
		{"never", payment.Outcome{Kind: payment.Unknown}, false},
		{"broken", payment.Outcome{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			got, err := c.Resolve(context.Background(), payment.Lookup{Request: payment.Request{IdempotencyKey: tt.key}})
			if (err != nil) != tt.err || got != tt.want {
				t.Errorf("Resolve(%s) = %+v, %v; want %+v (error %v)", tt.key, got, err, tt.want, tt.err)
			}
		})
	}
}
