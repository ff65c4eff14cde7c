package fakepsp

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v85"
)

// stripeBooks is what the stripe profile remembers.
type stripeBooks struct {
	// keys holds every Idempotency-Key with a stored answer or in flight.
	keys map[string]*stripeKey
	// intents are the PaymentIntents in creation order; byID finds them.
	intents []*intent
	byID    map[string]*intent
	// versions counts POST /v1/payment_intents by Stripe-Version header.
	versions map[string]int64
}

func newStripeBooks() stripeBooks {
	return stripeBooks{
		keys:     make(map[string]*stripeKey),
		byID:     make(map[string]*intent),
		versions: make(map[string]int64),
	}
}

// stripeKey is what Stripe's idempotency layer keeps of a key: the
// parameters of the request that claimed it, when, and once it is done the
// answer to replay.
type stripeKey struct {
	params   string
	claimed  time.Time
	inFlight bool
	answer   stripeAnswer
}

// stripeAnswer is a response of the stripe profile.
type stripeAnswer struct {
	status int
	body   []byte
	// shouldRetry is the Stripe-Should-Retry header: "true", "false", or
	// "" for none.
	shouldRetry string
	// requestID is the Request-Id of the request that created a stored
	// answer: a replay tells it in Original-Request.
	requestID string
	replayed  bool
}

// stripeError is Stripe's error object, the value of "error" in an error
// answer and a PaymentIntent's last_payment_error.
type stripeError struct {
	Type              string         `json:"type"`
	Code              string         `json:"code,omitempty"`
	DeclineCode       string         `json:"decline_code,omitempty"`
	Message           string         `json:"message"`
	Param             string         `json:"param,omitempty"`
	DocURL            string         `json:"doc_url,omitempty"`
	Charge            string         `json:"charge,omitempty"`
	PaymentMethodType string         `json:"payment_method_type,omitempty"`
	PaymentIntent     *paymentIntent `json:"payment_intent,omitempty"`
}

// newStripeError returns an error of errType with code, its doc_url as
// Stripe links it.
func newStripeError(errType, code, message string) stripeError {
	e := stripeError{Type: errType, Code: code, Message: message}
	if code != "" {
		e.DocURL = "https://stripe.com/docs/error-codes/" + strings.ReplaceAll(code, "_", "-")
	}
	return e
}

// withParam returns e naming the parameter at fault.
func (e stripeError) withParam(param string) stripeError {
	e.Param = param
	return e
}

func stripeErrorAnswer(status int, shouldRetry string, e stripeError) stripeAnswer {
	return stripeAnswer{status: status, shouldRetry: shouldRetry, body: marshal(struct {
		Error stripeError `json:"error"`
	}{e})}
}

func writeStripeError(w http.ResponseWriter, status int, e stripeError) {
	ans := stripeErrorAnswer(status, "", e)
	writeJSON(w, ans.status, ans.body)
}

// paymentIntent is Stripe's PaymentIntent object, with the fields an
// off-session charge sets; the nullable ones Stripe always sends are null.
type paymentIntent struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	Amount             int64             `json:"amount"`
	AmountCapturable   int64             `json:"amount_capturable"`
	AmountReceived     int64             `json:"amount_received"`
	CanceledAt         *int64            `json:"canceled_at"`
	CancellationReason *string           `json:"cancellation_reason"`
	CaptureMethod      string            `json:"capture_method"`
	ClientSecret       string            `json:"client_secret"`
	ConfirmationMethod string            `json:"confirmation_method"`
	Created            int64             `json:"created"`
	Currency           string            `json:"currency"`
	Customer           string            `json:"customer"`
	Description        *string           `json:"description"`
	LastPaymentError   *stripeError      `json:"last_payment_error"`
	LatestCharge       string            `json:"latest_charge"`
	Livemode           bool              `json:"livemode"`
	Metadata           map[string]string `json:"metadata"`
	NextAction         *struct{}         `json:"next_action"`
	PaymentMethod      string            `json:"payment_method"`
	PaymentMethodTypes []string          `json:"payment_method_types"`
	Status             string            `json:"status"`
}

