package fakepsp

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// maxKeyLen is Stripe's limit on idempotency keys; it also bounds the memory
// a key can take.
const maxKeyLen = 255

// chargeRequest is the body of POST /v1/charges. It is comparable, so a
// reused key is checked against the parsed fields, not the raw bytes.
type chargeRequest struct {
	OrderID    int64  `json:"orderId"`
	CustomerID int64  `json:"customerId"`
	Amount     int64  `json:"amount"`
	Currency   string `json:"currency"`
}

func (c chargeRequest) validate() error {
	switch {
	case c.OrderID <= 0:
		return errors.New("orderId must be a positive integer")
	case c.CustomerID <= 0:
		return errors.New("customerId must be a positive integer")
	case c.Amount <= 0:
		return errors.New("amount must be a positive integer")
	case !isCurrencyCode(c.Currency):
		return errors.New("currency must be 3 upper-case letters")
	}
	return nil
}

func isCurrencyCode(s string) bool {
	if len(s) != 3 {
		return false
	}
	for _, c := range []byte(s) {
		if c < 'A' || c > 'Z' {
			return false
		}
	}
	return true
}

// entry is what the server remembers about a key: the request that claimed
// it and when, and, once created, the answer to replay and the payment.
// body is nil while the request is in flight.
type entry struct {
	req     chargeRequest
	claimed time.Time
	status  int
	body    []byte
	payment int // index in Server.contractPayments, once created
}

// contractPayment is a payment of the contract profile, any status.
type contractPayment struct {
	charge     Charge
	answer     int
	answerLost bool
	decided    time.Time
}

func (p contractPayment) payment() Payment {
	c := p.charge
	return Payment{
		Profile:        ProfileContract,
		ID:             c.ID,
		IdempotencyKey: c.IdempotencyKey,
		EventID:        c.IdempotencyKey,
		OrderID:        c.OrderID,
		Customer:       strconv.FormatInt(c.CustomerID, 10),
		Amount:         c.Amount,
		Currency:       c.Currency,
		Status:         c.Status,
		ProviderStatus: c.Status,
		DeclineCode:    c.DeclineCode,
		Answer:         p.answer,
		AnswerLost:     p.answerLost,
		Created:        c.Created,
		Decided:        p.decided,
	}
}

// The statuses of a contract payment.
const (
	statusSucceeded  = "succeeded"
	statusDeclined   = "declined"
	statusProcessing = "processing"
)

// contractDeclineCode is the decline code of every contract decline.
const contractDeclineCode = "generic_decline"

// answer is a response to POST /v1/charges.
type answer struct {
	status     int
	body       []byte
	replayed   bool
	retryAfter string // seconds, for a 429
}

// admission is what was decided about a POST /v1/charges when it arrived.
type admission struct {
	latency time.Duration
	// answer is the response unless create is set.
	answer answer
	// create is set when the request claimed its key: once latency has
	// passed it must create a processing payment (processing set, whose
	// verdict is a decline when decline is set), a decline (decline set) or
	// a charge, and then reset the connection instead of answering when
	// reset is set.
	create     bool
	processing bool
	decline    bool
	reset      bool
	// verdictAfter is how long a processing payment waits for its verdict.
	verdictAfter time.Duration
}

func (s *Server) handleCreateCharge(w http.ResponseWriter, r *http.Request) {
	if !s.serves(ProfileContract, w, r) {
		return
	}
	key := r.Header.Get("Idempotency-Key")
	req, reqErr := parseChargeRequest(w, r, key)
	a := s.admit(clientAddr(r), key, r.Header.Get("Authorization"), req, reqErr)

	// The lock is free while sleeping; a claimed key stays in flight.
	time.Sleep(a.latency)

	ans := a.answer
	if a.create {
		ans = s.createContractPayment(key, req, a)
		if a.reset {
			resetConnection(w)
			return
		}
	}
	if ans.replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	if ans.retryAfter != "" {
		w.Header().Set("Retry-After", ans.retryAfter)
	}
	writeJSON(w, ans.status, ans.body)
}

