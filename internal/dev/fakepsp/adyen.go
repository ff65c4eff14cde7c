package fakepsp

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// adyenBooks is what the adyen profile remembers.
type adyenBooks struct {
	// keys holds every Idempotency-Key with a stored answer or in flight.
	keys map[string]*adyenKey
	// payments are the payments in creation order.
	payments []*adyenPayment
	// webhooks is the notification items waiting for a batch.
	webhooks adyenOutbox
}

func newAdyenBooks() adyenBooks {
	return adyenBooks{keys: make(map[string]*adyenKey)}
}

// adyenKey is what Adyen's idempotency layer keeps of a key: the body of
// the request that claimed it, when, and once it is done the answer to
// replay.
type adyenKey struct {
	body     string // canonical: the parsed request, marshalled again
	claimed  time.Time
	inFlight bool
	answer   adyenAnswer
}

// adyenAnswer is a response of the adyen profile.
type adyenAnswer struct {
	status int
	body   []byte
	// transientError is Adyen's transient-error: true header: another try
	// under the key may fare better.
	transientError bool
}

// adyenError is Adyen's error answer.
type adyenError struct {
	Status       int    `json:"status"`
	ErrorCode    string `json:"errorCode"`
	Message      string `json:"message"`
	ErrorType    string `json:"errorType"`
	PspReference string `json:"pspReference,omitempty"`
}

func adyenErrorAnswer(status int, code, errType, message string) adyenAnswer {
	return adyenAnswer{status: status, body: marshal(adyenError{Status: status, ErrorCode: code, Message: message, ErrorType: errType})}
}

// adyenRequest is the body of POST /payments as billing sends it: a
// merchant-initiated payment with a stored card.
type adyenRequest struct {
	MerchantAccount        string      `json:"merchantAccount"`
	Amount                 adyenAmount `json:"amount"`
	Reference              string      `json:"reference"`
	MerchantOrderReference string      `json:"merchantOrderReference,omitempty"`
	ShopperReference       string      `json:"shopperReference"`
	PaymentMethod          struct {
		Type                  string `json:"type"`
		StoredPaymentMethodID string `json:"storedPaymentMethodId"`
	} `json:"paymentMethod"`
	ShopperInteraction       string `json:"shopperInteraction"`
	RecurringProcessingModel string `json:"recurringProcessingModel"`
}

// Adyen's limits on what billing sends.
const (
	maxAdyenKeyLen       = 64 // Idempotency-Key
	maxAdyenReferenceLen = 80 // reference
)

// Stored payment method ids of the adyen profile's own, each choosing an
// outcome (see the package documentation); any other id is authorised.
const (
	storedRefused        = "stored_refused"
	storedNotEnough      = "stored_notEnoughBalance"
	storedCancelled      = "stored_cancelled"
	storedError          = "stored_error"
	storedPending        = "stored_pending"
	storedPendingRefused = "stored_pendingRefused"
	storedPendingNever   = "stored_pendingNeverSettles"
	storedReceived       = "stored_received"
	storedRedirect       = "stored_redirectShopper"
	storedIdentify       = "stored_identifyShopper"
	storedChallenge      = "stored_challengeShopper"
	storedInvalid        = "stored_invalid"
)

// The result codes of the adyen profile's answers.
const (
	rcAuthorised = "Authorised"
	rcRefused    = "Refused"
	rcCancelled  = "Cancelled"
	rcError      = "Error"
	rcPending    = "Pending"
	rcReceived   = "Received"
)

// adyenBehaviour is what a stored payment method does to a payment.
type adyenBehaviour struct {
	resultCode string
	// reason and reasonCode are the refusalReason and its code of a
	// payment refused (now, or later when it was pending).
	reason, reasonCode string
	// later is the verdict of a Pending or Received payment, decided
	// ProcessingDelay after it was created: rcAuthorised or rcRefused;
	// "" never.
	later string
	// invalid is a validation error: 422 errorCode 101, nothing created.
	invalid bool
}