// The PaymentIntent statuses the fake uses.
const (
	piSucceeded             = "succeeded"
	piProcessing            = "processing"
	piRequiresPaymentMethod = "requires_payment_method"
)

// behaviour is what a payment method does to a PaymentIntent confirmed
// off-session.
type behaviour struct {
	methodType string // "card" or "sepa_debit"
	// declines is the 402 of a card declined at once; nil otherwise.
	declines *stripeError
	// processing payments are decided later: they fail with failure, or
	// succeed when failure is nil, unless they never settle.
	processing  bool
	failure     *stripeError
	neverSettle bool
}

// Payment methods of our own: bank debits decided later.
const (
	pmDebitSuccess     = "pm_fakeDebit_success"
	pmDebitFailure     = "pm_fakeDebit_failure"
	pmDebitNeverSettle = "pm_fakeDebit_neverSettles"
)

// behaviourOf tells what payment method pm does (see the package
// documentation): Stripe's test payment methods, and fake debits.
func behaviourOf(pm string) behaviour {
	decline := func(code, declineCode, message string) behaviour {
		e := newStripeError("card_error", code, message)
		e.DeclineCode = declineCode
		return behaviour{methodType: "card", declines: &e}
	}
	switch pm {
	case "pm_card_chargeDeclined":
		return decline("card_declined", "generic_decline", "Your card was declined.")
	case "pm_card_chargeDeclinedInsufficientFunds":
		return decline("card_declined", "insufficient_funds", "Your card has insufficient funds.")
	case "pm_card_authenticationRequired":
		return decline("authentication_required", "authentication_required",
			"Your card was declined. This transaction requires authentication.")
	case pmDebitSuccess:
		return behaviour{methodType: "sepa_debit", processing: true}
	case pmDebitFailure:
		e := newStripeError("card_error", "insufficient_funds",
			"The customer's account has insufficient funds to cover this payment.")
		e.PaymentMethodType = "sepa_debit"
		return behaviour{methodType: "sepa_debit", processing: true, failure: &e}
	case pmDebitNeverSettle:
		return behaviour{methodType: "sepa_debit", processing: true, neverSettle: true}
	}
	return behaviour{methodType: "card"}
}

// intent is a PaymentIntent and what the books need to know of it.
type intent struct {
	id            string
	key           string
	created       time.Time
	amount        int64
	currency      string
	customer      string
	paymentMethod string
	metadata      map[string]string
	behaviour     behaviour
	status        string
	latestCharge  string
	lastError     *stripeError
	// answer is the status the creating request was answered with,
	// answerLost set when the connection was reset instead.
	answer     int
	answerLost bool
	// dropRate is the probability that one of its events is never sent.
	dropRate float64
	decided  time.Time
}

// object is the PaymentIntent as Stripe shows it now.
func (in *intent) object() paymentIntent {
	pi := paymentIntent{
		ID:                 in.id,
		Object:             "payment_intent",
		Amount:             in.amount,
		CaptureMethod:      "automatic",
		ClientSecret:       in.id + "_secret_fakepsp",
		ConfirmationMethod: "automatic",
		Created:            in.created.Unix(),
		Currency:           in.currency,
		Customer:           in.customer,
		LatestCharge:       in.latestCharge,
		Metadata:           maps.Clone(in.metadata),
		PaymentMethod:      in.paymentMethod,
		PaymentMethodTypes: []string{in.behaviour.methodType},
		Status:             in.status,
	}
	if in.status == piSucceeded {
		pi.AmountReceived = in.amount
	}
	if in.lastError != nil {
		e := *in.lastError
		pi.LastPaymentError = &e
	}
	return pi
}

// orderRef is the order the PaymentIntent pays, as billing tells it.
func (in *intent) orderRef() string {
	return strings.TrimSpace(in.metadata["order_id"])
}

