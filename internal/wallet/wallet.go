// Package wallet knows which saved payment method pays for each customer at
// a provider: the payment_method table. The order event carries only a
// customer id; Stripe charges a customer's saved card (cus_, pm_), Adyen a
// shopper's stored payment method (shopperReference,
// storedPaymentMethodId). The claim reads it for every new attempt, and
// `billing payment-methods import` fills it.
package wallet

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"example.com/billing/internal/postgres"
)

// Method is a customer's saved payment method at a provider.
type Method struct {
	CustomerID       int64  `db:"customer_id"`
	CustomerRef      string `db:"customer_ref"`
	PaymentMethodRef string `db:"payment_method_ref"`
}

// Lookup returns the saved payment methods of customerIDs at provider;
// a customer without one is absent.
func Lookup(ctx context.Context, q sqlx.QueryerContext, provider string, customerIDs []int64) (map[int64]Method, error) {
	const stmt = `
SELECT customer_id, customer_ref, payment_method_ref FROM payment_method
WHERE provider = $1 AND customer_id = ANY($2::int8[])`
	var rows []Method
	if err := sqlx.SelectContext(ctx, q, &rows, stmt, provider, pq.Int64Array(customerIDs)); err != nil {
		return nil, fmt.Errorf("read payment_method: %w", err)
	}
	out := make(map[int64]Method, len(rows))
	for _, m := range rows {
		out[m.CustomerID] = m
	}
	return out, nil
}

// Header is the first line an import's CSV must have.
var Header = []string{"customer_id", "customer_ref", "payment_method_ref"}

// maxRef bounds a reference: providers' ids are tens of characters
// (Adyen's shopperReference at most 256).
const maxRef = 256

// Read reads an import's CSV (RFC 4180: quoted fields, CRLF or LF line
// ends) and checks every row: a header of Header's columns, a positive
// customer id, references of printable characters without spaces, no
// customer twice. The first bad row fails the whole file, named by its
// line.
func Read(r io.Reader) ([]Method, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = len(Header)
	cr.ReuseRecord = true
	head, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil, errors.New("line 1: empty input, want the header " + strings.Join(Header, ","))
	}
	if err != nil {
		return nil, fmt.Errorf("line 1: %w", err)
	}
	for i, h := range head {
		if strings.TrimSpace(strings.TrimPrefix(h, "\ufeff")) != Header[i] {
			return nil, fmt.Errorf("line 1: header %q, want %s", strings.Join(head, ","), strings.Join(Header, ","))
		}
	}
	var out []Method
	seen := map[int64]int{}
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		line, _ := cr.FieldPos(0)
		if err != nil {
			return nil, err // csv.ParseError names its line
		}
		m, err := parse(rec)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if first, dup := seen[m.CustomerID]; dup {
			return nil, fmt.Errorf("line %d: customer %d again (first on line %d)", line, m.CustomerID, first)
		}
		seen[m.CustomerID] = line
		out = append(out, m)
	}
}

func parse(rec []string) (Method, error) {
	id, err := strconv.ParseInt(strings.TrimSpace(rec[0]), 10, 64)
	if err != nil || id <= 0 {
		return Method{}, fmt.Errorf("customer_id %q is not a positive integer", rec[0])
	}
	m := Method{CustomerID: id, CustomerRef: strings.TrimSpace(rec[1]), PaymentMethodRef: strings.TrimSpace(rec[2])}
	for _, f := range []struct{ name, v string }{{"customer_ref", m.CustomerRef}, {"payment_method_ref", m.PaymentMethodRef}} {
		if err := checkRef(f.v); err != nil {
			return Method{}, fmt.Errorf("%s %q: %w", f.name, f.v, err)
		}
	}
	return m, nil
}

// checkRef accepts a provider's reference: printable text, at most maxRef
// bytes. Stripe's ids are ASCII without spaces, but Adyen's
// shopperReference is the merchant's own choice, which may hold spaces or
// letters beyond ASCII; a control character or invalid UTF-8 is a broken
// file.
func checkRef(v string) error {
	switch {
	case v == "":
		return errors.New("is empty")
	case len(v) > maxRef:
		return fmt.Errorf("is longer than %d bytes", maxRef)
	case !utf8.ValidString(v):
		return errors.New("is not valid UTF-8")
	}
	for _, r := range v {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("has the character %q, which is not printable", r)
		}
	}
	return nil
}

// Save upserts methods for provider in one transaction: all or nothing.
func Save(ctx context.Context, db *sqlx.DB, provider string, methods []Method) error {
	const q = `
INSERT INTO payment_method (customer_id, provider, customer_ref, payment_method_ref)
SELECT id, $1, cref, pref FROM unnest($2::int8[], $3::text[], $4::text[]) AS t(id, cref, pref)
ON CONFLICT (customer_id, provider) DO UPDATE
SET customer_ref = EXCLUDED.customer_ref, payment_method_ref = EXCLUDED.payment_method_ref, updated_at = now()`
	const batch = 5000
	return postgres.InTx(ctx, db, func(tx *sqlx.Tx) error {
		for start := 0; start < len(methods); start += batch {
			part := methods[start:min(start+batch, len(methods))]
			var ids pq.Int64Array
			var crefs, prefs pq.StringArray
			for _, m := range part {
				ids = append(ids, m.CustomerID)
				crefs = append(crefs, m.CustomerRef)
				prefs = append(prefs, m.PaymentMethodRef)
			}
			if _, err := tx.ExecContext(ctx, q, provider, ids, crefs, prefs); err != nil {
				return fmt.Errorf("upsert payment_method: %w", err)
			}
		}
		return nil
	})
}