// clientAddr is the IP address of the request's connection, without its
// port.
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr // not host:port (a test's handler call): as it is
	}
	return host
}

// parseChargeRequest reads and validates a charge request. It runs before the
// lock is taken, so its error is only reported if admit finds no earlier
// reason (down, unauthorized) to reject the request.
func parseChargeRequest(w http.ResponseWriter, r *http.Request, key string) (chargeRequest, error) {
	switch {
	case key == "":
		return chargeRequest{}, errors.New("missing Idempotency-Key header")
	case len(key) > maxKeyLen:
		return chargeRequest{}, fmt.Errorf("the Idempotency-Key header is longer than %d characters", maxKeyLen)
	}
	var req chargeRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return chargeRequest{}, err
	}
	return req, req.validate()
}

// admit counts the request and decides, in the order given in the package
// documentation, everything that must be decided on arrival. When the
// request is to create an outcome, admit claims its key.
func (s *Server) admit(client, key, authorization string, req chargeRequest, reqErr error) admission {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	s.stats.Requests++
	s.countClientLocked(client, now)
	recent := s.arrived(now)
	a := admission{latency: s.opts.Latency}
	e, seen := s.keys[key]
	if seen && e.body != nil && now.Sub(e.claimed) >= s.opts.idempotencyTTL() {
		// The provider has forgotten the key: the request is new.
		delete(s.keys, key)
		s.stats.Contract.KeysExpired++
		seen = false
	}
	switch {
	case s.down:
		s.stats.DownRejections++
		a.answer = errorAnswer(http.StatusServiceUnavailable, "api_error", "the provider is down")
	case s.opts.RateLimit > 0 && recent > s.opts.RateLimit:
		s.stats.RateLimited++
		a.answer = errorAnswer(http.StatusTooManyRequests, "rate_limit_error", "too many requests")
		a.answer.retryAfter = "1"
	case !authorized(authorization, s.opts.APIKey):
		s.stats.Unauthorized++
		a.answer = errorAnswer(http.StatusUnauthorized, "authentication_error", "missing or invalid API key")
	case reqErr != nil:
		s.stats.BadRequests++
		a.answer = errorAnswer(http.StatusBadRequest, "invalid_request_error", reqErr.Error())
	case s.draw(s.opts.FailRate) || slices.Contains(s.opts.FailOrders, req.OrderID):
		s.stats.InjectedFailures++
		a.answer = errorAnswer(http.StatusServiceUnavailable, "api_error", "injected failure")
	case seen && e.req != req:
		s.stats.Mismatches++
		a.answer = errorAnswer(http.StatusUnprocessableEntity, "idempotency_error",
			"the Idempotency-Key was already used with different parameters")
	case seen && e.body == nil:
		s.stats.Conflicts++
		a.answer = errorAnswer(http.StatusConflict, "idempotency_error",
			"a request with the same Idempotency-Key is still in progress")
	case seen:
		s.stats.Replays++
		a.answer = answer{status: e.status, body: e.body, replayed: true}
	default:
		s.keys[key] = entry{req: req, claimed: now}
		a.create = true
		a.processing = s.opts.ProcessingEvery > 0 && req.OrderID%s.opts.ProcessingEvery == 0
		a.decline = s.opts.DeclineEvery > 0 && req.OrderID%s.opts.DeclineEvery == 0
		// A decline is always answered; a charge, or a payment still
		// processing, may lose its answer.
		a.reset = (a.processing || !a.decline) && s.draw(s.opts.ResetRate)
		a.verdictAfter = s.opts.ProcessingDelay
	}
	return a
}