func (in *intent) payment() Payment {
	p := Payment{
		Profile:        ProfileStripe,
		ID:             in.id,
		IdempotencyKey: in.key,
		EventID:        in.metadata["event_id"],
		Customer:       in.customer,
		PaymentMethod:  in.paymentMethod,
		Amount:         in.amount,
		Currency:       in.currency,
		ProviderStatus: in.status,
		Answer:         in.answer,
		AnswerLost:     in.answerLost,
		Created:        in.created.UTC(),
		Decided:        in.decided,
	}
	p.OrderID, _ = strconv.ParseInt(in.orderRef(), 10, 64)
	switch in.status {
	case piSucceeded:
		p.Status = statusSucceeded
	case piProcessing:
		p.Status = statusProcessing
	default:
		p.Status = statusDeclined
	}
	if e := in.lastError; e != nil {
		p.DeclineCode = cmp.Or(e.DeclineCode, e.Code)
	}
	return p
}

// intentParams are the parameters of POST /v1/payment_intents.
type intentParams struct {
	amount        int64
	currency      string
	customer      string
	paymentMethod string
	metadata      map[string]string
	// canonical is the form in a canonical order, to compare a reused
	// key's parameters, not their bytes, as Stripe does.
	canonical string
}

// stripeFailure is a request refused before it is executed: 400, or 404
// for a missing customer or payment method.
type stripeFailure struct {
	status int
	err    stripeError
}

func invalidRequest(param, code, format string, args ...any) *stripeFailure {
	return &stripeFailure{status: http.StatusBadRequest,
		err: newStripeError("invalid_request_error", code, fmt.Sprintf(format, args...)).withParam(param)}
}

func missingResource(param, message string) *stripeFailure {
	return &stripeFailure{status: http.StatusNotFound,
		err: newStripeError("invalid_request_error", "resource_missing", message).withParam(param)}
}

// Stripe's bounds on what billing sends.
const (
	minAmount         = 50         // Stripe's minimum charge in usd and eur cents
	maxAmount         = 99_999_999 // Stripe's maximum in minor units
	maxMetadataKeys   = 50
	maxMetadataKeyLen = 40
	maxMetadataValLen = 500
)

