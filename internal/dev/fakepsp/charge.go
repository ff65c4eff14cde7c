package fakepsp

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
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
// it and, once created, the answer to replay. body is nil while the request
// is in flight.
type entry struct {
	req    chargeRequest
	status int
	body   []byte
}

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
	// passed it must create a decline (decline set) or a charge, and then
	// reset the connection instead of answering when reset is set.
	create  bool
	decline bool
	reset   bool
}

func (s *Server) handleCreateCharge(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	req, reqErr := parseChargeRequest(w, r, key)
	a := s.admit(clientAddr(r), key, r.Header.Get("Authorization"), req, reqErr)

	// The lock is free while sleeping; a claimed key stays in flight.
	time.Sleep(a.latency)

	ans := a.answer
	switch {
	case a.create && a.decline:
		ans = s.createDecline(key, req)
	case a.create:
		ans = s.createCharge(key, req, a.reset)
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
	c := s.clients[client]
	c.Requests++
	c.Last = now.UTC()
	s.clients[client] = c
	recent := s.arrived(now)
	a := admission{latency: s.opts.Latency}
	switch e, seen := s.keys[key]; {
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
		s.keys[key] = entry{req: req}
		a.create = true
		a.decline = s.opts.DeclineEvery > 0 && req.OrderID%s.opts.DeclineEvery == 0
		a.reset = !a.decline && s.draw(s.opts.ResetRate)
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

func (s *Server) createDecline(key string, req chargeRequest) answer {
	ans := answer{status: http.StatusPaymentRequired, body: marshal(errorBody{Error: errorDetail{
		Type: "card_declined", Message: "Your card was declined.", DeclineCode: "generic_decline"}})}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Declines++
	s.storeLocked(key, req, ans)
	return ans
}

func (s *Server) createCharge(key string, req chargeRequest, reset bool) answer {
	id := newChargeID()
	s.mu.Lock()
	defer s.mu.Unlock()
	c := Charge{
		ID:             id,
		IdempotencyKey: key,
		OrderID:        req.OrderID,
		CustomerID:     req.CustomerID,
		Amount:         req.Amount,
		Currency:       req.Currency,
		Status:         "succeeded",
		// Taken under the lock so that Created follows creation order.
		Created: time.Now().UTC(),
	}
	s.charges = append(s.charges, c)
	s.stats.ChargesCreated++
	s.chargesPerOrder[req.OrderID]++
	if s.chargesPerOrder[req.OrderID] == 2 {
		s.stats.OrdersChargedTwice++
	}
	if reset {
		s.stats.Resets++
	}
	ans := answer{status: http.StatusOK, body: marshal(c)}
	s.storeLocked(key, req, ans)
	return ans
}

// storeLocked stores the outcome of a claimed key, ending its flight.
// s.mu must be held.
func (s *Server) storeLocked(key string, req chargeRequest, ans answer) {
	s.stats.DistinctKeys++
	s.keys[key] = entry{req: req, status: ans.status, body: ans.body}
}

func errorAnswer(status int, errType, message string) answer {
	return answer{status: status, body: errorJSON(errType, message)}
}

// newChargeID returns "ch_" and 24 random hex characters.
func newChargeID() string {
	var b [12]byte
	// crypto/rand.Read never returns an error; it crashes the program if
	// the operating system cannot provide randomness.
	_, _ = rand.Read(b[:])
	return "ch_" + hex.EncodeToString(b[:])
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
	q := r.URL.Query()
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
