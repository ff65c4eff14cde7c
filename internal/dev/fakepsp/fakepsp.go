// Package fakepsp is a local fake payment service provider (PSP) with
// Stripe-like idempotency and fault injection.
//
// It serves the single provider call the billing service makes,
// POST /v1/charges, and keeps exact, concurrency-safe books of everything it
// did, so that tests, the demo and the chaos suite (which runs it as a
// separate process and drives it over HTTP) can check invariants such as
// "no order charged twice" against [Server.Stats] and [Server.Charges].
//
// A POST /v1/charges is decided in this order; the first rule that applies
// answers it:
//
//  1. provider down (see [Server.SetDown]): 503, nothing changes;
//  2. more than RateLimit requests arrived within the last second: 429 with
//     Retry-After: 1, nothing stored;
//  3. APIKey set and Authorization missing or wrong: 401, nothing stored;
//  4. malformed request: 400, nothing stored;
//  5. injected failure (FailRate, or an order of FailOrders): 503, nothing
//     stored, so a retry with the same key creates the outcome;
//  6. key already used with a different body: 422, even while in flight,
//     since retrying cannot fix it;
//  7. key in flight: 409;
//  8. key with a stored outcome: the stored answer, byte for byte, with
//     header Idempotent-Replayed: true;
//  9. otherwise the request claims the key, waits Latency, and creates the
//     outcome: a decline (402) when DeclineEvery divides the order id, else a
//     charge (200), after which the connection is reset with probability
//     ResetRate.
//
// Every request, whatever its outcome, is answered only after Latency. The
// request that claims a key creates its outcome even if its client has gone
// away meanwhile, as a real provider would.
package fakepsp

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Options configures the faults the server injects. The zero value is a
// well-behaved provider.
//
// In JSON (PUT /_faults, GET /_faults) Latency is an integer number of
// nanoseconds, as encoding/json writes a time.Duration.
type Options struct {
	// Latency is added to every POST /v1/charges before it is answered.
	// The request that creates an outcome keeps its key in flight for that
	// long, so duplicates arriving meanwhile get 409.
	Latency time.Duration `json:"latency"`
	// FailRate is the probability of answering 503 without doing anything.
	FailRate float64 `json:"failRate"`
	// FailOrders are orders whose every charge request is answered 503
	// without doing anything, as long as they are listed: a key stuck on a
	// provider error among others that go through.
	FailOrders []int64 `json:"failOrders,omitempty"`
	// ResetRate is the probability of creating and storing a charge and then
	// closing the connection without answering ("provider said 200,
	// connection reset"). Declines are always answered.
	ResetRate float64 `json:"resetRate"`
	// DeclineEvery, when > 0, declines (402) orders whose id is a multiple
	// of it. 0 never declines.
	DeclineEvery int64 `json:"declineEvery"`
	// RateLimit, when > 0, answers 429 with Retry-After: 1 to a request
	// that arrives when RateLimit requests already arrived within the last
	// second, as a provider's rate limit does (Stripe's live mode: 100).
	RateLimit int `json:"rateLimit"`
	// APIKey, when set, is required as Authorization: Bearer <APIKey> on
	// POST /v1/charges.
	APIKey string `json:"apiKey,omitempty"`
	// Seed seeds the fault randomness so that runs replay.
	Seed int64 `json:"seed"`
}

// Validate rejects options that cannot be meant. PUT /_faults and the
// fakepsp command use it; New and SetOptions have no error to return, and
// out-of-range values there behave as the nearest valid one.
func (o Options) Validate() error {
	switch {
	case o.Latency < 0:
		return errors.New("latency must not be negative")
	case o.FailRate < 0 || o.FailRate > 1:
		return errors.New("failRate must be within [0, 1]")
	case o.ResetRate < 0 || o.ResetRate > 1:
		return errors.New("resetRate must be within [0, 1]")
	case o.DeclineEvery < 0:
		return errors.New("declineEvery must not be negative")
	case o.RateLimit < 0:
		return errors.New("rateLimit must not be negative")
	}
	return nil
}

// Charge is a succeeded charge created by the server.
type Charge struct {
	ID             string    `json:"id"`
	IdempotencyKey string    `json:"idempotencyKey"`
	OrderID        int64     `json:"orderId"`
	CustomerID     int64     `json:"customerId"`
	Amount         int64     `json:"amount"`
	Currency       string    `json:"currency"`
	Status         string    `json:"status"` // "succeeded"
	Created        time.Time `json:"created"`
}

