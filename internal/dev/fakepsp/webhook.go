package fakepsp

import (
	"bytes"
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v85/webhook"
)

const (
	// maxWebhooksInFlight bounds the notifications posted at once, so that
	// a burst of verdicts does not open a connection each.
	maxWebhooksInFlight = 16
	// webhookTimeout is how long a delivery waits for the endpoint's
	// answer before it counts as failed (Stripe waits some seconds too).
	webhookTimeout = 10 * time.Second
	// firstRetry is the pause after the first failed try of a delivery;
	// it doubles up to Options.WebhookRetryMax.
	firstRetry = 100 * time.Millisecond
	// staleBy is how old a stale copy's signature is: twice the five
	// minutes a receiver tolerates.
	staleBy = 10 * time.Minute
	// forgedSecret signs the forged copies: not the endpoint's secret.
	forgedSecret = "whsec_fakepsp_forged"
)

// newWebhookClient returns the client that posts notifications. It has a
// transport of its own, so that Close closes its connections, and follows
// no redirect: a 3xx is an answer other than 2xx, as for Stripe.
func newWebhookClient() *http.Client {
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	return &http.Client{
		Transport: &http.Transport{
			DialContext:         dialer.DialContext,
			MaxIdleConnsPerHost: maxWebhooksInFlight,
			IdleConnTimeout:     30 * time.Second,
		},
		Timeout: webhookTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// notification is what is posted for one outcome: its payload, and the
// payload of a forged copy that claims the opposite outcome.
type notification struct {
	profile string
	payload []byte
	forged  []byte
}

// copyKind tells a notification's delivery from its faulty copies.
type copyKind int

const (
	genuine copyKind = iota
	forgedCopy
	staleCopy
)

// delivery is one notification, or one copy, to post.
type delivery struct {
	profile string
	kind    copyKind
	payload []byte
	delay   time.Duration // before the first try
	// repeatAfter, when > 0, posts a delivered notification again that
	// long after it was delivered.
	repeatAfter time.Duration
}

// notifyLocked sends n to the webhook endpoint, drawing its faults: never
// sent with probability dropRate, repeated, a forged and a stale copy.
// s.mu must be held.
func (s *Server) notifyLocked(n notification, dropRate float64) {
	st := s.webhookStatsLocked(n.profile)
	st.Events++
	switch {
	case s.opts.WebhookURL == "":
		st.NoEndpoint++
		return
	case s.draw(dropRate):
		st.Dropped++
		return
	}
	d := delivery{profile: n.profile, kind: genuine, payload: n.payload, delay: s.drawDelayLocked()}
	if s.draw(s.opts.WebhookRepeatRate) {
		// At least a nanosecond, so that a zero delay still repeats.
		d.repeatAfter = max(s.drawDelayLocked(), 1)
	}
	s.deliverLocked(d)
	if s.draw(s.opts.WebhookForgeRate) {
		forged := delivery{profile: n.profile, kind: forgedCopy, payload: n.payload}
		if s.draw(0.5) {
			forged.payload = n.forged
		}
		forged.delay = s.drawDelayLocked()
		s.deliverLocked(forged)
	}
	if s.draw(s.opts.WebhookStaleRate) {
		s.deliverLocked(delivery{profile: n.profile, kind: staleCopy, payload: n.payload, delay: s.drawDelayLocked()})
	}
}

// drawDelayLocked draws a delivery delay within [WebhookDelayMin,
// WebhookDelayMax]. Like draw, it consumes randomness only when the range
// is not a single value. s.mu must be held.
func (s *Server) drawDelayLocked() time.Duration {
	lo, hi := s.opts.WebhookDelayMin, s.opts.WebhookDelayMax
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(s.rng.Int64N(int64(hi-lo)+1))
}

// webhookStatsLocked returns profile's webhook counters. s.mu must be
// held.
func (s *Server) webhookStatsLocked(profile string) *WebhookStats {
	if profile == ProfileStripe {
		return &s.stats.Stripe.Webhooks
	}
	return &s.stats.Contract.Webhooks
}

// deliverLocked starts posting d, counted in Stats.PendingWebhooks until it
// is done. s.mu must be held.
func (s *Server) deliverLocked(d delivery) {
	if s.goLocked(func(ctx context.Context) { s.deliver(ctx, d) }) {
		s.stats.PendingWebhooks++
	}
}

// deliver posts d after its delay: a copy once, a notification until the
// endpoint answers 2xx (then once more if it is to be repeated), until the
// server is closed.
func (s *Server) deliver(ctx context.Context, d delivery) {
	defer func() {
		s.mu.Lock()
		s.stats.PendingWebhooks--
		s.mu.Unlock()
	}()
	if !sleep(ctx, d.delay) {
		return
	}
	if d.kind != genuine {
		s.post(ctx, d, false)
		return
	}
	if !s.postUntilAccepted(ctx, d, false) || d.repeatAfter == 0 || !sleep(ctx, d.repeatAfter) {
		return
	}
	s.postUntilAccepted(ctx, d, true)
}

// postUntilAccepted posts d until the endpoint answers 2xx, pausing with
// backoff between tries. It reports false when it gave up: the server was
// closed, or the endpoint removed.
func (s *Server) postUntilAccepted(ctx context.Context, d delivery, repeat bool) bool {
	pause := firstRetry
	for {
		switch s.post(ctx, d, repeat) {
		case accepted:
			return true
		case gone:
			return false
		}
		s.mu.Lock()
		pause = min(pause, s.opts.webhookRetryMax())
		s.mu.Unlock()
		if !sleep(ctx, pause) {
			return false
		}
		pause *= 2
	}
}

// postResult is what one try of a delivery came to.
type postResult int

const (
	accepted postResult = iota // answered 2xx
	refused                    // answered otherwise, or not at all: try again
	gone                       // no endpoint any more, or the server is closed
)

// post tries d once, signed with the endpoint's secret as it is now (a
// forged copy with another, a stale copy ten minutes ago), and counts what
// came of it.
func (s *Server) post(ctx context.Context, d delivery, repeat bool) postResult {
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	case <-ctx.Done():
		return gone
	}
	s.mu.Lock()
	url, secrets := s.opts.WebhookURL, s.opts.WebhookSecret
	if url == "" {
		if d.kind == genuine {
			s.webhookStatsLocked(d.profile).NoEndpoint++
		}
		s.mu.Unlock()
		return gone
	}
	s.mu.Unlock()

	signedAt := time.Now()
	switch d.kind {
	case forgedCopy:
		endpoints := secrets
		secrets = forgedSecret
		if secrets == endpoints {
			secrets += "x"
		}
	case staleCopy:
		signedAt = signedAt.Add(-staleBy)
	}
	status, err := s.send(ctx, url, d.profile, d.payload, signatureHeader(signedAt, d.payload, secrets))
	if err != nil && ctx.Err() != nil {
		return gone // closed while sending: not the endpoint's doing
	}
	ok := err == nil && status >= 200 && status < 300

	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.webhookStatsLocked(d.profile)
	switch d.kind {
	case forgedCopy:
		st.Forged++
		if ok {
			st.ForgedAccepted++
		}
		return accepted
	case staleCopy:
		st.Stale++
		if ok {
			st.StaleAccepted++
		}
		return accepted
	}
	st.Sent++
	switch {
	case err != nil:
		st.Failed++
		return refused
	case !ok:
		st.Refused++
		return refused
	case repeat:
		st.Repeated++
	default:
		st.Delivered++
	}
	return accepted
}

// send posts payload to url as profile's provider does and returns the
// answer's status.
func (s *Server) send(ctx context.Context, url, profile string, payload []byte, signature string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(payload))
	if err != nil {
		return 0, err
	}
	if profile == ProfileStripe {
		req.Header.Set("Content-Type", "application/json; charset=utf-8")
		req.Header.Set("User-Agent", "Stripe/1.0 (+https://stripe.com/docs/webhooks)")
		req.Header.Set("Stripe-Signature", signature)
	} else {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("User-Agent", "fakepsp")
		req.Header.Set("Signature", signature)
	}
	resp, err := s.webhooks.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	// Read what the endpoint says, so the connection is reused; what it
	// says does not matter.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxBodyBytes))
	return resp.StatusCode, nil
}