// parseIntentParams reads and checks the form of a POST
// /v1/payment_intents. It runs before the lock is taken; admitIntent
// reports its failure only when no earlier rule answers.
func parseIntentParams(w http.ResponseWriter, r *http.Request, key string) (intentParams, *stripeFailure) {
	if len(key) > maxKeyLen {
		return intentParams{}, invalidRequest("", "", "Keys for idempotent requests can only be up to %d characters long.", maxKeyLen)
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/x-www-form-urlencoded" {
		return intentParams{}, invalidRequest("", "",
			"Invalid request: the body must be application/x-www-form-urlencoded, not %q.", r.Header.Get("Content-Type"))
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		return intentParams{}, invalidRequest("", "", "Invalid request body: %v.", err)
	}
	form, err := url.ParseQuery(string(body))
	if err != nil {
		return intentParams{}, invalidRequest("", "", "Invalid form-encoded body: %v.", err)
	}
	p := intentParams{metadata: map[string]string{}, canonical: form.Encode()}
	for _, name := range slices.Sorted(maps.Keys(form)) {
		if len(form[name]) > 1 {
			return intentParams{}, invalidRequest(name, "", "%s is given more than once.", name)
		}
		mkey, isMetadata := strings.CutPrefix(name, "metadata[")
		switch {
		case isMetadata:
			mkey, closed := strings.CutSuffix(mkey, "]")
			switch {
			case !closed || mkey == "" || strings.ContainsAny(mkey, "[]"):
				return intentParams{}, invalidRequest(name, "parameter_unknown", "Received unknown parameter: %s", name)
			case len(mkey) > maxMetadataKeyLen:
				return intentParams{}, invalidRequest(name, "", "Metadata keys can have up to %d characters.", maxMetadataKeyLen)
			case len(form.Get(name)) > maxMetadataValLen:
				return intentParams{}, invalidRequest(name, "", "Metadata values can have up to %d characters.", maxMetadataValLen)
			}
			if v := form.Get(name); v != "" {
				p.metadata[mkey] = v
			}
		case !slices.Contains([]string{"amount", "currency", "customer", "payment_method", "confirm", "off_session"}, name):
			return intentParams{}, invalidRequest(name, "parameter_unknown", "Received unknown parameter: %s", name)
		}
	}
	if len(p.metadata) > maxMetadataKeys {
		return intentParams{}, invalidRequest("metadata", "", "Metadata can have up to %d keys.", maxMetadataKeys)
	}
	for _, name := range []string{"amount", "currency", "customer", "payment_method", "confirm", "off_session"} {
		if form.Get(name) == "" {
			return intentParams{}, invalidRequest(name, "parameter_missing", "Missing required param: %s.", name)
		}
	}
	if p.amount, err = strconv.ParseInt(form.Get("amount"), 10, 64); err != nil {
		return intentParams{}, invalidRequest("amount", "parameter_invalid_integer", "Invalid integer: %s", form.Get("amount"))
	}
	p.currency = form.Get("currency")
	switch {
	case p.amount < minAmount:
		return intentParams{}, invalidRequest("amount", "amount_too_small",
			"Amount must be at least %d %s minor units (the fake's minimum, Stripe's for usd and eur).", minAmount, p.currency)
	case p.amount > maxAmount:
		return intentParams{}, invalidRequest("amount", "amount_too_large", "Amount must be no more than %d minor units.", maxAmount)
	case !isLowerCurrencyCode(p.currency):
		return intentParams{}, invalidRequest("currency", "", "Invalid currency: %s. Currencies are three lower-case letters (ISO 4217).", p.currency)
	}
	for _, name := range []string{"confirm", "off_session"} {
		if form.Get(name) != "true" {
			return intentParams{}, invalidRequest(name, "",
				"The fake only creates PaymentIntents confirmed off-session: %s must be true, not %q.", name, form.Get(name))
		}
	}
	p.customer, p.paymentMethod = form.Get("customer"), form.Get("payment_method")
	switch {
	case !strings.HasPrefix(p.customer, "cus_") || strings.HasPrefix(p.customer, "cus_missing"):
		return intentParams{}, missingResource("customer", fmt.Sprintf("No such customer: '%s'", p.customer))
	case !strings.HasPrefix(p.paymentMethod, "pm_") || strings.HasPrefix(p.paymentMethod, "pm_missing"):
		return intentParams{}, missingResource("payment_method", fmt.Sprintf("No such PaymentMethod: '%s'", p.paymentMethod))
	}
	return p, nil
}

func isLowerCurrencyCode(s string) bool {
	return len(s) == 3 && strings.Trim(s, "abcdefghijklmnopqrstuvwxyz") == ""
}

// intentAdmission is what was decided about a POST /v1/payment_intents when
// it arrived.
type intentAdmission struct {
	latency time.Duration
	// answer is the response unless create is set.
	answer stripeAnswer
	// create is set when the request is to create a PaymentIntent once
	// latency has passed (having claimed its key, if it has one): answered
	// with a stored 500 when stored500 is set, else lost when reset is set.
	create       bool
	stored500    bool
	reset        bool
	verdictAfter time.Duration
}

// The Stripe-Should-Retry values.
const (
	shouldRetry    = "true"
	shouldNotRetry = "false"
)

func (s *Server) handleCreateIntent(w http.ResponseWriter, r *http.Request) {
	if !s.serves(ProfileStripe, w, r) {
		return
	}
	key := r.Header.Get("Idempotency-Key")
	requestID := newID("req_")
	params, failure := parseIntentParams(w, r, key)
	a := s.admitIntent(clientAddr(r), key, r.Header, params, failure)

	// The lock is free while sleeping; a claimed key stays in flight.
	time.Sleep(a.latency)

	ans := a.answer
	if a.create {
		ans = s.createIntent(key, requestID, params, a)
		if a.reset {
			resetConnection(w)
			return
		}
	}
	s.writeStripe(w, r, requestID, ans)
}

