package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"example.com/billing/internal/config"
	"example.com/billing/internal/dev/fakepsp"
)

const fakepspHelp = `
Serves a fake payment provider for local runs: POST /v1/charges with
Stripe-like idempotency (Idempotency-Key), and faults to inject. Point
billing at it with PAYMENT_BASE_URL=http://<addr>.

Besides the charge call it serves, for tests and for looking around:
  GET /v1/charges   every charge created
  GET /_stats       what it did (requests, charges, declines, replays, ...)
  POST /_down, /_up switch it off and on; GET/PUT /_faults change the faults

The API key is read from the environment (never a flag, as flags show in
ps).

Runs until SIGINT or SIGTERM.`

// fakepspConfig is what fakepsp reads from the environment.
type fakepspConfig struct {
	APIKey string `env:"PAYMENT_API_KEY" help:"when set, POST /v1/charges requires Authorization: Bearer <key>, as billing sends it"`
}

// Validate accepts any key.
func (c *fakepspConfig) Validate() error { return nil }

// fakepspCmd serves the fake payment provider until ctx is done.
func fakepspCmd(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	var cfg fakepspConfig
	fs := newFlagSet("fakepsp", about{synopsis: "[flags]", description: fakepspHelp, env: &cfg,
		example: "billing fakepsp --decline-every 20 --latency 50ms --fail-rate 0.1"})
	addr := fs.String("addr", "127.0.0.1:8081", "address to listen on")
	var opts fakepsp.Options
	fs.DurationVar(&opts.Latency, "latency", 0, "added to every charge request before it is answered")
	fs.Float64Var(&opts.FailRate, "fail-rate", 0, "probability of answering 503 without doing anything, in [0, 1]")
	fs.Float64Var(&opts.ResetRate, "reset-rate", 0, "probability of charging and then resetting the connection without answering, in [0, 1]")
	fs.Int64Var(&opts.DeclineEvery, "decline-every", 0, "decline (402) orders whose id is a multiple of this; 0 never declines")
	fs.IntVar(&opts.RateLimit, "rate-limit", 0, "answer 429 (Retry-After: 1) beyond this many requests a second; 0 is unlimited")
	fs.Int64Var(&opts.Seed, "seed", 1, "seed of the fault randomness, so that runs replay")
	if help, err := parseSubcommandFlags(fs, args, stdout); help || err != nil {
		return err
	}
	if err := opts.Validate(); err != nil {
		return fmt.Errorf("fakepsp: bad flag: %w", err)
	}
	if err := config.Load(environ, &cfg); err != nil {
		return err
	}
	opts.APIKey = cfg.APIKey

	psp, err := startFakePSP(*addr, opts)
	if err != nil {
		return err
	}
	auth := "no API key required"
	if opts.APIKey != "" {
		auth = "API key from PAYMENT_API_KEY required"
	}
	fmt.Fprintf(stdout, "fakepsp listening on %s (%s); stats at %s/_stats\n", psp.URL, auth, psp.URL)
	select {
	case <-ctx.Done():
	case err := <-psp.failed:
		return fmt.Errorf("fakepsp: serve: %w", err)
	}
	fmt.Fprintln(stderr, "fakepsp stopping")
	return psp.Close()
}

// runningPSP is a fake provider served over HTTP.
type runningPSP struct {
	*fakepsp.Server
	URL string
	srv *http.Server
	// failed receives the error of a server that stopped on its own.
	failed chan error
}

// startFakePSP serves a fake provider with opts on addr (":0" style
// addresses pick a free port).
func startFakePSP(addr string, opts fakepsp.Options) (*runningPSP, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("fakepsp: listen: %w", err)
	}
	psp := fakepsp.New(opts)
	srv := &http.Server{Handler: psp, ReadHeaderTimeout: 5 * time.Second}
	p := &runningPSP{Server: psp, URL: "http://" + ln.Addr().String(), srv: srv, failed: make(chan error, 1)}
	go func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			p.failed <- err
		}
	}()
	return p, nil
}

// Close stops serving, waiting a little for requests in flight.
func (p *runningPSP) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.srv.Shutdown(ctx); err != nil {
		return fmt.Errorf("fakepsp: shutdown: %w", err)
	}
	return nil
}
