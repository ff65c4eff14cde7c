// Package payment is the HTTP client of the payment provider.
//
// Every charge carries Idempotency-Key: <eventId>. That is the second guard on
// money: when the provider charged but its answer was lost (a reset
// connection, a timeout), the charge attempt stays pending in billing's
// charge table, and whoever completes it (the event's retry, another event
// of the order, maintenance) asks again with the same key and body, which
// the provider answers from its idempotency store instead of charging
// again.
package payment

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"golang.org/x/time/rate"

	"example.com/billing/internal/metrics"
	"example.com/billing/internal/tracing"
)

// Request is one charge.
type Request struct {
	IdempotencyKey string // the event id
	OrderID        int64
	CustomerID     int64
	Amount         int64 // minor units
	Currency       string
	// Ready, when set, is asked once the request has its turn (a slot, a
	// token of the rate limit, no pause in force), just before it is
	// sent: a turn can take seconds, and the caller may no longer want
	// the request by then (the message's partition is another consumer's).
	// An error leaves it unsent: Charge returns a *TransientError that
	// wraps ErrNotSent and it. It is not part of what the provider sees.
	Ready func() error
}

// Charge is the provider's record of a succeeded charge.
type Charge struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

var (
	// ErrDeclined: the provider refused the payment (402). A final business
	// outcome: record it, do not retry.
	ErrDeclined = errors.New("payment declined")
	// ErrRejected: the provider refused the request itself (422: the key was
	// reused with a different body; 400: malformed). Caused by the event, so
	// retrying cannot help: the event goes to the dead-letter topic.
	ErrRejected = errors.New("payment request rejected")
	// ErrNotSent: the request had its turn but its Ready refused it; the
	// provider never saw it.
	ErrNotSent = errors.New("payment request not sent: its caller no longer wants it")
)

// DeclineError is a declined payment (402). It wraps ErrDeclined.
type DeclineError struct {
	// Code is the provider's reason (Stripe's decline_code, else its
	// code), "" when it gave none.
	Code   string
	detail string
}

func (e *DeclineError) Error() string { return ErrDeclined.Error() + ": " + e.detail }
func (e *DeclineError) Unwrap() error { return ErrDeclined }

// DeclineCode returns the provider's decline code of err, "" for any other
// error or a decline without one.
func DeclineCode(err error) string {
	var de *DeclineError
	if errors.As(err, &de) {
		return de.Code
	}
	return ""
}

