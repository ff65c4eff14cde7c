package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"example.com/billing/internal/config"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/wallet"
)

const paymentMethodsUsage = `Usage: billing payment-methods <command> [flags]

Commands:
  import   upsert which saved payment method pays for each customer (CSV on standard input)

billing payment-methods import -h describes it.
`

// paymentMethodsCmd dispatches the payment_method table's commands.
func paymentMethodsCmd(ctx context.Context, args []string, environ map[string]string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, paymentMethodsUsage)
		return errors.New("payment-methods: a command is required")
	}
	switch args[0] {
	case "import":
		return importPaymentMethods(ctx, args[1:], environ, stdin, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, paymentMethodsUsage)
		return nil
	}
	fmt.Fprint(stderr, paymentMethodsUsage)
	return fmt.Errorf("payment-methods: unknown command %q", args[0])
}

const importHelp = `
Reads CSV from standard input, with the header
customer_id,customer_ref,payment_method_ref, and upserts each row as the
saved payment method that pays for the customer at PAYMENT_PROVIDER
(Stripe: cus_... and pm_...; Adyen: the shopperReference and the stored
card's storedPaymentMethodId). Quoted fields (RFC 4180) and CRLF or LF line
ends are read. Every row is checked first: one bad row (not a positive
customer id, an empty or malformed reference, a customer twice) aborts the
whole import, naming its line, and nothing is written. The rows are written
in one transaction. Prints {"provider":..., "imported":n} on success.

An event whose customer had no payment method was parked no-payment-method;
replay it (billing dlq replay --code no-payment-method) once its method
is imported, and it is charged with it.

An import changes which card pays: before it writes, it records who
(--by), why (--reason, required) and what (the provider, the rows, the
input's SHA-256) in operator_action; when the record fails, nothing is
imported. billing audit lists the imports.`

// importRecord is what an import records in operator_action before it
// writes: which provider's methods, how many rows, and the SHA-256 of the
// CSV read, which tells the file that was imported.
type importRecord struct {
	Provider string `json:"provider"`
	Rows     int    `json:"rows"`
	SHA256   string `json:"sha256"`
}

// importPaymentMethods runs billing payment-methods import.
func importPaymentMethods(ctx context.Context, args []string, environ map[string]string, stdin io.Reader, stdout, stderr io.Writer) error {
	var cfg config.PaymentMethods
	fs := newFlagSet("payment-methods import", about{description: importHelp, env: &cfg,
		example: `PAYMENT_PROVIDER=stripe DATABASE_URL='postgres://billing:secret@db:5432/billing?sslmode=verify-full' billing payment-methods import --reason "CHG-7: cards of the migrated customers" < methods.csv`})
	op := operatorFlags(fs, "payment-methods import")
	if help, err := parseSubcommandFlags(fs, args, stdout); help || err != nil {
		return err
	}
	if err := op.check(); err != nil {
		return err
	}
	if err := config.Load(environ, &cfg); err != nil {
		return err
	}
	log := newLogger(stderr, cfg.Log)
	sum := sha256.New()
	methods, err := wallet.Read(io.TeeReader(stdin, sum))
	if err != nil {
		return fmt.Errorf("payment-methods import: nothing imported: %w", err)
	}
	db, err := postgres.Open(cfg.Database.URL, 1)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer db.Close()
	action, err := op.record(ctx, db, cfg.Provider, importRecord{Provider: cfg.Provider, Rows: len(methods), SHA256: hex.EncodeToString(sum.Sum(nil))})
	if err != nil {
		if postgres.IsConfigError(err) {
			return fmt.Errorf("DATABASE_URL: %w", err)
		}
		return fmt.Errorf("payment-methods import: nothing imported: %w", err)
	}
	log.Info("operator action recorded", "action", action.ID, "by", action.By, "reason", action.Reason)
	if err := wallet.Save(ctx, db, cfg.Provider, methods); err != nil {
		if postgres.IsConfigError(err) {
			return fmt.Errorf("DATABASE_URL: %w", err)
		}
		return fmt.Errorf("payment-methods import: nothing imported: %w", err)
	}
	log.Info("payment methods imported", "provider", cfg.Provider, "rows", len(methods))
	return json.NewEncoder(stdout).Encode(struct {
		Provider string `json:"provider"`
		Imported int    `json:"imported"`
	}{cfg.Provider, len(methods)})
}