// admitIntent counts the request and decides, in the order given in the
// package documentation, everything that must be decided on arrival. When
// the request is to create a PaymentIntent, admitIntent claims its key.
func (s *Server) admitIntent(client, key string, h http.Header, p intentParams, failure *stripeFailure) intentAdmission {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	st := &s.stats.Stripe
	st.Requests++
	s.countClientLocked(client, now)
	s.stripe.versions[h.Get("Stripe-Version")]++
	a := intentAdmission{latency: s.opts.Latency}
	if ans, refused := s.refuseLocked(now, h); refused {
		a.answer = ans
		switch ans.status {
		case http.StatusServiceUnavailable:
			st.DownRejections++
		case http.StatusTooManyRequests:
			st.RateLimited++
		case http.StatusUnauthorized:
			st.Unauthorized++
		default:
			st.BadRequests++
		}
		return a
	}
	order, _ := strconv.ParseInt(strings.TrimSpace(p.metadata["order_id"]), 10, 64)
	switch {
	case failure != nil && failure.status == http.StatusNotFound:
		st.NotFound++
		a.answer = stripeErrorAnswer(failure.status, "", failure.err)
		return a
	case failure != nil:
		st.BadRequests++
		a.answer = stripeErrorAnswer(failure.status, "", failure.err)
		return a
	case s.draw(s.opts.FailRate) || (order != 0 && slices.Contains(s.opts.FailOrders, order)):
		st.InjectedFailures++
		a.answer = stripeErrorAnswer(http.StatusServiceUnavailable, shouldRetry,
			newStripeError("api_error", "", "The service is temporarily unavailable (injected failure)."))
		return a
	}
	if key != "" {
		k, seen := s.stripe.keys[key]
		if seen && !k.inFlight && now.Sub(k.claimed) >= s.opts.idempotencyTTL() {
			// Stripe has pruned the key: the request is new.
			delete(s.stripe.keys, key)
			st.KeysExpired++
			seen = false
		}
		switch {
		case seen && k.params != p.canonical:
			st.IdempotencyErrors++
			a.answer = stripeErrorAnswer(http.StatusBadRequest, "", newStripeError("idempotency_error", "", fmt.Sprintf(
				"Keys for idempotent requests can only be used with the same parameters they were first used with. "+
					"Try using a key other than '%s' if you meant to execute a different request.", key)))
			return a
		case seen && k.inFlight:
			st.Conflicts++
			a.answer = stripeErrorAnswer(http.StatusConflict, shouldRetry, newStripeError("invalid_request_error", "idempotency_key_in_use",
				fmt.Sprintf("There is currently another in-progress request using this Idempotent Key (that probably means "+
					"you submitted twice, and the other request is still going through): %s. Please try again later.", key)))
			return a
		case seen:
			st.Replays++
			a.answer = k.answer
			a.answer.replayed = true
			return a
		}
		s.stripe.keys[key] = &stripeKey{params: p.canonical, claimed: now, inFlight: true}
	}
	a.create = true
	a.stored500 = s.draw(s.opts.Stored500Rate)
	a.reset = !a.stored500 && behaviourOf(p.paymentMethod).declines == nil && s.draw(s.opts.ResetRate)
	a.verdictAfter = s.opts.ProcessingDelay
	return a
}

