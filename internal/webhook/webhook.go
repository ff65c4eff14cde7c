// Package webhook is billing's provider-facing listener (WEBHOOK_ADDR): the
// payment provider's notifications of outcomes it decided after answering
// (a payment processing, a stored error rolled forward). Each is verified
// by its provider's signature, recorded through billing's settle, and
// acknowledged only once recorded: a notification the provider hears no
// acknowledgement for, it sends again.
package webhook

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"time"

	"example.com/billing/internal/billing"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/payment"
)

// Notifier records notified outcomes (billing.Processor.Notify).
type Notifier interface {
	Notify(ctx context.Context, notes []payment.Notification) (billing.Noticed, error)
}

// maxBody bounds a notification: Stripe's events are a few KiB, an Adyen
// batch a few dozen items.
const maxBody = 1 << 20

// NewHandler serves POST /webhooks/<provider> with verify's signatures,
// recording through n; every other path is 404.
func NewHandler(provider string, verify payment.Webhook, n Notifier, m *metrics.Metrics, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /webhooks/"+provider, &handler{verify: verify, notifier: n, metrics: m, log: log.With("provider", provider), now: time.Now})
	return mux
}

type handler struct {
	verify   payment.Webhook
	notifier Notifier
	metrics  *metrics.Metrics
	log      *slog.Logger
	now      func() time.Time
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			h.refuse(w, http.StatusRequestEntityTooLarge, "notification larger than 1 MiB", err)
			return
		}
		h.refuse(w, http.StatusBadRequest, "cannot read the notification", err)
		return
	}
	notes, err := h.verify.Verify(r.Header, body, h.now())
	if err != nil {
		// Forged, stale or malformed: it changes nothing.
		h.refuse(w, http.StatusBadRequest, "notification refused", err)
		return
	}
	done, err := h.notifier.Notify(r.Context(), notes)
	if err != nil {
		// Not recorded: the provider sends it again.
		h.metrics.Webhooks.WithLabelValues("failed").Add(float64(max(1, len(notes))))
		h.log.Warn("cannot record a notified outcome; the provider will send it again", "err", err)
		http.Error(w, "not recorded; send it again", http.StatusServiceUnavailable)
		return
	}
	h.metrics.Webhooks.WithLabelValues("settled").Add(float64(done.Settled))
	noNews := done.NoNews
	if len(notes) == 0 {
		noNews = 1 // an event billing does not act on
	}
	h.metrics.Webhooks.WithLabelValues("no_news").Add(float64(noNews))
	if done.Settled > 0 {
		h.log.Info("recorded outcomes notified by the provider", "settled", done.Settled, "no_news", done.NoNews)
	}
	_, _ = w.Write(h.verify.Ack())
}

func (h *handler) refuse(w http.ResponseWriter, status int, msg string, err error) {
	h.metrics.Webhooks.WithLabelValues("refused").Inc()
	h.log.Warn(msg, "err", err)
	http.Error(w, msg, status)
}