// Stats counts what the server did. Every POST /v1/charges increments
// Requests when it arrives and exactly one of ChargesCreated, Declines,
// Replays, Conflicts, Mismatches, BadRequests, Unauthorized,
// InjectedFailures and DownRejections when it is decided, so once no request
// is in flight Requests is their sum. Resets counts the charges among
// ChargesCreated whose answer was dropped.
type Stats struct {
	Requests           int64 `json:"requests"`           // every POST /v1/charges received
	DistinctKeys       int64 `json:"distinctKeys"`       // keys with a stored outcome
	ChargesCreated     int64 `json:"chargesCreated"`     // succeeded charges created (not replays)
	Declines           int64 `json:"declines"`           // declines created (not replays)
	Replays            int64 `json:"replays"`            // stored answers replayed
	Conflicts          int64 `json:"conflicts"`          // 409
	Mismatches         int64 `json:"mismatches"`         // 422
	BadRequests        int64 `json:"badRequests"`        // 400
	Unauthorized       int64 `json:"unauthorized"`       // 401
	InjectedFailures   int64 `json:"injectedFailures"`   // 503 from FailRate or FailOrders
	DownRejections     int64 `json:"downRejections"`     // 503 while down
	RateLimited        int64 `json:"rateLimited"`        // 429 from RateLimit
	Resets             int64 `json:"resets"`             // connections closed after charging
	OrdersChargedTwice int64 `json:"ordersChargedTwice"` // orders with more than one succeeded charge
	// PeakPerSecond is the most POST /v1/charges that arrived within any
	// one second (a sliding window): what a rate limit would have seen.
	PeakPerSecond int64 `json:"peakPerSecond"`
}

// ClientStats is what the server saw of one client address: the chaos
// suite runs replicas in network namespaces of their own, each with its
// own source address, and tells from these which replica still sends
// charges (a replica cut off from the brokers must stop) without billing
// knowing it is watched.
type ClientStats struct {
	// Requests counts the POST /v1/charges that arrived from the address,
	// whatever their answer.
	Requests int64 `json:"requests"`
	// Last is when the last of them arrived.
	Last time.Time `json:"last"`
}

// pcgStream is the second PCG parameter. Only Seed varies between runs; any
// fixed value keeps them replayable.
const pcgStream = 0x9e3779b97f4a7c15

// Server is the fake provider. It is an http.Handler; create it with New.
type Server struct {
	mux *http.ServeMux

	mu   sync.Mutex // guards the fields below; never held while sleeping
	opts Options
	rng  *rand.Rand
	down bool
	// keys holds every key that has a stored outcome or is in flight.
	keys    map[string]entry
	charges []Charge // in creation order
	// chargesPerOrder counts succeeded charges per order id, for
	// Stats.OrdersChargedTwice.
	chargesPerOrder map[int64]int
	stats           Stats
	// clients counts the requests per client IP address (ClientStats).
	clients map[string]ClientStats
	// lastSecond holds the arrival times of the requests of the last
	// second, oldest first: the sliding window of RateLimit and
	// Stats.PeakPerSecond.
	lastSecond []time.Time
}

// New returns a server injecting the faults in opts.
func New(opts Options) *Server {
	s := &Server{
		mux:             http.NewServeMux(),
		keys:            make(map[string]entry),
		chargesPerOrder: make(map[int64]int),
		clients:         make(map[string]ClientStats),
	}
	s.SetOptions(opts)
	s.mux.HandleFunc("POST /v1/charges", s.handleCreateCharge)
	s.mux.HandleFunc("GET /v1/charges", s.handleListCharges)
	s.mux.HandleFunc("GET /_stats", s.handleStats)
	s.mux.HandleFunc("POST /_down", s.handleSetDown(true))
	s.mux.HandleFunc("POST /_up", s.handleSetDown(false))
	s.mux.HandleFunc("GET /_faults", s.handleGetFaults)
	s.mux.HandleFunc("PUT /_faults", s.handlePutFaults)
	s.mux.HandleFunc("GET /healthz", handleHealthz)
	return s
}