// refuseLocked decides what every Stripe /v1 request meets before its own
// rules: the provider down, the rate limit, the API key and the API
// version. It records the request's arrival for the rate limit. s.mu must
// be held.
func (s *Server) refuseLocked(now time.Time, h http.Header) (stripeAnswer, bool) {
	recent := s.arrived(now)
	version := h.Get("Stripe-Version")
	switch {
	case s.down:
		return stripeErrorAnswer(http.StatusServiceUnavailable, shouldRetry,
			newStripeError("api_error", "", "The service is temporarily unavailable (the provider is down).")), true
	case s.opts.RateLimit > 0 && recent > s.opts.RateLimit:
		// No Retry-After: Stripe sends none.
		return stripeErrorAnswer(http.StatusTooManyRequests, shouldRetry, newStripeError("invalid_request_error", "rate_limit",
			"Request rate limit exceeded. Learn more about rate limits here https://stripe.com/docs/rate-limits.")), true
	case !authorized(h.Get("Authorization"), s.opts.APIKey):
		message := "Invalid API Key provided."
		if h.Get("Authorization") == "" {
			message = "You did not provide an API key. You need to provide your API key in the Authorization header, " +
				"using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY')."
		}
		return stripeErrorAnswer(http.StatusUnauthorized, "", stripeError{Type: "invalid_request_error", Message: message}), true
	case s.opts.StripeVersion != "" && version != s.opts.StripeVersion:
		return stripeErrorAnswer(http.StatusBadRequest, "", newStripeError("invalid_request_error", "",
			fmt.Sprintf("Stripe-Version %q is not the pinned version %q.", version, s.opts.StripeVersion)).withParam("Stripe-Version")), true
	}
	return stripeAnswer{}, false
}

