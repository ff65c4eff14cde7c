package pgserver

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/lib/pq"

	"example.com/billing/internal/postgres"
)

// Recreate drops the database name on the server of serverURL, if it
// exists, creates it empty and returns its URL (serverURL with name as its
// database). It touches no other database. The demo, the tests, the chaos
// suite and the benchmarks make their throwaway databases with it; Drop
// removes one.
func Recreate(ctx context.Context, serverURL, name string) (string, error) {
	admin, target, err := adminOf(serverURL, name)
	if err != nil {
		return "", err
	}
	db, err := postgres.Open(admin, 1)
	if err != nil {
		return "", err
	}
	defer db.Close()
	quoted := pq.QuoteIdentifier(name)
	for _, q := range []string{"DROP DATABASE IF EXISTS " + quoted + " WITH (FORCE)", "CREATE DATABASE " + quoted} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return "", fmt.Errorf("%s: %w", q, err)
		}
	}
	return target, nil
}

// Drop drops the database name on the server of serverURL, cutting its
// sessions off.
func Drop(ctx context.Context, serverURL, name string) error {
	admin, _, err := adminOf(serverURL, name)
	if err != nil {
		return err
	}
	db, err := postgres.Open(admin, 1)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "DROP DATABASE IF EXISTS "+pq.QuoteIdentifier(name)+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

// adminOf returns the URL to administer databases through (serverURL, or
// its maintenance database postgres when serverURL names the database
// itself: one cannot drop the database one is connected to) and the URL of
// the database name.
func adminOf(serverURL, name string) (admin, target string, err error) {
	u, err := url.Parse(serverURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", "", fmt.Errorf("%q is not a postgres:// URL", postgres.Redact(serverURL))
	}
	a := *u
	if strings.TrimPrefix(a.Path, "/") == name {
		a.Path = "/postgres"
	}
	t := *u
	t.Path = "/" + name
	return a.String(), t.String(), nil
}
