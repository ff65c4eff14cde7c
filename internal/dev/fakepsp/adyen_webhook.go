package fakepsp

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

const (
	// maxAdyenBatch bounds the items of one notification batch: the most
	// Adyen puts in one (its SOAP webhooks batch up to six; its JSON ones
	// now carry one, which billing takes too).
	maxAdyenBatch = 6
	// adyenAccepted is the answer that tells Adyen a batch is delivered.
	adyenAccepted = "[accepted]"
	// adyenForgedKey signs the forged items: not the endpoint's key.
	adyenForgedKey = "F04CED0F04CED0F04CED0F04CED0F04CED0F04CED0F04CED0F04CED0F04CED00"
)

// adyenOutbox is the adyen profile's notification items that are ready and
// wait for a batch: the items ready within WebhookBatchWait of the first go
// together.
type adyenOutbox struct {
	ready []adyenItem
	// gathering is set while a sender waits for the batch to fill.
	gathering bool
}

// adyenItem is one notification item to post.
type adyenItem struct {
	fields adyenNotificationItem // signed when posted
	forged bool
	// repeat marks a delivered item delivered once more.
	repeat bool
	// repeatAfter, when > 0, delivers the item once more that long after
	// its batch was accepted.
	repeatAfter time.Duration
}

// adyenAmount is Adyen's amount object.
type adyenAmount struct {
	Value    int64  `json:"value"`
	Currency string `json:"currency"`
}

// adyenNotificationItem is Adyen's NotificationRequestItem.
type adyenNotificationItem struct {
	AdditionalData      map[string]string `json:"additionalData"`
	Amount              adyenAmount       `json:"amount"`
	EventCode           string            `json:"eventCode"`
	EventDate           string            `json:"eventDate"`
	MerchantAccountCode string            `json:"merchantAccountCode"`
	MerchantReference   string            `json:"merchantReference"`
	PaymentMethod       string            `json:"paymentMethod"`
	PspReference        string            `json:"pspReference"`
	Reason              string            `json:"reason,omitempty"`
	Success             string            `json:"success"`
}

// notificationItem is the AUTHORISATION item of p's verdict as it stands.
func (p *adyenPayment) notificationItem() adyenNotificationItem {
	it := adyenNotificationItem{
		Amount:              p.req.Amount,
		EventCode:           "AUTHORISATION",
		EventDate:           time.Now().Format(time.RFC3339),
		MerchantAccountCode: p.req.MerchantAccount,
		MerchantReference:   p.req.Reference,
		PaymentMethod:       "visa",
		PspReference:        p.pspReference,
		Success:             "true",
	}
	if p.resultCode != rcAuthorised {
		it.Success, it.Reason = "false", cmp.Or(p.reason(), p.resultCode)
	}
	return it
}

// opposite is it claiming the other verdict: what half of the forged
// items say.
func (it adyenNotificationItem) opposite() adyenNotificationItem {
	if it.Success == "true" {
		it.Success, it.Reason = "false", "Refused"
	} else {
		it.Success, it.Reason = "true", ""
	}
	return it
}

// adyenSignature is the item's hmacSignature under hexKey: base64 of the
// HMAC-SHA256, keyed with the hex-decoded key, of
// pspReference:originalReference:merchantAccountCode:merchantReference:value:currency:eventCode:success
// (originalReference is empty for an AUTHORISATION). A key that is not hex
// (Validate refuses one) signs as its bytes, which no receiver verifies.
func adyenSignature(it adyenNotificationItem, hexKey string) string {
	key, err := hex.DecodeString(hexKey)
	if err != nil {
		key = []byte(hexKey)
	}
	h := hmac.New(sha256.New, key)
	h.Write([]byte(strings.Join([]string{it.PspReference, "", it.MerchantAccountCode, it.MerchantReference,
		strconv.FormatInt(it.Amount.Value, 10), it.Amount.Currency, it.EventCode, it.Success}, ":")))
	return base64.StdEncoding.EncodeToString(h.Sum(nil))
}