// declineCode reads a Stripe-like 402 body: error.decline_code, else
// error.code. The code is kept only when it is a short identifier: it goes
// into an event other services read.
func declineCode(body []byte) string {
	var answer struct {
		Error struct {
			DeclineCode string `json:"decline_code"`
			Code        string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &answer) != nil {
		return ""
	}
	code := answer.Error.DeclineCode
	if code == "" {
		code = answer.Error.Code
	}
	if len(code) > 64 {
		return ""
	}
	for _, r := range code {
		if !(r == '_' || r == '-' || r == '.' || ('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z') || ('0' <= r && r <= '9')) {
			return ""
		}
	}
	return code
}

// TransientError is a failure of the environment (provider down, overloaded,
// unreachable, misconfigured credentials): retry later with the same key.
type TransientError struct {
	Result string        // the metric label, e.g. "server_error"
	After  time.Duration // the provider's Retry-After, when it sent one
	Err    error
}

func (e *TransientError) Error() string { return "payment provider: " + e.Err.Error() }

// RetryAfter is the least wait before asking again: the provider's
// Retry-After, 0 when it sent none.
func (e *TransientError) RetryAfter() time.Duration { return e.After }
func (e *TransientError) Unwrap() error             { return e.Err }

// Config configures a Client.
type Config struct {
	BaseURL string        // e.g. https://psp.example.com; /v1/charges is appended
	APIKey  string        // sent as a bearer token; never logged
	Timeout time.Duration // per request
	// MaxConcurrency bounds the requests in flight, whole client, and the
	// connections to the provider, so that keep-alive connections are
	// reused instead of a TLS handshake per charge. 0 means no bound.
	MaxConcurrency int
	// MaxRPS bounds the requests sent per second, whole client: a token
	// bucket with a burst of one, so that no one-second window, wherever
	// it starts, holds more than MaxRPS (a provider's rate limit counts in
	// such windows, and a burst on top of the rate would meet 429s). It
	// paces at MaxRPS/rpsMargin: requests sent evenly arrive unevenly. 0
	// means no bound.
	MaxRPS float64
	// TracerProvider traces each call as a client span; nil traces nothing.
	// Either way the request carries the caller's traceparent onward.
	TracerProvider trace.TracerProvider
}

// rpsMargin paces MaxRPS requests over 1.05 s rather than 1 s: requests
// leave evenly spaced but arrive bunched by scheduling and network jitter
// of tens of milliseconds, and a provider counting in one-second windows
// answered 429 to 14% of the requests paced at exactly MaxRPS (bench/throughput,
// PAYMENT_MAX_RPS=100, on a loaded 2-core machine).
const rpsMargin = 1.05

// Client calls the provider's charges API.
//
// It stays inside what the provider allows, for the whole process: at most
// MaxConcurrency requests in flight and MaxRPS a second, and after a 429
// with Retry-After no request at all until that time has passed. A caller
// waits for its turn (or for its context to end) before its request is
// sent; a provider that keeps failing is left alone by the circuit breaker.
type Client struct {
	url     string
	apiKey  string
	timeout time.Duration
	http    *http.Client
	breaker *breaker
	metrics *metrics.Metrics

	slots   chan struct{} // one per request in flight; nil: unbounded
	limiter *rate.Limiter // nil: unbounded
	// pausedUntil holds the UnixNano time before which no request is sent:
	// the provider's Retry-After of a 429, for every caller.
	pausedUntil atomic.Int64
}

// New returns a client for cfg.
func New(cfg Config, m *metrics.Metrics) *Client {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConns = cfg.MaxConcurrency
	transport.MaxIdleConnsPerHost = cfg.MaxConcurrency
	transport.MaxConnsPerHost = cfg.MaxConcurrency
	// Each connection keeps a read and a write buffer for its life, 4 KiB
	// each by default, and an HTTP/1.1 provider at 500 ms needs a
	// connection per request in flight: 700 of them held 5.6 MiB of
	// buffers for requests of about 400 bytes and answers of a few
	// hundred. A longer request or answer is still read and written whole,
	// in more system calls.
	transport.ReadBufferSize = connBuffer
	transport.WriteBufferSize = connBuffer
	// otelhttp costs a few percent of the service's CPU even with a no-op
	// provider (it builds its metric attributes per request), so it wraps
	// the transport only when spans are recorded. Either way charge puts the
	// caller's traceparent on the request.
	var rt http.RoundTripper = transport
	if _, off := cfg.TracerProvider.(noop.TracerProvider); cfg.TracerProvider != nil && !off {
		rt = otelhttp.NewTransport(transport,
			otelhttp.WithTracerProvider(cfg.TracerProvider), otelhttp.WithPropagators(tracing.Propagator()),
			otelhttp.WithSpanNameFormatter(func(string, *http.Request) string { return "payment charge" }))
	}
	c := &Client{
		url:     strings.TrimRight(cfg.BaseURL, "/") + "/v1/charges",
		apiKey:  cfg.APIKey,
		timeout: cfg.Timeout,
		breaker: &breaker{now: time.Now},
		http: &http.Client{
			Transport: rt,
			// A redirect would turn the POST into a GET on another URL:
			// answer with the 3xx instead, a misconfiguration to retry.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		metrics: m,
	}
	if cfg.MaxConcurrency > 0 {
		c.slots = make(chan struct{}, cfg.MaxConcurrency)
	}
	if cfg.MaxRPS > 0 {
		c.limiter = rate.NewLimiter(rate.Limit(cfg.MaxRPS/rpsMargin), 1)
	}
	return c
}

// Concurrency is the most requests the client sends at once
// (MaxConcurrency); 0: no bound.
func (c *Client) Concurrency() int { return cap(c.slots) }

// Close releases idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

type chargeBody struct {
	OrderID    int64  `json:"orderId"`
	CustomerID int64  `json:"customerId"`
	Amount     int64  `json:"amount"`
	Currency   string `json:"currency"`
}

// connBuffer is the size of each provider connection's read and write
// buffers.
const connBuffer = 1 << 10

// maxAnswer bounds how much of an answer is read: a provider answer is small,
// and a misbehaving one must not exhaust memory.
const maxAnswer = 64 << 10

// Charge asks the provider to charge r. It returns the charge, or an error
// that wraps ErrDeclined, wraps ErrRejected, or is a *TransientError (one
// that wraps ErrCircuitOpen when the request was not even sent).
func (c *Client) Charge(ctx context.Context, r Request) (Charge, error) {
	release, err := c.turn(ctx)
	if err != nil {
		return Charge{}, transient("canceled", 0, err)
	}
	defer release()
	if r.Ready != nil {
		if err := r.Ready(); err != nil {
			return Charge{}, transient("not_sent", 0, fmt.Errorf("%w: %w", ErrNotSent, err))
		}
	}
	ok, probe := c.breaker.allow()
	if !ok {
		c.metrics.PaymentRequests.WithLabelValues("circuit_open").Inc()
		return Charge{}, transient("circuit_open", 0, ErrCircuitOpen)
	}
	started := time.Now()
	ch, result, err := c.charge(ctx, r)
	c.metrics.PaymentSeconds.Observe(time.Since(started).Seconds())
	c.metrics.PaymentRequests.WithLabelValues(result).Inc()
	var te *TransientError
	if result == "rate_limited" && errors.As(err, &te) && te.After > 0 {
		c.pause(te.After)
	}
	// A 409 says only that our own earlier request for this key is still
	// being processed: nothing about the provider's health.
	// Our own cancellation (a drain cut short) says nothing either.
	if probe || (result != "conflict" && ctx.Err() == nil) {
		c.breaker.done(healthy(result), probe)
	}
	return ch, err
}

// turn waits until a request may be sent: a free slot, no 429 pause in
// force, a token of the rate limit. It returns the function that frees the
// slot, or ctx's error.
func (c *Client) turn(ctx context.Context) (release func(), err error) {
	release = func() {}
	if c.slots != nil {
		select {
		case c.slots <- struct{}{}:
			release = func() { <-c.slots }
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	c.metrics.PaymentInFlight.Inc()
	done := release
	release = func() { c.metrics.PaymentInFlight.Dec(); done() }
	for {
		wait := time.Until(time.Unix(0, c.pausedUntil.Load()))
		if wait <= 0 {
			break
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			release()
			return nil, ctx.Err()
		}
	}
	if c.limiter != nil {
		if err := c.limiter.Wait(ctx); err != nil {
			release()
			return nil, err
		}
	}
	return release, nil
}

// pause holds every request back for d: the provider asked the client, not
// one caller, to slow down.
func (c *Client) pause(d time.Duration) {
	until := time.Now().Add(d).UnixNano()
	for {
		cur := c.pausedUntil.Load()
		if cur >= until || c.pausedUntil.CompareAndSwap(cur, until) {
			return
		}
	}
}

// healthy reports whether a result shows a working provider: it answered
// about the request itself.
func healthy(result string) bool {
	switch result {
	case "charged", "declined", "rejected", "conflict":
		return true
	}
	return false
}

func (c *Client) charge(ctx context.Context, r Request) (Charge, string, error) {
	// Integers and a validated three-letter code: marshalling cannot fail.
	body, _ := json.Marshal(chargeBody{OrderID: r.OrderID, CustomerID: r.CustomerID, Amount: r.Amount, Currency: r.Currency})
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return Charge{}, "client_error", transient("client_error", 0, fmt.Errorf("build request: %w", err))
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", r.IdempotencyKey)
	tracing.Propagator().Inject(ctx, propagation.HeaderCarrier(req.Header))
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}

	resp, err := c.http.Do(req)
	if err != nil {
		return Charge{}, networkResult(err), transient(networkResult(err), 0, err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return Charge{}, networkResult(err), transient(networkResult(err), 0, fmt.Errorf("read answer: %w", err))
	}

	switch code := resp.StatusCode; {
	case code == http.StatusOK || code == http.StatusCreated:
		var ch Charge
		if err := json.Unmarshal(answer, &ch); err != nil || ch.ID == "" || ch.Status != "succeeded" {
			// A success we cannot read is not a charge we can record;
			// asking again with the same key gets the stored answer.
			return Charge{}, "bad_response", transient("bad_response", 0, fmt.Errorf("unexpected answer %d %s", code, c.snippet(answer)))
		}
		return ch, "charged", nil
	case code == http.StatusPaymentRequired:
		return Charge{}, "declined", &DeclineError{Code: declineCode(answer), detail: c.snippet(answer)}
	case code == http.StatusUnprocessableEntity || code == http.StatusBadRequest:
		return Charge{}, "rejected", fmt.Errorf("%w: %d %s", ErrRejected, code, c.snippet(answer))
	case code == http.StatusConflict:
		// The same key is still being processed by the provider (our
		// previous attempt, whose answer we lost): ask again later.
		return Charge{}, "conflict", transient("conflict", 0, fmt.Errorf("409 request in progress"))
	case code == http.StatusTooManyRequests:
		return Charge{}, "rate_limited", transient("rate_limited", retryAfter(resp), fmt.Errorf("429 rate limited"))
	case code >= 500:
		return Charge{}, "server_error", transient("server_error", retryAfter(resp), fmt.Errorf("%d %s", code, c.snippet(answer)))
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		// Bad credentials are the environment's fault, not the event's:
		// hold the partition until an operator fixes PAYMENT_API_KEY.
		return Charge{}, "unauthorized", transient("unauthorized", 0, fmt.Errorf("%d check PAYMENT_API_KEY", code))
	default:
		return Charge{}, "client_error", transient("client_error", 0, fmt.Errorf("unexpected status %d %s", code, c.snippet(answer)))
	}
}

func transient(result string, after time.Duration, err error) *TransientError {
	return &TransientError{Result: result, After: after, Err: err}
}

func networkResult(err error) string {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return "timeout"
	}
	return "connection_error"
}

// retryAfter reads a Retry-After given in seconds; the HTTP-date form is
// ignored and the caller's own backoff applies.
func retryAfter(resp *http.Response) time.Duration {
	s, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || s <= 0 {
		return 0
	}
	return min(time.Duration(s)*time.Second, 5*time.Minute)
}

// snippet keeps error texts short and single-line: they end up in logs and
// dead-letter headers. It masks the API key, which a provider (or a proxy in
// front of it) may echo back in an error answer.
func (c *Client) snippet(b []byte) string {
	const limit = 200
	s := strings.Join(strings.Fields(string(b)), " ")
	if c.apiKey != "" {
		s = strings.ReplaceAll(s, c.apiKey, "xxxxx")
	}
	if len(s) > limit {
		s = s[:limit] + "…"
	}
	return s
}
