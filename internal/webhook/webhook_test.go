package webhook_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"example.com/billing/internal/billing"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/payment"
	"example.com/billing/internal/payment/contract"
	"example.com/billing/internal/webhook"
)

// recorder is a Notifier that records what it is given and answers fail.
type recorder struct {
	got  []payment.Notification
	fail error
}

func (r *recorder) Notify(_ context.Context, notes []payment.Notification) (billing.Noticed, error) {
	if r.fail != nil {
		return billing.Noticed{}, r.fail
	}
	r.got = append(r.got, notes...)
	return billing.Noticed{Settled: len(notes)}, nil
}

func TestHandler(t *testing.T) {
	body := []byte(`{"id":"ch_1","idempotencyKey":"01938d2e-8a41-7e5c-b3f2-5d0c3a9e7b21","status":"succeeded"}`)
	tests := []struct {
		name      string
		path      string
		body      []byte
		signature string
		fail      error
		status    int
		notified  int
		result    string // billing_webhooks_total label counted
	}{
		{"OK_RecordedThenAcknowledged", "/webhooks/contract", body, contract.Sign(body, "s", time.Now()), nil, 200, 1, "settled"},
		{"ErrForgedChangesNothing", "/webhooks/contract", body, contract.Sign(body, "other", time.Now()), nil, 400, 0, "refused"},
		{"ErrStaleChangesNothing", "/webhooks/contract", body, contract.Sign(body, "s", time.Now().Add(-time.Hour)), nil, 400, 0, "refused"},
		{"ErrNotRecordedIsNotAcknowledged", "/webhooks/contract", body, contract.Sign(body, "s", time.Now()), errors.New("database down"), 503, 0, "failed"},
		{"ErrTooLarge", "/webhooks/contract", bytes.Repeat([]byte("x"), 2<<20), "", nil, 413, 0, "refused"},
		{"ErrOtherProvidersPath", "/webhooks/stripe", body, contract.Sign(body, "s", time.Now()), nil, 404, 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := &recorder{fail: tt.fail}
			m := metrics.New(prometheus.NewRegistry())
			h := webhook.NewHandler("contract", contract.Webhook{Secrets: []string{"s"}}, n, m, slog.New(slog.NewTextHandler(io.Discard, nil)))
			req := httptest.NewRequest(http.MethodPost, tt.path, bytes.NewReader(tt.body))
			req.Header.Set(contract.SignatureHeader, tt.signature)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != tt.status {
				t.Fatalf("status %d, want %d (%s)", w.Code, tt.status, w.Body)
			}
			if len(n.got) != tt.notified {
				t.Errorf("notified %d, want %d", len(n.got), tt.notified)
			}
			if tt.status == 200 && !strings.Contains(w.Body.String(), "received") {
				t.Errorf("acknowledgement %q", w.Body)
			}
			if tt.result != "" {
				if got := testutil.ToFloat64(m.Webhooks.WithLabelValues(tt.result)); got != 1 {
					t.Errorf("billing_webhooks_total{result=%q} = %v, want 1", tt.result, got)
				}
			}
		})
	}
}