// arrived records a request arriving at now and returns how many arrived
// within the last second, this one included. s.mu must be held.
func (s *Server) arrived(now time.Time) int {
	cut := 0
	for cut < len(s.lastSecond) && now.Sub(s.lastSecond[cut]) >= time.Second {
		cut++
	}
	s.lastSecond = append(s.lastSecond[cut:], now)
	n := len(s.lastSecond)
	s.stats.PeakPerSecond = max(s.stats.PeakPerSecond, int64(n))
	return n
}

// authorized reports whether the Authorization header carries want as a
// bearer token; any header passes when no key is configured. The token is
// compared in constant time so response timing does not reveal the key.
func authorized(header, want string) bool {
	if want == "" {
		return true
	}
	scheme, token, ok := strings.Cut(header, " ")
	return ok && strings.EqualFold(scheme, "Bearer") &&
		subtle.ConstantTimeCompare([]byte(token), []byte(want)) == 1
}

// draw reports whether a fault with probability p happens. It consumes
// randomness only when the outcome is uncertain, so a disabled fault does
// not shift the sequence an enabled one sees. s.mu must be held.
func (s *Server) draw(p float64) bool {
	switch {
	case p <= 0:
		return false
	case p >= 1:
		return true
	}
	return s.rng.Float64() < p
}

// createContractPayment creates the outcome of a request that claimed key,
// stores its answer under the key and, for a processing payment, starts
// waiting for its verdict.
func (s *Server) createContractPayment(key string, req chargeRequest, a admission) answer {
	id := newID("ch_")
	s.mu.Lock()
	defer s.mu.Unlock()
	p := contractPayment{
		charge: Charge{
			ID:             id,
			IdempotencyKey: key,
			OrderID:        req.OrderID,
			CustomerID:     req.CustomerID,
			Amount:         req.Amount,
			Currency:       req.Currency,
			// Taken under the lock so that Created follows creation order.
			Created: time.Now().UTC(),
		},
		answerLost: a.reset,
	}
	var ans answer
	switch {
	case a.processing:
		p.charge.Status = statusProcessing
		s.stats.Contract.Processing++
		ans = answer{status: http.StatusAccepted, body: marshal(p.charge)}
	case a.decline:
		p.charge.Status = statusDeclined
		p.charge.DeclineCode = contractDeclineCode
		s.stats.Declines++
		ans = answer{status: http.StatusPaymentRequired, body: marshal(errorBody{Error: errorDetail{
			Type: "card_declined", Message: "Your card was declined.", DeclineCode: contractDeclineCode}})}
	default:
		p.charge.Status = statusSucceeded
		s.stats.ChargesCreated++
		s.charges = append(s.charges, p.charge)
		s.countSucceededLocked(strconv.FormatInt(req.OrderID, 10))
		ans = answer{status: http.StatusOK, body: marshal(p.charge)}
	}
	if a.reset {
		s.stats.Resets++
	}
	p.answer = ans.status
	s.contractPayments = append(s.contractPayments, p)
	i := len(s.contractPayments) - 1
	s.stats.DistinctKeys++
	e := s.keys[key]
	e.status, e.body, e.payment = ans.status, ans.body, i
	s.keys[key] = e
	if a.processing {
		s.goLocked(func(ctx context.Context) {
			if sleep(ctx, a.verdictAfter) {
				s.decideContractPayment(i, a.decline)
			}
		})
	}
	return ans
}

// decideContractPayment gives the processing payment i its verdict and
// notifies the webhook endpoint.
func (s *Server) decideContractPayment(i int, decline bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := &s.contractPayments[i]
	p.decided = time.Now().UTC()
	if decline {
		p.charge.Status = statusDeclined
		p.charge.DeclineCode = contractDeclineCode
		s.stats.Contract.ProcessingDeclined++
	} else {
		p.charge.Status = statusSucceeded
		s.stats.Contract.ProcessingSucceeded++
		s.insertChargeLocked(p.charge)
		s.countSucceededLocked(strconv.FormatInt(p.charge.OrderID, 10))
	}
	s.notifyLocked(contractNotification(p.charge), s.opts.WebhookDropRate)
}