// adyenBehaviourOf tells what stored payment method pm does.
func adyenBehaviourOf(pm string) adyenBehaviour {
	switch pm {
	case storedRefused:
		return adyenBehaviour{resultCode: rcRefused, reason: "Refused", reasonCode: "2"}
	case storedNotEnough:
		return adyenBehaviour{resultCode: rcRefused, reason: "Not enough balance", reasonCode: "12"}
	case storedCancelled:
		return adyenBehaviour{resultCode: rcCancelled}
	case storedError:
		return adyenBehaviour{resultCode: rcError, reason: "Acquirer Error", reasonCode: "4"}
	case storedPending:
		return adyenBehaviour{resultCode: rcPending, later: rcAuthorised}
	case storedPendingRefused:
		return adyenBehaviour{resultCode: rcPending, later: rcRefused, reason: "Refused", reasonCode: "2"}
	case storedPendingNever:
		return adyenBehaviour{resultCode: rcPending}
	case storedReceived:
		return adyenBehaviour{resultCode: rcReceived, later: rcAuthorised}
	case storedRedirect:
		return adyenBehaviour{resultCode: "RedirectShopper"}
	case storedIdentify:
		return adyenBehaviour{resultCode: "IdentifyShopper"}
	case storedChallenge:
		return adyenBehaviour{resultCode: "ChallengeShopper"}
	case storedInvalid:
		return adyenBehaviour{invalid: true}
	}
	return adyenBehaviour{resultCode: rcAuthorised}
}

// notified reports whether a payment in resultCode has a verdict Adyen
// notifies with an AUTHORISATION item: not while pending, nor while the
// shopper would have to act.
func notified(resultCode string) bool {
	switch resultCode {
	case rcAuthorised, rcRefused, rcCancelled, rcError:
		return true
	}
	return false
}

// adyenPayment is a payment of the adyen profile.
type adyenPayment struct {
	pspReference string
	key          string
	req          adyenRequest
	behaviour    adyenBehaviour
	created      time.Time
	// resultCode is the payment's state as Adyen tells it now: the
	// answer's, then the verdict of one that was pending.
	resultCode string
	answer     int
	answerLost bool
	decided    time.Time
}

func (p *adyenPayment) payment() Payment {
	out := Payment{
		Profile:        ProfileAdyen,
		ID:             p.pspReference,
		IdempotencyKey: p.key,
		EventID:        p.req.Reference,
		Customer:       p.req.ShopperReference,
		PaymentMethod:  p.req.PaymentMethod.StoredPaymentMethodID,
		Amount:         p.req.Amount.Value,
		Currency:       p.req.Amount.Currency,
		ProviderStatus: p.resultCode,
		Answer:         p.answer,
		AnswerLost:     p.answerLost,
		Created:        p.created.UTC(),
		Decided:        p.decided,
	}
	out.OrderID, _ = strconv.ParseInt(p.req.MerchantOrderReference, 10, 64)
	switch p.resultCode {
	case rcAuthorised:
		out.Status = statusSucceeded
	case rcPending, rcReceived:
		out.Status = statusProcessing
	default:
		out.Status = statusDeclined
		out.DeclineCode = cmp.Or(p.reason(), p.resultCode)
	}
	return out
}

// reason is the refusal reason Adyen gives the payment now.
func (p *adyenPayment) reason() string {
	if p.resultCode == rcRefused || p.resultCode == rcError {
		return p.behaviour.reason
	}
	return ""
}

