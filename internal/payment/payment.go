// Package payment is billing's seam to the payment provider.
//
// billing's phases see a handful of outcome kinds (Outcome: succeeded,
// declined, rejected, in progress, indeterminate) and transient errors;
// what a provider's answer means is its Protocol's knowledge (packages
// contract, stripe). A Client wraps a Protocol with what every provider
// shares: at most so many requests in flight and per second, a pause after
// a 429, a circuit breaker, the metrics, the connections.
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
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
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

// ErrNotSent: the request had its turn but its Ready refused it; the
// provider never saw it.
var ErrNotSent = errors.New("payment request not sent: its caller no longer wants it")

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

// Transient returns a *TransientError counted under result.
func Transient(result string, after time.Duration, err error) *TransientError {
	return &TransientError{Result: result, After: after, Err: err}
}

// Config configures a Client.
type Config struct {
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

// Client calls the provider through its Protocol.
//
// It stays inside what the provider allows, for the whole process: at most
// MaxConcurrency requests in flight and MaxRPS a second, and after a 429
// with Retry-After no request at all until that time has passed. A caller
// waits for its turn (or for its context to end) before its request is
// sent; a provider that keeps failing is left alone by the circuit breaker.
type Client struct {
	proto   Protocol
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

// New returns a client that speaks proto within cfg's limits.
func New(proto Protocol, cfg Config, m *metrics.Metrics) *Client {
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
	// the transport only when spans are recorded. Either way do puts the
	// caller's traceparent on the request.
	var rt http.RoundTripper = transport
	if _, off := cfg.TracerProvider.(noop.TracerProvider); cfg.TracerProvider != nil && !off {
		rt = otelhttp.NewTransport(transport,
			otelhttp.WithTracerProvider(cfg.TracerProvider), otelhttp.WithPropagators(tracing.Propagator()),
			otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return "payment " + r.Method }))
	}
	c := &Client{
		proto:   proto,
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

// connBuffer is the size of each provider connection's read and write
// buffers.
const connBuffer = 1 << 10

// maxAnswer bounds how much of a charge's answer is read: a provider answer
// is small, and a misbehaving one must not exhaust memory; maxPage bounds a
// lookup's or a listing's (a page of 100 payments is ~30 KB).
const (
	maxAnswer = 64 << 10
	maxPage   = 32 << 20
)

// Charge asks the provider to charge r. It returns the provider's outcome,
// or a *TransientError (one that wraps ErrCircuitOpen or ErrNotSent when
// the request was not even sent).
func (c *Client) Charge(ctx context.Context, r Request) (Outcome, error) {
	release, err := c.turn(ctx)
	if err != nil {
		return Outcome{}, Transient("canceled", 0, err)
	}
	defer release()
	if r.Ready != nil {
		if err := r.Ready(); err != nil {
			return Outcome{}, Transient("not_sent", 0, fmt.Errorf("%w: %w", ErrNotSent, err))
		}
	}
	ok, probe := c.breaker.allow()
	if !ok {
		c.metrics.PaymentRequests.WithLabelValues("circuit_open").Inc()
		return Outcome{}, Transient("circuit_open", 0, ErrCircuitOpen)
	}
	started := time.Now()
	out, err := c.proto.Charge(ctx, doer{c, maxAnswer}, r)
	c.metrics.PaymentSeconds.Observe(time.Since(started).Seconds())
	result := resultOf(out, err)
	c.metrics.PaymentRequests.WithLabelValues(result).Inc()
	if out.Replayed {
		c.metrics.PaymentReplays.Inc()
	}
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
	return out, err
}

// Resolve asks the provider what became of the attempt l (Protocol.Resolve),
// within the client's limits: lookups count against the provider's rate
// limit like charges. The circuit breaker does not stand in its way: a
// lookup charges nothing.
func (c *Client) Resolve(ctx context.Context, l Lookup) (Outcome, error) {
	release, err := c.turn(ctx)
	if err != nil {
		return Outcome{}, err
	}
	defer release()
	out, err := c.proto.Resolve(ctx, doer{c, maxPage}, l)
	result := out.Kind.String()
	if err != nil {
		result = "error"
	}
	c.metrics.PaymentLookups.WithLabelValues(result).Inc()
	return out, err
}

// Charges lists every payment the provider created in [from, to)
// (Protocol.Charges). Listing is for reconciliation, an operator's batch
// job: it takes none of the charging requests' slots or rate budget, and no
// circuit breaker stands in its way.
func (c *Client) Charges(ctx context.Context, from, to time.Time) ([]ListedCharge, error) {
	return c.proto.Charges(ctx, doer{c, maxPage}, from, to)
}

// resultOf is the billing_payment_requests_total label of a charge's answer.
func resultOf(out Outcome, err error) string {
	var te *TransientError
	switch {
	case errors.As(err, &te):
		return te.Result
	case err != nil:
		return "client_error"
	case out.Kind == Succeeded:
		return "charged"
	}
	return out.Kind.String()
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
	case "charged", "declined", "rejected", "conflict", "in_progress":
		return true
	}
	return false
}

// doer is the Client's Doer: one exchange within the client's timeout, the
// caller's traceparent on the request, at most limit bytes of the answer
// read.
type doer struct {
	c     *Client
	limit int64
}

func (d doer) Do(req *http.Request) (Response, error) {
	ctx, cancel := context.WithTimeout(req.Context(), d.c.timeout)
	defer cancel()
	req = req.WithContext(ctx)
	tracing.Propagator().Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := d.c.http.Do(req)
	if err != nil {
		return Response{}, Transient(networkResult(err), 0, err)
	}
	defer resp.Body.Close()
	// Read no further than limit: what a longer answer says is judged by
	// its start (a truncated document does not decode).
	body, err := io.ReadAll(io.LimitReader(resp.Body, d.limit))
	if err != nil {
		return Response{}, Transient(networkResult(err), 0, fmt.Errorf("read answer: %w", err))
	}
	return Response{Status: resp.StatusCode, Header: resp.Header, Body: body}, nil
}

func networkResult(err error) string {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return "timeout"
	}
	return "connection_error"
}

// RetryAfter reads a Retry-After given in seconds, at most 5 minutes; the
// HTTP-date form is ignored and the caller's own backoff applies.
func RetryAfter(h http.Header) time.Duration {
	s, err := strconv.Atoi(h.Get("Retry-After"))
	if err != nil || s <= 0 {
		return 0
	}
	return min(time.Duration(s)*time.Second, 5*time.Minute)
}
