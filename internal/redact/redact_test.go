package redact_test

import (
	"strings"
	"testing"

	"example.com/billing/internal/redact"
)

func TestDSN(t *testing.T) {
	t.Parallel()
	const secret = "S3cr3t-Pw"
	tests := []struct {
		name string
		dsn  string
		keep []string // what an operator needs to see
	}{
		{"OK_URL", "postgres://billing:" + secret + "@db.internal:5432/billing?sslmode=require", []string{"postgres://billing:", "@db.internal:5432/billing", "sslmode=require"}},
		{"OK_URLPostgresqlScheme", "postgresql://billing:" + secret + "@db/billing", []string{"postgresql://billing:", "@db/billing"}},
		{"OK_URLEscapedPassword", "postgres://billing:" + secret + "%40x@db/billing", []string{"@db/billing"}},
		{"OK_URLQueryPassword", "postgres://billing@db.internal/billing?password=" + secret + "&sslmode=require", []string{"billing@db.internal/billing", "sslmode=require", "password="}},
		{"OK_URLBothPasswords", "postgres://billing:" + secret + "@db/billing?password=" + secret, []string{"@db/billing"}},
		{"OK_KeyValue", "host=db.internal password=" + secret + " dbname=billing", []string{"host=db.internal", "dbname=billing", "password="}},
		{"OK_KeyValuePasswordFirst", "password=" + secret + " host=db.internal", []string{"host=db.internal"}},
		{"OK_KeyValuePasswordLast", "host=db.internal password=" + secret, []string{"host=db.internal"}},
		{"OK_KeyValueSpaces", "host=db.internal password = " + secret + " dbname=billing", []string{"host=db.internal", "dbname=billing"}},
		{"OK_KeyValueQuoted", "host=db.internal password='" + secret + " with space' dbname=billing", []string{"host=db.internal", "dbname=billing"}},
		{"OK_KeyValueQuotedEscape", `host=db.internal password='` + secret + `\' x' dbname=billing`, []string{"host=db.internal", "dbname=billing"}},
		// url.Parse rejects these, and the parser's message quotes them.
		{"OK_URLBadPort", "postgres://billing:" + secret + "@db:port/billing", []string{"@db:port/billing"}},
		{"OK_URLBadEscape", "postgres://billing:" + secret + "@db/%zz", []string{"@db/%zz"}},
		{"OK_ParserMessage", `parse "postgres://billing:` + secret + `@db:port/billing": invalid port ":port" after host`, []string{"@db:port/billing", "invalid port"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := redact.DSN(tt.dsn)
			if strings.Contains(got, secret) {
				t.Errorf("DSN(%q) = %q reveals the password", tt.dsn, got)
			}
			for _, k := range tt.keep {
				if !strings.Contains(got, k) {
					t.Errorf("DSN(%q) = %q lost %q", tt.dsn, got, k)
				}
			}
		})
	}

	unchanged := []struct{ name, dsn string }{
		{"OK_URLWithoutPasswordUnchanged", "postgres://billing@db.internal:5432/billing?sslmode=disable"},
		{"OK_KeyValueWithoutPasswordUnchanged", "host=db.internal user=billing dbname=billing"},
	}
	for _, tt := range unchanged {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := redact.DSN(tt.dsn); got != tt.dsn {
				t.Errorf("DSN(%q) = %q, want it unchanged", tt.dsn, got)
			}
		})
	}
}