// notifyAdyenLocked notifies p's verdict with an AUTHORISATION item,
// drawing its faults: never sent (WebhookDropRate, or PendingDropRate for
// the verdict of a payment answered Pending or Received), delivered once
// more (WebhookRepeatRate), a forged copy too (WebhookForgeRate). s.mu
// must be held.
func (s *Server) notifyAdyenLocked(p *adyenPayment) {
	st := &s.stats.Adyen.Webhooks
	st.Events++
	dropRate := s.opts.WebhookDropRate
	if p.behaviour.later != "" {
		dropRate = s.opts.PendingDropRate
	}
	switch {
	case s.opts.WebhookURL == "":
		st.NoEndpoint++
		return
	case s.draw(dropRate):
		st.Dropped++
		return
	}
	it := adyenItem{fields: p.notificationItem()}
	if s.draw(s.opts.WebhookRepeatRate) {
		// At least a nanosecond, so that a zero delay still repeats.
		it.repeatAfter = max(s.drawDelayLocked(), 1)
	}
	s.queueAdyenLocked(it, s.drawDelayLocked())
	if s.draw(s.opts.WebhookForgeRate) {
		forged := adyenItem{fields: it.fields, forged: true}
		if s.draw(0.5) {
			forged.fields = forged.fields.opposite()
		}
		s.queueAdyenLocked(forged, s.drawDelayLocked())
	}
}

// queueAdyenLocked makes it ready for a batch after delay; it counts in
// Stats.PendingWebhooks until its batch is done. s.mu must be held.
func (s *Server) queueAdyenLocked(it adyenItem, delay time.Duration) {
	started := s.goLocked(func(ctx context.Context) {
		if sleep(ctx, delay) {
			s.readyAdyen(it)
			return
		}
		s.adyenDone(1)
	})
	if started {
		s.stats.PendingWebhooks++
	}
}

// readyAdyen puts it among the items waiting for a batch, and starts
// gathering one unless a sender already is.
func (s *Server) readyAdyen(it adyenItem) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.adyen.webhooks.ready = append(s.adyen.webhooks.ready, it)
	if !s.adyen.webhooks.gathering {
		s.gatherAdyenLocked()
	}
}

// gatherAdyenLocked starts a sender that waits WebhookBatchWait for the
// batch to fill and posts it; once the server is closed the waiting items
// are given up. s.mu must be held.
func (s *Server) gatherAdyenLocked() {
	ob := &s.adyen.webhooks
	ob.gathering = true
	if !s.goLocked(s.sendAdyenBatch) {
		s.stats.PendingWebhooks -= int64(len(ob.ready))
		ob.ready, ob.gathering = nil, false
	}
}

// sendAdyenBatch waits for the batch to fill, takes it (at most
// maxAdyenBatch items: the rest wait for the next sender) and posts it.
func (s *Server) sendAdyenBatch(ctx context.Context) {
	s.mu.Lock()
	wait := s.opts.webhookBatchWait()
	s.mu.Unlock()
	waited := sleep(ctx, wait)

	s.mu.Lock()
	ob := &s.adyen.webhooks
	if !waited {
		s.stats.PendingWebhooks -= int64(len(ob.ready))
		ob.ready, ob.gathering = nil, false
		s.mu.Unlock()
		return
	}
	n := min(len(ob.ready), maxAdyenBatch)
	batch := ob.ready[:n:n]
	ob.ready = append([]adyenItem(nil), ob.ready[n:]...)
	ob.gathering = false
	if len(ob.ready) > 0 {
		s.gatherAdyenLocked()
	}
	s.mu.Unlock()

	s.deliverAdyen(ctx, batch)
	s.adyenDone(len(batch))
}

// adyenDone counts n items whose delivery is over, delivered or not.
func (s *Server) adyenDone(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.PendingWebhooks -= int64(n)
}

