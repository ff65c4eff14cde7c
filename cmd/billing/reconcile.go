package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"example.com/billing/internal/config"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/notified"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/reconcile"
)

const reconcileHelp = `
Compares the charge table with the payment provider's records of a time
window and reports every charge missing on either side, and every charge
the two sides record with a different order, customer, amount, currency,
status or provider charge id. Deduplication prevents double charges;
reconciliation catches loss.

Charges are matched by idempotency key (the event id). A row or provider
charge belongs to the window by its own time (the row's created_at, the
provider's created); its counterpart is looked up outside the window too,
in the database by key and at the provider within --slack, before it is
called missing. Declined and rejected rows are not expected at the
provider. A pending row (an attempt whose answer is not recorded; serve
and billing maintain complete them) is reported with the provider's charge
if it has one: past PAYMENT_IDEMPOTENCY_WINDOW it is never retried and
needs a human.

Adyen (PAYMENT_PROVIDER=adyen) has no API that lists payments: its side
is the AUTHORISATION notifications serve verified and kept (table
notified_payment), each payment's verdict, amount, currency and
pspReference as Adyen signed them; Adyen is not asked. A row succeeded
whose authorisation was never notified (the webhook endpoint refused or
unreachable for longer than Adyen retries) shows as missing at the
provider; an authorisation notified for a row billing recorded otherwise,
or for no row, as a mismatch or missing in the database. It cannot tell
what became of the money after the authorisation (captures, refunds,
chargebacks): that is in Adyen's settlement reports.

Exits 0 when both sides agree, 2 when they differ, 1 when it could not
run; the report is on stdout either way.`

// exitDiscrepancies is the exit status of a reconciliation that found
// discrepancies, distinct from 1 (it could not run) so that a CronJob or a
// script can tell "look at the report" from "fix the job".
const exitDiscrepancies = 2

// exitError carries an exit status for main, through ExitCode.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// ExitCode is the process exit status main should use.
func (e *exitError) ExitCode() int { return e.code }

// reconcileConfig is what reconcile reads from the environment: the
// database and the provider, as serve reads them.
type reconcileConfig struct {
	Database config.Database
	Payment  config.Payment
	Log      config.Log
}

func (c *reconcileConfig) Validate() error {
	return errors.Join(c.Database.Validate(), c.Payment.Validate(), c.Log.Validate())
}

// reconcileCmd compares the charge table with the provider's charges.
func reconcileCmd(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	var cfg reconcileConfig
	fs := newFlagSet("reconcile", about{synopsis: "[flags]", description: reconcileHelp, env: &cfg,
		example: "DATABASE_URL=... PAYMENT_BASE_URL=https://psp.example.com PAYMENT_API_KEY=sk_live_... billing reconcile --from 2026-01-01T00:00:00Z --format json"})
	fromFlag := fs.String("from", "", "start of the window, RFC 3339 (default: --to minus 24h)")
	toFlag := fs.String("to", "", "end of the window, exclusive, RFC 3339 (default: now minus --settle)")
	settle := fs.Duration("settle", 5*time.Minute,
		"margin before now left out of the default window: charges in flight there have a provider side and no committed row yet")
	slack := fs.Duration("slack", time.Hour,
		"how far outside the window the provider is searched for a row's charge (a charge made, its answer lost, and recorded after a retry is recorded later than it was made)")
	format := fs.String("format", "text", "output format: text or json")
	if help, err := parseSubcommandFlags(fs, args, stdout); help || err != nil {
		return err
	}
	if *format != "text" && *format != "json" {
		return fmt.Errorf("reconcile: --format must be text or json, got %q", *format)
	}
	if *settle < 0 || *slack < 0 {
		return fmt.Errorf("reconcile: --settle and --slack must not be negative")
	}
	win, err := reconcileWindow(*fromFlag, *toFlag, *settle, time.Now())
	if err != nil {
		return err
	}

	if err := config.Load(environ, &cfg); err != nil {
		return err
	}
	log := newLogger(stderr, cfg.Log)
	if settled := time.Now().Add(-*settle); win.To.After(settled) {
		log.Warn("the window ends less than --settle ago: a charge still in flight shows as missing in the database",
			"to", win.To, "settle", settle.String())
	}
	db, err := postgres.Open(cfg.Database.URL, 2)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer db.Close()
	var ledger reconcile.Ledger
	if cfg.Payment.Provider == config.ProviderAdyen {
		log.Info("Adyen has no API that lists payments: its side is the AUTHORISATION notifications billing kept (notified_payment)")
		ledger = notified.NewStore(db, cfg.Payment.Provider)
	} else {
		client := newPayer(cfg.Payment.API(), false, nil, metrics.New(prometheus.NewRegistry()))
		defer client.Close()
		ledger = client
	}

	rep, err := reconcile.Reconcile(ctx, reconcile.NewStore(db), ledger, win, reconcile.Options{Slack: *slack})
	if err != nil {
		if postgres.IsConfigError(err) {
			return fmt.Errorf("reconcile: DATABASE_URL: %w", err)
		}
		return fmt.Errorf("reconcile: %w", err)
	}
	write := reconcile.WriteText
	if *format == "json" {
		write = reconcile.WriteJSON
	}
	if err := write(stdout, rep); err != nil {
		return fmt.Errorf("reconcile: write report: %w", err)
	}
	s := rep.Summary
	log.Info("reconciled", "from", win.From, "to", win.To, "matched", s.Matched, "declined", s.Declined,
		"missing_at_provider", s.MissingAtProvider, "missing_in_db", s.MissingInDB, "mismatched", s.Mismatched)
	if n := s.Discrepancies(); n > 0 {
		return &exitError{code: exitDiscrepancies, err: fmt.Errorf(
			"reconcile: %d discrepancies (%d missing at the provider, %d missing in the database, %d mismatched); see the report",
			n, s.MissingAtProvider, s.MissingInDB, s.Mismatched)}
	}
	return nil
}

// reconcileWindow resolves the flags: by default the 24 hours that end
// settle before now.
func reconcileWindow(fromFlag, toFlag string, settle time.Duration, now time.Time) (reconcile.Window, error) {
	w := reconcile.Window{To: now.Add(-settle).UTC()}
	if toFlag != "" {
		t, err := time.Parse(time.RFC3339, toFlag)
		if err != nil {
			return w, fmt.Errorf("reconcile: --to: %q is not an RFC 3339 time", toFlag)
		}
		w.To = t.UTC()
	}
	w.From = w.To.Add(-24 * time.Hour)
	if fromFlag != "" {
		t, err := time.Parse(time.RFC3339, fromFlag)
		if err != nil {
			return w, fmt.Errorf("reconcile: --from: %q is not an RFC 3339 time", fromFlag)
		}
		w.From = t.UTC()
	}
	if err := w.Validate(); err != nil {
		return w, fmt.Errorf("reconcile: %w", err)
	}
	return w, nil
}
