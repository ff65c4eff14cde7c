//go:build dev

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"example.com/billing/internal/config"
	"example.com/billing/internal/dev/fakepsp"
)

const fakepspHelp = `
Serves a fake payment provider for local runs, with Stripe-like idempotency
(Idempotency-Key) and faults to inject. Point billing at it with
PAYMENT_BASE_URL=http://<addr>, and at the provider it speaks
(--profile):

  contract  billing's own contract: POST /v1/charges (JSON); with
            --processing-every, some answers are 202 "processing" and the
            verdict comes later, by webhook and by
            GET /v1/charges?idempotency_key=<key>
  stripe    Stripe's PaymentIntents: POST /v1/payment_intents
            (form-encoded, confirm=true, off_session=true), outcomes
            chosen by payment method (pm_card_visa succeeds,
            pm_card_chargeDeclined declines, pm_fakeDebit_success is
            processing then succeeds, ...), stored 500s, and the lookups
            GET /v1/payment_intents/{id}, /v1/payment_intents (list) and
            /v1/payment_intents/search (metadata, lagging --search-lag)
  adyen     Adyen's Checkout API: POST /payments under the version's root
            (PAYMENT_BASE_URL=http://<addr>/v71), a stored card, X-API-Key;
            outcomes chosen by storedPaymentMethodId (any id is
            Authorised, stored_refused and stored_notEnoughBalance are
            Refused, stored_pending is Pending then Authorised, ...), the
            stored first answer replayed under a key, 704 while in flight;
            no lookup and no list, as at Adyen

With --webhook-url, outcomes are also posted there, signed with
PAYMENT_WEBHOOK_SECRET (Stripe-Signature, the contract's Signature, or
Adyen's HMAC of each item with the hex key), and retried until answered
2xx (Adyen: until [accepted]; its items go in batches, those ready within
--webhook-batch-wait together); the --webhook-* rates inject faults.
The package documentation of internal/dev/fakepsp tells every rule.

Besides the provider's routes it serves, for tests and for looking around:
  GET /_payments    every payment, either profile, as it stands
  GET /_stats       what it did (requests, charges, declines, replays,
                    webhooks, lookups, pendingWebhooks, ...)
  GET /v1/charges   every succeeded charge of the contract profile
  POST /_down, /_up switch it off and on; GET/PUT /_faults change the
                    options (the secrets are never shown)

The API key and the webhook secret are read from the environment (never
flags, as flags show in ps).

Runs until SIGINT or SIGTERM.`

// fakepspConfig is what fakepsp reads from the environment.
type fakepspConfig struct {
	APIKey        string `env:"PAYMENT_API_KEY" help:"when set, POST /v1/charges (contract) and every /v1 route (stripe) require Authorization: Bearer <key>, and POST /payments (adyen) X-API-Key: <key>, as billing sends it"`
	WebhookSecret string `env:"PAYMENT_WEBHOOK_SECRET" help:"signs the webhooks (HMAC-SHA256); comma-separated, each secret adds a v1 signature, as while one is rolled (adyen: hex keys, the first signs); required with --webhook-url"`
	// MerchantAccount is the one billing charges for: the fake refuses
	// others, as Adyen refuses an account the API key is not for.
	MerchantAccount string `env:"ADYEN_MERCHANT_ACCOUNT" help:"adyen: when set, the only merchantAccount POST /payments takes (403 errorCode 901 otherwise)"`
}

// Validate accepts any key and any secret.
func (c *fakepspConfig) Validate() error { return nil }