// deliverAdyen posts batch until the endpoint answers [accepted], pausing
// with backoff between tries, as Adyen retries a batch; a batch of forged
// items only is posted once, as an attacker would. Then the items to be
// repeated are queued again.
func (s *Server) deliverAdyen(ctx context.Context, batch []adyenItem) {
	genuine := 0
	for _, it := range batch {
		if !it.forged {
			genuine++
		}
	}
	pause := firstRetry
	for first := true; ; first = false {
		switch s.postAdyen(ctx, batch, first) {
		case accepted:
			s.repeatAdyen(batch)
			return
		case gone:
			return
		}
		if genuine == 0 {
			return
		}
		s.mu.Lock()
		pause = min(pause, s.opts.webhookRetryMax())
		s.mu.Unlock()
		if !sleep(ctx, pause) {
			return
		}
		pause *= 2
	}
}

// repeatAdyen queues once more the items of an accepted batch that are to
// be delivered twice.
func (s *Server) repeatAdyen(batch []adyenItem) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, it := range batch {
		if it.repeatAfter > 0 && !it.forged && !it.repeat {
			s.queueAdyenLocked(adyenItem{fields: it.fields, repeat: true}, it.repeatAfter)
		}
	}
}

// postAdyen tries batch once, its items signed with the endpoint's key as
// it is now (forged ones with another), and counts what came of it: first
// tells the first try, which counts the forged items.
func (s *Server) postAdyen(ctx context.Context, batch []adyenItem, first bool) postResult {
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	case <-ctx.Done():
		return gone
	}
	forged := 0
	for _, it := range batch {
		if it.forged {
			forged++
		}
	}
	genuine := len(batch) - forged

	s.mu.Lock()
	url, secrets := s.opts.WebhookURL, s.opts.WebhookSecret
	st := &s.stats.Adyen.Webhooks
	if url == "" {
		st.NoEndpoint += int64(genuine)
		s.mu.Unlock()
		return gone
	}
	s.mu.Unlock()

	// Adyen signs with the one key the endpoint has: the first.
	key, _, _ := strings.Cut(secrets, ",")
	key = strings.TrimSpace(key)
	forgedKey := adyenForgedKey
	if strings.EqualFold(key, forgedKey) {
		forgedKey = strings.Repeat("0F", 32)
	}
	items := make([]any, len(batch))
	for i, it := range batch {
		f := it.fields
		f.AdditionalData = map[string]string{"hmacSignature": adyenSignature(f, key)}
		if it.forged {
			f.AdditionalData["hmacSignature"] = adyenSignature(f, forgedKey)
		}
		items[i] = struct {
			Item adyenNotificationItem `json:"NotificationRequestItem"`
		}{f}
	}
	body := marshal(struct {
		Live  string `json:"live"`
		Items []any  `json:"notificationItems"`
	}{"false", items})
	status, answer, err := s.sendAdyen(ctx, url, body)
	if err != nil && ctx.Err() != nil {
		return gone // closed while sending: not the endpoint's doing
	}
	ok := err == nil && status >= 200 && status < 300 && strings.TrimSpace(string(answer)) == adyenAccepted

	s.mu.Lock()
	defer s.mu.Unlock()
	if first {
		st.Forged += int64(forged)
	}
	if genuine == 0 {
		if ok {
			st.ForgedAccepted++
			return accepted
		}
		return refused
	}
	st.Sent++
	switch {
	case err != nil:
		st.Failed++
		return refused
	case !ok:
		st.Refused++
		return refused
	}
	for _, it := range batch {
		switch {
		case it.forged:
		case it.repeat:
			st.Repeated++
		default:
			st.Delivered++
		}
	}
	st.Batches++
	st.LargestBatch = max(st.LargestBatch, int64(len(batch)))
	return accepted
}

// sendAdyen posts body to url as Adyen does and returns the answer's
// status and body.
func (s *Server) sendAdyen(ctx context.Context, url string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "Adyen HttpClient 1.0")
	resp, err := s.webhooks.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxBodyBytes))
	if err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, answer, nil
}