// answerBody is Adyen's answer to the /payments that created p.
func (p *adyenPayment) answerBody() []byte {
	a := struct {
		PspReference      string `json:"pspReference,omitempty"`
		ResultCode        string `json:"resultCode"`
		MerchantReference string `json:"merchantReference"`
		Amount            any    `json:"amount"`
		RefusalReason     string `json:"refusalReason,omitempty"`
		RefusalReasonCode string `json:"refusalReasonCode,omitempty"`
		Action            any    `json:"action,omitempty"`
		PaymentMethod     any    `json:"paymentMethod"`
	}{
		PspReference:      p.pspReference,
		ResultCode:        p.resultCode,
		MerchantReference: p.req.Reference,
		Amount:            p.req.Amount,
		PaymentMethod:     map[string]string{"type": "scheme", "brand": "visa"},
	}
	if p.reason() != "" {
		a.RefusalReason, a.RefusalReasonCode = p.behaviour.reason, p.behaviour.reasonCode
	}
	switch p.resultCode {
	case "RedirectShopper", "IdentifyShopper", "ChallengeShopper":
		// Adyen gives a payment that waits for the shopper its
		// pspReference in the /payments/details answer, not here.
		a.PspReference = ""
	}
	if p.resultCode == "RedirectShopper" {
		a.Action = map[string]string{"type": "redirect", "method": "GET", "url": "https://checkoutshopper-test.adyen.com/fake/3ds?ref=" + p.pspReference}
	}
	return marshal(a)
}

// newPspReference returns a 16-character reference of capital letters and
// digits, as Adyen's.
func newPspReference() string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	var b [16]byte
	// crypto/rand.Read never returns an error.
	_, _ = rand.Read(b[:])
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b[:])
}

// parseAdyenRequest reads and checks a POST /payments. It runs before the
// lock is taken; admitAdyen reports its failure only when no earlier rule
// answers.
func parseAdyenRequest(w http.ResponseWriter, r *http.Request, key string) (adyenRequest, *adyenAnswer) {
	invalid := func(status int, code, format string, args ...any) (adyenRequest, *adyenAnswer) {
		a := adyenErrorAnswer(status, code, "validation", fmt.Sprintf(format, args...))
		return adyenRequest{}, &a
	}
	if len(key) > maxAdyenKeyLen {
		return invalid(http.StatusBadRequest, "000", "Idempotency-Key is longer than %d characters.", maxAdyenKeyLen)
	}
	var req adyenRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return invalid(http.StatusBadRequest, "000", "Unable to parse message: %v.", err)
	}
	for _, f := range []struct{ name, v string }{
		{"merchantAccount", req.MerchantAccount}, {"reference", req.Reference}, {"amount.currency", req.Amount.Currency},
		{"shopperReference", req.ShopperReference}, {"paymentMethod.storedPaymentMethodId", req.PaymentMethod.StoredPaymentMethodID},
	} {
		if f.v == "" {
			return invalid(http.StatusUnprocessableEntity, "000", "Required field '%s' is not provided.", f.name)
		}
	}
	switch {
	case len(req.Reference) > maxAdyenReferenceLen:
		return invalid(http.StatusUnprocessableEntity, "000", "Field 'reference' is longer than %d characters.", maxAdyenReferenceLen)
	case req.Amount.Value <= 0:
		return invalid(http.StatusUnprocessableEntity, "000", "Invalid amount specified: %d.", req.Amount.Value)
	case !isCurrencyCode(req.Amount.Currency):
		return invalid(http.StatusUnprocessableEntity, "000", "Invalid currency: %q (three upper-case letters).", req.Amount.Currency)
	case req.PaymentMethod.Type != "scheme" || req.ShopperInteraction != "ContAuth" || req.RecurringProcessingModel != "UnscheduledCardOnFile":
		return invalid(http.StatusUnprocessableEntity, "000",
			"The fake takes merchant-initiated payments with a stored card only: paymentMethod.type scheme, shopperInteraction ContAuth, "+
				"recurringProcessingModel UnscheduledCardOnFile, not %q, %q, %q.",
			req.PaymentMethod.Type, req.ShopperInteraction, req.RecurringProcessingModel)
	}
	return req, nil
}

// adyenAdmission is what was decided about a POST /payments when it
// arrived.
type adyenAdmission struct {
	latency time.Duration
	// answer is the response unless create is set.
	answer adyenAnswer
	// create is set when the request is to create a payment once latency
	// has passed (having claimed its key, if it has one), lost when reset
	// is set.
	create       bool
	reset        bool
	verdictAfter time.Duration
}

