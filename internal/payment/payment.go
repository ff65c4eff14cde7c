// Package payment is billing's seam to the payment provider.
//
// billing's phases see a handful of outcome kinds (Outcome: succeeded,
// declined, rejected, in progress, indeterminate) and transient errors;
// what a provider's answer means is its Protocol's knowledge (packages
// contract, stripe). A Client wraps a Protocol with what every provider
// shares: at most so many requests in flight and per second (this
// process's, and its share of the account's when a fleet shares it), a
// pause after a 429, the operator's pause of charging, a circuit breaker,
// the metrics, the connections.
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
	// Wallet is the provider whose saved payment methods the requests
	// charge, the name payment_method keeps them under; "" for a
	// provider that charges by customer id (the contract).
	Wallet  string
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
	// AccountShared: the provider account's request budget is shared by
	// the replicas of a fleet (PAYMENT_ACCOUNT_MAX_RPS), and the client
	// sends nothing until it is given a share of it (SetAccountShare),
	// nor once its share's lease has lapsed. MaxRPS still caps it.
	AccountShared bool
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
// MaxConcurrency requests in flight and MaxRPS a second (and, with a shared
// account, its share of the account's budget), and after a 429 with
// Retry-After no request at all until that time has passed. A caller waits
// for its turn (or for its context to end) before its request is sent; a
// provider that keeps failing is left alone by the circuit breaker. While
// an operator has paused charging (SetPaused) no request that could create
// a payment is sent: it waits for the resume, unsent; lookups that only
// read go on.
type Client struct {
	proto   Protocol
	wallet  string
	timeout time.Duration
	http    *http.Client
	breaker *breaker
	metrics *metrics.Metrics

	slots chan struct{} // one per request in flight; nil: unbounded
	pacer *pacer
	// resolveSends: the protocol's lookup sends the payment request again
	// (Adyen's), so a lookup could create a payment and waits like a
	// charge while charging is paused.
	resolveSends bool
	// pausedUntil holds the UnixNano time before which no request is sent:
	// the provider's Retry-After of a 429, for every caller.
	pausedUntil atomic.Int64
	// limited counts the provider's 429s, charges' and lookups' alike.
	limited atomic.Uint64
}

// Resender is a Protocol whose Resolve sends the payment request again
// (Adyen has no lookup: its idempotency layer replays the answer, and a
// request it never received is a new payment). Such a lookup waits like a
// charge while charging is paused.
type Resender interface {
	ResolveResends() bool
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
			otelhttp.WithSpanNameFormatter(spanName))
	}
	c := &Client{
		proto:   proto,
		wallet:  cfg.Wallet,
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
	c.pacer = newPacer(cfg.MaxRPS, cfg.AccountShared)
	if r, ok := proto.(Resender); ok {
		c.resolveSends = r.ResolveResends()
	}
	return c
}

// SetAccountShare gives the client its share of the account's budget:
// rps requests a second, until until (from time.Now, so compared by the
// monotonic clock), past which it sends nothing until the next share.
// Without Config.AccountShared the share is not looked at.
func (c *Client) SetAccountShare(rps float64, until time.Time) { c.pacer.setShare(rps, until) }

// SetPaused pauses charging (true) or resumes it. While paused no request
// that could create a payment is sent: a charge waits for the resume
// without its slot, and one that was waiting for its turn is not sent but
// waits too; a request already sent is answered as usual. Lookups that
// only read go on.
func (c *Client) SetPaused(paused bool) { c.pacer.setPaused(paused) }

// Paused reports whether charging is paused.
func (c *Client) Paused() bool { return c.pacer.isPaused() }

// ResolveSends reports whether a lookup sends the payment request again
// (Resender), and so waits like a charge while charging is paused.
func (c *Client) ResolveSends() bool { return c.resolveSends }

// RateLimited is how many 429s the provider answered this client so far.
func (c *Client) RateLimited() uint64 { return c.limited.Load() }

// spanName names a provider request's span: a charge is the only request
// billing POSTs; lookups and listings read.
func spanName(_ string, r *http.Request) string {
	if r.Method == http.MethodPost {
		return "payment charge"
	}
	return "payment lookup"
}

// Concurrency is the most requests the client sends at once
// (MaxConcurrency); 0: no bound.
func (c *Client) Concurrency() int { return cap(c.slots) }

// Wallet is the provider whose saved payment methods the requests charge
// (Config.Wallet).
func (c *Client) Wallet() string { return c.wallet }

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
// the request was not even sent). While charging is paused it waits for
// the resume.
func (c *Client) Charge(ctx context.Context, r Request) (Outcome, error) {
	for {
		out, err := c.charge(ctx, r)
		// Paused while it waited for its turn: not sent; it waits for
		// the resume without its slot.
		if !errors.Is(err, errPaused) {
			return out, err
		}
	}
}