// ServeHTTP serves
//
//	POST /v1/charges   create a charge (see the package documentation)
//	GET  /v1/charges   {"data":[Charge...]} in creation order, optionally
//	                   limited to created_gte <= created < created_lt
//	                   (RFC 3339 query parameters)
//	GET  /_stats       Stats, and "clients": Clients
//	POST /_down        switch the provider down
//	POST /_up          switch the provider up
//	GET  /_faults      the current Options, without APIKey
//	PUT  /_faults      replace the Options; APIKey is kept unless the body
//	                   sets it, since GET /_faults never shows it
//	GET  /healthz      200
//
// Only POST /v1/charges requires the API key: the other routes belong to
// tests and tools, and work while the provider is down.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mux.ServeHTTP(w, r)
}

// SetOptions replaces all options, APIKey included. It also restarts the
// fault randomness from opts.Seed, so the faults drawn after the call replay
// across runs whatever happened before it. Requests already received keep
// the options they arrived under.
func (s *Server) SetOptions(opts Options) {
	s.setOptions(opts, false)
}

func (s *Server) setOptions(opts Options, keepAPIKey bool) {
	rng := rand.New(rand.NewPCG(uint64(opts.Seed), pcgStream))
	s.mu.Lock()
	defer s.mu.Unlock()
	if keepAPIKey {
		opts.APIKey = s.opts.APIKey
	}
	opts.FailOrders = slices.Clone(opts.FailOrders)
	s.opts = opts
	s.rng = rng
}

// SetDown switches the provider down (every POST /v1/charges answers 503 and
// changes nothing) or back up.
func (s *Server) SetDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = down
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Clients returns what the server saw of each client IP address, keyed by
// the address as text (the remote address of the connection, without its
// port).
func (s *Server) Clients() map[string]ClientStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.clients)
}

// Charges returns every charge created (succeeded only), in creation order.
func (s *Server) Charges() []Charge {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.charges)
}

// faults returns the current options without the API key, for GET /_faults.
func (s *Server) faults() Options {
	s.mu.Lock()
	defer s.mu.Unlock()
	opts := s.opts
	opts.APIKey = ""
	return opts
}

func (s *Server) handleStats(w http.ResponseWriter, _ *http.Request) {
	// Stats stays a comparable struct of counters; the clients sit beside
	// its fields in the same JSON object.
	s.mu.Lock()
	body := struct {
		Stats
		Clients map[string]ClientStats `json:"clients"`
	}{s.stats, maps.Clone(s.clients)}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, marshal(body))
}

func (s *Server) handleSetDown(down bool) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		s.SetDown(down)
		writeJSON(w, http.StatusOK, marshal(struct {
			Down bool `json:"down"`
		}{down}))
	}
}

func (s *Server) handleGetFaults(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, marshal(s.faults()))
}

func (s *Server) handlePutFaults(w http.ResponseWriter, r *http.Request) {
	// The outer APIKey shadows the embedded one, so a nil pointer tells
	// "not sent" apart from "sent empty" (which turns authentication off).
	var body struct {
		Options
		APIKey *string `json:"apiKey"`
	}
	err := decodeJSON(w, r, &body)
	if err == nil {
		err = body.Options.Validate()
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	if body.APIKey != nil {
		body.Options.APIKey = *body.APIKey
	}
	s.setOptions(body.Options, body.APIKey == nil)
	writeJSON(w, http.StatusOK, marshal(s.faults()))
}

func handleHealthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, []byte(`{"status":"ok"}`))
}

// maxBodyBytes bounds request bodies; real ones are under 100 bytes.
const maxBodyBytes = 64 << 10

// decodeJSON decodes exactly one JSON value from the request body into v,
// rejecting unknown fields so that a typo in a test's request fails loudly
// instead of being ignored.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("invalid JSON body: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("invalid JSON body: data after the JSON value")
	}
	return nil
}

// marshal encodes v, which must be one of this package's plain data types:
// encoding them cannot fail, so an error is a programming mistake.
func marshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("fakepsp: encoding %T: %v", v, err))
	}
	return b
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// A failed write means the client has gone; there is no one to tell.
	_, _ = w.Write(body)
}

// errorBody is the Stripe-like error answer.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
	// DeclineCode says why a card was declined, as Stripe's does.
	DeclineCode string `json:"decline_code,omitempty"`
}

func errorJSON(errType, message string) []byte {
	return marshal(errorBody{Error: errorDetail{Type: errType, Message: message}})
}

func writeError(w http.ResponseWriter, status int, errType, message string) {
	writeJSON(w, status, errorJSON(errType, message))
}