// createIntent creates the PaymentIntent of a request admitted to create
// one, stores its answer under its key, sends its event and, when it is
// processing, starts waiting for its verdict.
func (s *Server) createIntent(key, requestID string, p intentParams, a intentAdmission) stripeAnswer {
	b := behaviourOf(p.paymentMethod)
	in := &intent{
		id:            newID("pi_"),
		key:           key,
		amount:        p.amount,
		currency:      p.currency,
		customer:      p.customer,
		paymentMethod: p.paymentMethod,
		metadata:      p.metadata,
		behaviour:     b,
		latestCharge:  newID("ch_"),
		answerLost:    a.reset,
	}
	if b.methodType != "card" {
		// Stripe's payments by other methods than cards are py_....
		in.latestCharge = newID("py_")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Taken under the lock so that created follows creation order.
	in.created = time.Now()
	st := &s.stats.Stripe
	var ans stripeAnswer
	switch {
	case b.declines != nil:
		in.status = piRequiresPaymentMethod
		failure := *b.declines
		failure.Charge = in.latestCharge
		in.lastError = &failure
		st.Declined++
		// The answer's error embeds the PaymentIntent, whose
		// last_payment_error is the same error without it.
		pi := in.object()
		e := failure
		e.PaymentIntent = &pi
		ans = stripeErrorAnswer(http.StatusPaymentRequired, "", e)
	case b.processing:
		in.status = piProcessing
		st.Processing++
		ans = stripeAnswer{status: http.StatusOK, body: marshal(in.object())}
	default:
		in.status = piSucceeded
		st.Succeeded++
		s.countSucceededLocked(in.orderRef())
		ans = stripeAnswer{status: http.StatusOK, body: marshal(in.object())}
	}
	in.dropRate = s.opts.WebhookDropRate
	if a.stored500 {
		st.Stored500s++
		in.dropRate = s.opts.Stored500DropRate
		ans = stripeErrorAnswer(http.StatusInternalServerError, shouldNotRetry,
			newStripeError("api_error", "", "An unknown error occurred"))
	}
	if a.reset {
		st.Resets++
	}
	ans.requestID = requestID
	in.answer = ans.status
	s.stripe.intents = append(s.stripe.intents, in)
	s.stripe.byID[in.id] = in
	if k := s.stripe.keys[key]; key != "" && k != nil {
		k.inFlight, k.answer = false, ans
	}
	s.notifyLocked(s.eventLocked(in, &requestID), in.dropRate)
	if b.processing && !b.neverSettle {
		s.goLocked(func(ctx context.Context) {
			if sleep(ctx, a.verdictAfter) {
				s.decideIntent(in)
			}
		})
	}
	return ans
}

// decideIntent gives the processing PaymentIntent in its verdict and sends
// its event.
func (s *Server) decideIntent(in *intent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in.decided = time.Now().UTC()
	st := &s.stats.Stripe
	if e := in.behaviour.failure; e != nil {
		in.status = piRequiresPaymentMethod
		failure := *e
		failure.Charge = in.latestCharge
		in.lastError = &failure
		st.ProcessingFailed++
	} else {
		in.status = piSucceeded
		st.ProcessingSucceeded++
		s.countSucceededLocked(in.orderRef())
	}
	s.notifyLocked(s.eventLocked(in, nil), in.dropRate)
}

// stripeEvent is Stripe's Event object, as posted to a webhook endpoint.
type stripeEvent struct {
	ID              string       `json:"id"`
	Object          string       `json:"object"`
	APIVersion      string       `json:"api_version"`
	Created         int64        `json:"created"`
	Data            eventData    `json:"data"`
	Livemode        bool         `json:"livemode"`
	PendingWebhooks int          `json:"pending_webhooks"`
	Request         eventRequest `json:"request"`
	Type            string       `json:"type"`
}

type eventData struct {
	Object paymentIntent `json:"object"`
}

// eventRequest is the API request that caused an event: null fields for a
// change Stripe made on its own (a debit's verdict).
type eventRequest struct {
	ID             *string `json:"id"`
	IdempotencyKey *string `json:"idempotency_key"`
}

// eventType is the type of the event that announces a PaymentIntent in
// status.
func eventType(status string) string {
	switch status {
	case piSucceeded:
		return "payment_intent.succeeded"
	case piProcessing:
		return "payment_intent.processing"
	}
	return "payment_intent.payment_failed"
}

// eventLocked is the notification of in as it is now, caused by the
// request requestID (nil for a verdict Stripe reached by itself). Its
// forged copy claims the opposite outcome. s.mu must be held.
func (s *Server) eventLocked(in *intent, requestID *string) notification {
	ev := stripeEvent{
		ID:              newID("evt_"),
		Object:          "event",
		APIVersion:      s.apiVersionLocked(),
		Created:         time.Now().Unix(),
		Data:            eventData{Object: in.object()},
		PendingWebhooks: 1,
		Type:            eventType(in.status),
	}
	if requestID != nil {
		ev.Request.ID = requestID
		if in.key != "" {
			ev.Request.IdempotencyKey = &in.key
		}
	}
	forged := ev
	forged.ID = newID("evt_")
	pi := ev.Data.Object
	if pi.Status == piSucceeded {
		e := newStripeError("card_error", "card_declined", "Your card was declined.")
		e.DeclineCode = "generic_decline"
		pi.Status, pi.AmountReceived, pi.LastPaymentError = piRequiresPaymentMethod, 0, &e
	} else {
		pi.Status, pi.AmountReceived, pi.LastPaymentError = piSucceeded, pi.Amount, nil
	}
	forged.Data.Object, forged.Type = pi, eventType(pi.Status)
	return notification{profile: ProfileStripe, payload: marshal(ev), forged: marshal(forged)}
}

// apiVersionLocked is the API version of the webhook endpoint: the pinned
// StripeVersion, else the one stripe-go (whose webhook package billing
// verifies with) expects. s.mu must be held.
func (s *Server) apiVersionLocked() string {
	return cmp.Or(s.opts.StripeVersion, stripe.APIVersion)
}

// writeStripe writes ans with the headers Stripe sends.
func (s *Server) writeStripe(w http.ResponseWriter, r *http.Request, requestID string, ans stripeAnswer) {
	h := w.Header()
	h.Set("Request-Id", requestID)
	if key := r.Header.Get("Idempotency-Key"); key != "" && len(key) <= maxKeyLen {
		h.Set("Idempotency-Key", key)
	}
	s.mu.Lock()
	h.Set("Stripe-Version", cmp.Or(r.Header.Get("Stripe-Version"), s.apiVersionLocked()))
	s.mu.Unlock()
	if ans.shouldRetry != "" {
		h.Set("Stripe-Should-Retry", ans.shouldRetry)
	}
	if ans.replayed {
		h.Set("Idempotent-Replayed", "true")
		h.Set("Original-Request", ans.requestID)
	}
	writeJSON(w, ans.status, ans.body)
}