func (s *Server) handleAdyenPayments(w http.ResponseWriter, r *http.Request) {
	if !s.serves(ProfileAdyen, w, r) {
		return
	}
	if v := r.PathValue("version"); v != "" && !isCheckoutVersion(v) {
		http.NotFound(w, r)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	req, failure := parseAdyenRequest(w, r, key)
	a := s.admitAdyen(clientAddr(r), key, r.Header, req, failure)

	// The lock is free while sleeping; a claimed key stays in flight.
	time.Sleep(a.latency)

	ans := a.answer
	if a.create {
		ans = s.createAdyenPayment(key, req, a)
		if a.reset {
			resetConnection(w)
			return
		}
	}
	if key != "" && len(key) <= maxAdyenKeyLen {
		// Adyen returns the key it processed the request under.
		w.Header().Set("Idempotency-Key", key)
	}
	if ans.transientError {
		w.Header().Set("Transient-Error", "true")
	}
	writeJSON(w, ans.status, ans.body)
}

// isCheckoutVersion reports whether v names a version of the Checkout
// API: v71.
func isCheckoutVersion(v string) bool {
	if len(v) < 2 || v[0] != 'v' {
		return false
	}
	_, err := strconv.Atoi(v[1:])
	return err == nil
}

// admitAdyen counts the request and decides, in the order given in the
// package documentation, everything that must be decided on arrival. When
// the request is to create a payment, admitAdyen claims its key.
func (s *Server) admitAdyen(client, key string, h http.Header, req adyenRequest, failure *adyenAnswer) adyenAdmission {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	st := &s.stats.Adyen
	st.Requests++
	s.countClientLocked(client, now)
	recent := s.arrived(now)
	a := adyenAdmission{latency: s.opts.Latency}
	order, _ := strconv.ParseInt(req.MerchantOrderReference, 10, 64)
	switch {
	case s.down:
		st.DownRejections++
		a.answer = adyenErrorAnswer(http.StatusServiceUnavailable, "000", "internal", "Service unavailable (the provider is down).")
		return a
	case s.opts.RateLimit > 0 && recent > s.opts.RateLimit:
		st.RateLimited++
		a.answer = adyenErrorAnswer(http.StatusTooManyRequests, "000", "internal", "Too many requests.")
		return a
	case s.opts.APIKey != "" && subtle.ConstantTimeCompare([]byte(h.Get("X-API-Key")), []byte(s.opts.APIKey)) != 1:
		st.Unauthorized++
		a.answer = adyenErrorAnswer(http.StatusUnauthorized, "000", "security", "HTTP Status Response - Unauthorized")
		return a
	case failure != nil:
		st.Invalid++
		a.answer = *failure
		return a
	case s.opts.AdyenMerchantAccount != "" && req.MerchantAccount != s.opts.AdyenMerchantAccount:
		st.Forbidden++
		a.answer = adyenErrorAnswer(http.StatusForbidden, "901", "security", "Invalid Merchant Account")
		return a
	case s.draw(s.opts.FailRate) || (order != 0 && slices.Contains(s.opts.FailOrders, order)):
		st.InjectedFailures++
		a.answer = adyenErrorAnswer(http.StatusServiceUnavailable, "000", "internal", "Service unavailable (injected failure).")
		return a
	case adyenBehaviourOf(req.PaymentMethod.StoredPaymentMethodID).invalid:
		// A validation error: the request is refused before it is
		// processed, and nothing is stored under its key.
		st.Invalid++
		a.answer = adyenErrorAnswer(http.StatusUnprocessableEntity, "101", "validation", "Invalid card number")
		return a
	}
	if key != "" {
		body := string(marshal(req))
		k, seen := s.adyen.keys[key]
		if seen && !k.inFlight && now.Sub(k.claimed) >= s.opts.idempotencyTTL() {
			// Adyen has forgotten the key: the request is new.
			delete(s.adyen.keys, key)
			st.KeysExpired++
			seen = false
		}
		switch {
		case seen && k.body != body:
			// Adyen's documentation does not say what a key reused with
			// another body gets; the fake refuses it, as a validation
			// error under the generic 00_422, and stores nothing.
			st.Mismatches++
			a.answer = adyenErrorAnswer(http.StatusUnprocessableEntity, "00_422", "validation",
				"Unprocessable entity: the Idempotency-Key was used with another request body.")
			return a
		case seen && k.inFlight:
			st.InFlight++
			a.answer = adyenErrorAnswer(http.StatusUnprocessableEntity, "704", "validation", "request already processed or in progress")
			a.answer.transientError = true
			return a
		case seen:
			st.Replays++
			a.answer = k.answer
			return a
		}
		s.adyen.keys[key] = &adyenKey{body: body, claimed: now, inFlight: true}
	}
	b := adyenBehaviourOf(req.PaymentMethod.StoredPaymentMethodID)
	a.create = true
	// A refusal is always answered; an authorisation, or a payment still
	// pending, may lose its answer.
	a.reset = (b.resultCode == rcAuthorised || b.resultCode == rcPending || b.resultCode == rcReceived) && s.draw(s.opts.ResetRate)
	a.verdictAfter = s.opts.ProcessingDelay
	return a
}

// createAdyenPayment creates the payment of a request admitted to create
// one, stores its answer under its key, notifies its verdict and, when it
// is pending, starts waiting for it.
func (s *Server) createAdyenPayment(key string, req adyenRequest, a adyenAdmission) adyenAnswer {
	b := adyenBehaviourOf(req.PaymentMethod.StoredPaymentMethodID)
	p := &adyenPayment{pspReference: newPspReference(), key: key, req: req, behaviour: b, resultCode: b.resultCode, answerLost: a.reset}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Taken under the lock so that created follows creation order.
	p.created = time.Now()
	st := &s.stats.Adyen
	switch b.resultCode {
	case rcAuthorised:
		st.Authorised++
		s.countSucceededLocked(strings.TrimSpace(req.MerchantOrderReference))
	case rcRefused:
		st.Refused++
	case rcCancelled:
		st.Cancelled++
	case rcError:
		st.Errors++
	case rcPending:
		st.Pending++
	case rcReceived:
		st.Received++
	default:
		st.ShopperActions++
	}
	if a.reset {
		st.Resets++
	}
	ans := adyenAnswer{status: http.StatusOK, body: p.answerBody()}
	p.answer = ans.status
	s.adyen.payments = append(s.adyen.payments, p)
	if k := s.adyen.keys[key]; key != "" && k != nil {
		k.inFlight, k.answer = false, ans
	}
	if notified(p.resultCode) {
		s.notifyAdyenLocked(p)
	}
	if b.later != "" {
		s.goLocked(func(ctx context.Context) {
			if sleep(ctx, a.verdictAfter) {
				s.decideAdyenPayment(p)
			}
		})
	}
	return ans
}

// decideAdyenPayment gives the pending payment p its verdict and notifies
// it.
func (s *Server) decideAdyenPayment(p *adyenPayment) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p.decided = time.Now().UTC()
	p.resultCode = p.behaviour.later
	st := &s.stats.Adyen
	if p.resultCode == rcAuthorised {
		st.PendingAuthorised++
		s.countSucceededLocked(strings.TrimSpace(p.req.MerchantOrderReference))
	} else {
		st.PendingRefused++
	}
	s.notifyAdyenLocked(p)
}

// writeAdyenNotFound answers a route of another profile as Adyen answers
// a path it does not have.
func writeAdyenNotFound(w http.ResponseWriter) {
	ans := adyenErrorAnswer(http.StatusNotFound, "000", "validation", "Not found")
	writeJSON(w, ans.status, ans.body)
}