// fakepspCmd serves the fake payment provider until ctx is done.
func fakepspCmd(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	var cfg fakepspConfig
	fs := newFlagSet("fakepsp", about{synopsis: "[flags]", description: fakepspHelp, env: &cfg,
		example: "billing fakepsp --decline-every 20 --latency 50ms --fail-rate 0.1\n" +
			"  PAYMENT_WEBHOOK_SECRET=whsec_dev billing fakepsp --profile stripe --webhook-url http://127.0.0.1:8090/webhooks/stripe --stored-500-rate 0.05\n" +
			"  PAYMENT_WEBHOOK_SECRET=44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056 billing fakepsp --profile adyen --webhook-url http://127.0.0.1:8090/webhooks/adyen"})
	addr := fs.String("addr", "127.0.0.1:8081", "address to listen on")
	var opts fakepsp.Options
	fs.StringVar(&opts.Profile, "profile", fakepsp.ProfileContract, "the provider's API: contract, stripe or adyen")
	fs.DurationVar(&opts.Latency, "latency", 0, "added to every charge request before it is answered")
	fs.Float64Var(&opts.FailRate, "fail-rate", 0, "probability of answering 503 without doing anything, in [0, 1]")
	fs.Float64Var(&opts.ResetRate, "reset-rate", 0, "probability of charging and then resetting the connection without answering, in [0, 1]")
	fs.Int64Var(&opts.DeclineEvery, "decline-every", 0, "contract: decline (402) orders whose id is a multiple of this; 0 never declines (stripe declines by payment method)")
	fs.IntVar(&opts.RateLimit, "rate-limit", 0, "answer 429 beyond this many requests a second (contract: with Retry-After: 1; stripe: without); 0 is unlimited")
	fs.Int64Var(&opts.Seed, "seed", 1, "seed of the fault randomness, so that runs replay")
	fs.Int64Var(&opts.ProcessingEvery, "processing-every", 0, "contract: answer 202 processing to orders whose id is a multiple of this, decided later; 0 never")
	fs.DurationVar(&opts.ProcessingDelay, "processing-delay", 2*time.Second, "how long a processing payment (contract, stripe debit, adyen Pending or Received) waits for its verdict")
	fs.DurationVar(&opts.IdempotencyTTL, "idempotency-ttl", 0, "how long an answer is kept under its Idempotency-Key; a key used again later is new; 0: the provider's (24h contract and stripe, 744h adyen)")
	fs.StringVar(&opts.StripeVersion, "stripe-version", "", "stripe: the only Stripe-Version accepted (400 otherwise) and the events' api_version; empty accepts any")
	fs.Float64Var(&opts.Stored500Rate, "stored-500-rate", 0, "stripe: probability that a new key's answer is a stored 500 while its PaymentIntent is created anyway, in [0, 1]")
	fs.Float64Var(&opts.Stored500DropRate, "stored-500-drop-rate", 0, "stripe: probability that an event of a PaymentIntent answered with a stored 500 is never sent, in [0, 1]")
	fs.DurationVar(&opts.SearchLag, "search-lag", fakepsp.DefaultSearchLag, "stripe: how long after its creation a PaymentIntent appears in search results")
	fs.StringVar(&opts.WebhookURL, "webhook-url", "", "where to post the webhooks (e.g. billing's http://127.0.0.1:8090/webhooks/stripe); none are sent when empty")
	fs.DurationVar(&opts.WebhookDelayMin, "webhook-delay-min", 0, "least delay before a webhook is first sent")
	fs.DurationVar(&opts.WebhookDelayMax, "webhook-delay-max", 0, "greatest delay before a webhook is first sent (drawn uniformly from the minimum)")
	fs.DurationVar(&opts.WebhookRetryMax, "webhook-retry-max", fakepsp.DefaultWebhookRetryMax, "longest pause between two tries of a webhook not answered 2xx (from 100ms, doubling)")
	fs.Float64Var(&opts.WebhookRepeatRate, "webhook-repeat-rate", 0, "probability that a delivered webhook is delivered once more, in [0, 1]")
	fs.Float64Var(&opts.WebhookForgeRate, "webhook-forge-rate", 0, "probability that a forged copy (bad signature, half of them claiming the opposite outcome) is posted too, in [0, 1]")
	fs.Float64Var(&opts.WebhookStaleRate, "webhook-stale-rate", 0, "probability that a copy signed ten minutes ago is posted too, in [0, 1]")
	fs.Float64Var(&opts.WebhookDropRate, "webhook-drop-rate", 0, "probability that a webhook is never sent, in [0, 1] (adyen: the notification of a verdict the answer gave)")
	fs.Float64Var(&opts.PendingDropRate, "pending-drop-rate", 0, "adyen: probability that the notification of a payment answered Pending or Received is never sent, in [0, 1]")
	fs.DurationVar(&opts.WebhookBatchWait, "webhook-batch-wait", fakepsp.DefaultWebhookBatchWait, "adyen: how long the first notification item ready waits for others to join its batch (at most six items)")
	if help, err := parseSubcommandFlags(fs, args, stdout); help || err != nil {
		return err
	}
	if err := opts.Validate(); err != nil {
		return fmt.Errorf("fakepsp: bad flag: %w", err)
	}
	if err := config.Load(environ, &cfg); err != nil {
		return err
	}
	opts.APIKey, opts.WebhookSecret, opts.AdyenMerchantAccount = cfg.APIKey, cfg.WebhookSecret, cfg.MerchantAccount
	if err := opts.Validate(); err != nil {
		// The secret is the environment's: Validate checks that Adyen's
		// keys are hex, never showing them.
		return fmt.Errorf("fakepsp: PAYMENT_WEBHOOK_SECRET: %w", err)
	}
	if err := checkWebhookURL(opts); err != nil {
		return fmt.Errorf("fakepsp: %w", err)
	}

	psp, err := startFakePSP(*addr, opts)
	if err != nil {
		return err
	}
	auth := "no API key required"
	if opts.APIKey != "" {
		auth = "API key from PAYMENT_API_KEY required"
	}
	webhooks := "no webhooks"
	if opts.WebhookURL != "" {
		webhooks = "webhooks to " + opts.WebhookURL
	}
	fmt.Fprintf(stdout, "fakepsp listening on %s (profile %s, %s, %s); stats at %s/_stats\n", psp.URL, opts.Profile, auth, webhooks, psp.URL)
	select {
	case <-ctx.Done():
	case err := <-psp.failed:
		_ = psp.Close()
		return fmt.Errorf("fakepsp: serve: %w", err)
	}
	fmt.Fprintln(stderr, "fakepsp stopping")
	return psp.Close()
}

// checkWebhookURL refuses a webhook URL that is not http(s), or one
// without a secret to sign with: every receiver would refuse the
// webhooks, and the fake would retry them for ever.
func checkWebhookURL(opts fakepsp.Options) error {
	if opts.WebhookURL == "" {
		return nil
	}
	u, err := url.Parse(opts.WebhookURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("--webhook-url %q is not an http(s) URL", opts.WebhookURL)
	}
	if strings.TrimSpace(opts.WebhookSecret) == "" {
		return errors.New("--webhook-url needs PAYMENT_WEBHOOK_SECRET to sign the webhooks")
	}
	return nil
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

// Close stops serving, waiting a little for requests in flight, then stops
// the provider's own work (verdicts to come, webhooks to send).
func (p *runningPSP) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := p.srv.Shutdown(ctx)
	// Closed even when the shutdown timed out, so that no webhook is sent
	// after the command returns.
	_ = p.Server.Close()
	if err != nil {
		return fmt.Errorf("fakepsp: shutdown: %w", err)
	}
	return nil
}