// insertChargeLocked adds c to the succeeded charges at the place of its
// creation time. s.mu must be held.
func (s *Server) insertChargeLocked(c Charge) {
	i, _ := slices.BinarySearchFunc(s.charges, c.Created, func(x Charge, t time.Time) int {
		// Equal times go after the charges already there.
		if x.Created.After(t) {
			return 1
		}
		return -1
	})
	s.charges = slices.Insert(s.charges, i, c)
}

func errorAnswer(status int, errType, message string) answer {
	return answer{status: status, body: errorJSON(errType, message)}
}

// newID returns prefix and 24 random hex characters: "ch_...", "pi_...".
func newID(prefix string) string {
	var b [12]byte
	// crypto/rand.Read never returns an error; it crashes the program if
	// the operating system cannot provide randomness.
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// resetConnection closes the connection without answering, as when a
// provider has charged and the connection is then lost.
func resetConnection(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// HTTP/2 connections cannot be hijacked. Aborting the handler
		// resets the stream instead, which the client sees the same way.
		panic(http.ErrAbortHandler)
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		// With linger 0, Close sends RST instead of FIN: a reset, not an
		// orderly close. If it fails the client sees EOF, which is as good.
		_ = tcp.SetLinger(0)
	}
	// Nothing was promised to anyone about this connection; a failed Close
	// changes nothing.
	_ = conn.Close()
}

// window is a time range [from, to) for GET /v1/charges; a zero bound is
// open.
type window struct {
	from, to time.Time
}

func (w window) contains(t time.Time) bool {
	return !t.Before(w.from) && (w.to.IsZero() || t.Before(w.to))
}

func (s *Server) handleListCharges(w http.ResponseWriter, r *http.Request) {
	if !s.serves(ProfileContract, w, r) {
		return
	}
	q := r.URL.Query()
	if q.Has("idempotency_key") {
		s.handleLookupCharge(w, q)
		return
	}
	var win window
	var err error
	if win.from, err = timeParam(q, "created_gte"); err == nil {
		win.to, err = timeParam(q, "created_lt")
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, marshal(struct {
		Data []Charge `json:"data"`
	}{s.chargesIn(win)}))
}

// timeParam parses the optional RFC 3339 query parameter name; absent, it
// is the zero time, an open bound.
func timeParam(q url.Values, name string) (time.Time, error) {
	v := q.Get(name)
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s must be an RFC 3339 time: %q", name, v)
	}
	return t, nil
}

// chargesIn returns the charges created within win, in creation order,
// never nil so that an empty list encodes as [].
func (s *Server) chargesIn(win window) []Charge {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []Charge{}
	for _, c := range s.charges {
		if win.contains(c.Created) {
			out = append(out, c)
		}
	}
	return out
}

// handleLookupCharge answers GET /v1/charges?idempotency_key=<key>: the
// key's payment as it stands, or no data when the provider does not know
// the key (never used, still in flight, or expired).
func (s *Server) handleLookupCharge(w http.ResponseWriter, q url.Values) {
	s.mu.Lock()
	s.stats.Contract.Lookups++
	s.mu.Unlock()
	if len(q) != 1 || len(q["idempotency_key"]) != 1 || q.Get("idempotency_key") == "" {
		writeError(w, http.StatusBadRequest, "invalid_request_error",
			"idempotency_key takes one non-empty value and no other parameter")
		return
	}
	key := q.Get("idempotency_key")
	s.mu.Lock()
	data := []Charge{}
	if e, ok := s.keys[key]; ok && e.body != nil && time.Since(e.claimed) < s.opts.idempotencyTTL() {
		data = append(data, s.contractPayments[e.payment].charge)
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, marshal(struct {
		Data []Charge `json:"data"`
	}{data}))
}