// signatureHeader is "t=<unix>,v1=<hex>": the hex HMAC-SHA256 of
// "<unix>.<payload>", Stripe's scheme, which the contract shares, with one
// v1 per comma-separated secret.
func signatureHeader(t time.Time, payload []byte, secrets string) string {
	var b strings.Builder
	b.WriteString("t=" + strconv.FormatInt(t.Unix(), 10))
	for secret := range strings.SplitSeq(secrets, ",") {
		b.WriteString(",v1=" + hex.EncodeToString(webhook.ComputeSignature(t, payload, strings.TrimSpace(secret))))
	}
	return b.String()
}

// contractWebhook is the body of the contract's notification.
type contractWebhook struct {
	ID             string `json:"id"`
	IdempotencyKey string `json:"idempotencyKey"`
	Status         string `json:"status"` // "succeeded" or "declined"
	DeclineCode    string `json:"declineCode,omitempty"`
}

// contractNotification is the notification of a contract payment's
// verdict; its forged copy claims the other verdict.
func contractNotification(c Charge) notification {
	n := contractWebhook{ID: c.ID, IdempotencyKey: c.IdempotencyKey, Status: c.Status, DeclineCode: c.DeclineCode}
	forged := contractWebhook{ID: c.ID, IdempotencyKey: c.IdempotencyKey, Status: statusSucceeded}
	if c.Status == statusSucceeded {
		forged.Status, forged.DeclineCode = statusDeclined, contractDeclineCode
	}
	return notification{profile: ProfileContract, payload: marshal(n), forged: marshal(forged)}
}

// sleep waits d, or until ctx is done; it reports whether ctx is still
// live.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