// charge is one turn of Charge.
func (c *Client) charge(ctx context.Context, r Request) (Outcome, error) {
	release, err := c.turn(ctx, true, r.Ready)
	if err != nil {
		return Outcome{}, err
	}
	defer release()
	ok, probe := c.breaker.allow()
	if !ok {
		c.metrics.PaymentRequests.WithLabelValues("circuit_open").Inc()
		return Outcome{}, Transient("circuit_open", 0, ErrCircuitOpen)
	}
	started := time.Now()
	last := r.Ready
	if r.Leave != nil {
		last = r.Leave
	}
	out, err := c.proto.Charge(ctx, doer{c: c, limit: maxAnswer, paced: true, creates: true, ready: last}, r)
	if u := unsentOf(err); u != nil {
		c.breaker.release(probe)
		return Outcome{}, u
	}
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
		c.breaker.record(healthy(result), probe)
	}
	return out, err
}

// Resolve asks the provider what became of the attempt l (Protocol.Resolve),
// within the client's limits: lookups count against the provider's rate
// limit like charges, each of their requests. The circuit breaker does not
// stand in its way: a lookup charges nothing, unless the protocol's lookup
// sends the payment again (Resender), which waits while charging is paused
// as a charge does.
func (c *Client) Resolve(ctx context.Context, l Lookup) (Outcome, error) {
	for {
		out, err := c.resolve(ctx, l)
		if !errors.Is(err, errPaused) {
			return out, err
		}
	}
}

// resolve is one turn of Resolve.
func (c *Client) resolve(ctx context.Context, l Lookup) (Outcome, error) {
	var ready func() error
	if c.resolveSends {
		ready = l.Ready
	}
	release, err := c.turn(ctx, c.resolveSends, ready)
	if err != nil {
		return Outcome{}, err
	}
	defer release()
	out, err := c.proto.Resolve(ctx, doer{c: c, limit: maxPage, paced: true, creates: c.resolveSends, ready: ready}, l)
	if u := unsentOf(err); u != nil {
		return Outcome{}, u
	}
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
	return c.proto.Charges(ctx, doer{c: c, limit: maxPage}, from, to)
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

// turn waits until a call may start: charging not paused, for one that
// creates (asking ready meanwhile), and a free slot. It returns the
// function that frees the slot, or a *TransientError: canceled (ctx ended)
// or not_sent (ready refused). Each of the call's requests then waits for
// its own turn to leave (doer.Do).
func (c *Client) turn(ctx context.Context, creates bool, ready func() error) (release func(), err error) {
	if creates {
		if err := c.pacer.resumed(ctx, ready); err != nil {
			return nil, err
		}
	}
	free := func() {}
	if c.slots != nil {
		select {
		case c.slots <- struct{}{}:
			free = func() { <-c.slots }
		case <-ctx.Done():
			return nil, Transient("canceled", 0, ctx.Err())
		}
	}
	c.metrics.PaymentInFlight.Inc()
	return func() { c.metrics.PaymentInFlight.Dec(); free() }, nil
}

// leave waits until one request may leave now: no 429 pause in force and
// the pacer's gap (the rate, the share; for one that creates, no pause of
// charging: errPaused). It returns ctx's error when ctx ends first.
func (c *Client) leave(ctx context.Context, creates bool) error {
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
			return ctx.Err()
		}
	}
	return c.pacer.wait(ctx, creates)
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
// read. A paced one waits for the request's turn to leave first (leave),
// and then, for one that creates, asks ready.
type doer struct {
	c       *Client
	limit   int64
	paced   bool
	creates bool
	ready   func() error
}

// unsent is the error of a request that was never sent: its wait for its
// turn ended (the caller's context, a pause of charging) or its Ready
// refused it. The call it belongs to counts no request.
type unsent struct{ err *TransientError }

func (u *unsent) Error() string { return u.err.Error() }
func (u *unsent) Unwrap() error { return u.err }

// unsentOf returns the *TransientError of a request that was never sent,
// nil for any other err.
func unsentOf(err error) error {
	var u *unsent
	if errors.As(err, &u) {
		return u.err
	}
	return nil
}

func (d doer) Do(req *http.Request) (Response, error) {
	if d.paced {
		if err := d.c.leave(req.Context(), d.creates); errors.Is(err, errPaused) {
			return Response{}, &unsent{Transient("paused", 0, err)}
		} else if err != nil {
			return Response{}, &unsent{Transient("canceled", 0, err)}
		}
		if d.ready != nil {
			if err := d.ready(); err != nil {
				return Response{}, &unsent{Transient("not_sent", 0, fmt.Errorf("%w: %w", ErrNotSent, err))}
			}
		}
	}
	ctx, cancel := context.WithTimeout(req.Context(), d.c.timeout)
	defer cancel()
	req = req.WithContext(ctx)
	tracing.Propagator().Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := d.c.http.Do(req)
	if err != nil {
		return Response{}, Transient(networkResult(err), 0, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusTooManyRequests {
		// What the fleet's budget shrinks by (internal/fleet), lookups'
		// too: they count against the same account.
		d.c.limited.Add(1)
		d.c.metrics.PaymentRateLimited.Inc()
	}
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
