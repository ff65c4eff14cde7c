// Package postgres connects billing to PostgreSQL: the connection pool, the
// one transaction helper every write goes through, whether the pool's
// connections share server sessions (a pooler in transaction mode), and
// the ids of billing's locks (the schema and its migrations are package
// schema's; the leases, package lease's).
package postgres

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"example.com/billing/internal/redact"
)

// Open validates dsn, opens a pool of at most maxConns connections and
// returns it without waiting for the server: an unreachable database is an
// outage to wait out, not a configuration error.
//
// Unless dsn says otherwise, parameters are sent with binary_parameters=yes:
// lib/pq then sends a parameterised statement in one round trip instead of
// two (it need not ask the server for the parameter types first), which
// nearly halves the round trips of an event's transaction. Connections get
// TCP keepalives and a TCP user timeout (dialer.go), so that one whose
// packets are dropped fails in seconds rather than minutes.
func Open(dsn string, maxConns int) (*sqlx.DB, error) {
	cfg, err := config(dsn)
	if err != nil {
		return nil, err
	}
	connector, err := pq.NewConnectorConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("database connector: %w", err)
	}
	connector.Dialer(newDialer())
	db := sqlx.NewDb(sql.OpenDB(connector), "postgres")
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	// Recycle connections now and then so that a failover or a pgbouncer
	// restart is picked up without an error burst.
	db.SetConnMaxLifetime(30 * time.Minute)
	db.SetConnMaxIdleTime(5 * time.Minute)
	return db, nil
}

// config is lib/pq's configuration of dsn, with billing's defaults.
func config(dsn string) (pq.Config, error) {
	cfg, err := pq.NewConfig(dsn)
	if err != nil {
		// The parser's message can quote the URL, password and all.
		return cfg, fmt.Errorf("parse database url: %s", Redact(err.Error()))
	}
	if !strings.Contains(dsn, "binary_parameters") {
		cfg.BinaryParameters = true
	}
	return cfg, nil
}

// BinaryParameters reports whether Open's pool on dsn sends parameterised
// statements in one round trip (binary_parameters, unless dsn turns it
// off).
func BinaryParameters(dsn string) bool {
	cfg, err := config(dsn)
	return err == nil && cfg.BinaryParameters
}

// IsConfigError reports whether err from the database means the settings are
// wrong (bad password, unknown database or role, TLS required) rather than the
// server being away for a while.
func IsConfigError(err error) bool {
	var pathErr *fs.PathError
	if errors.As(err, &pathErr) { // sslrootcert, sslcert or sslkey not readable
		return true
	}
	var pqErr *pq.Error
	if !errors.As(err, &pqErr) {
		return false
	}
	switch pqErr.Code.Class() {
	case "28": // invalid_authorization_specification, invalid_password
		return true
	}
	return pqErr.Code == "3D000" // invalid_catalog_name: the database does not exist
}

// IsCertificateError reports whether err is the server's TLS certificate
// failing verification (sslmode=verify-ca or verify-full): signed by a CA
// that sslrootcert does not hold, or, with verify-full, issued for another
// host than DATABASE_URL's.
func IsCertificateError(err error) bool {
	var verify *tls.CertificateVerificationError
	var host x509.HostnameError
	var authority x509.UnknownAuthorityError
	return errors.As(err, &verify) || errors.As(err, &host) || errors.As(err, &authority)
}

// InTx runs fn inside a READ COMMITTED transaction and commits it.
//
// READ COMMITTED is what makes a racing duplicate wait on the first
// transaction's primary key and then skip; under REPEATABLE READ it would
// fail with a serialization error instead. It is set explicitly so that a
// server-wide default_transaction_isolation cannot change it.
//
// The commit error is returned: a lost commit error would let the caller mark
// an offset for a charge that was never recorded.
func InTx(ctx context.Context, db *sqlx.DB, fn func(tx *sqlx.Tx) error) error {
	tx, err := db.BeginTxx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit; its error adds nothing to fn's

	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// CheckWritable returns nil when db takes writes, else why not: a hot
// standby (pg_is_in_recovery) behind DATABASE_URL after a failover gone
// wrong, or a database whose sessions are read-only. billing's every event
// writes, so such a database is as good as none: readiness says so instead
// of every transaction failing behind a 200.
func CheckWritable(ctx context.Context, db sqlx.QueryerContext) error {
	var recovery bool
	var readOnly string
	if err := db.QueryRowxContext(ctx, `SELECT pg_is_in_recovery(), current_setting('transaction_read_only')`).Scan(&recovery, &readOnly); err != nil {
		return fmt.Errorf("check that the database takes writes: %w", err)
	}
	switch {
	case recovery:
		return errors.New("the database is in recovery (a hot standby): it takes no writes")
	case readOnly == "on":
		return errors.New("the database's sessions are read-only (default_transaction_read_only): it takes no writes")
	}
	return nil
}

// Redact returns dsn with its password masked, for logs and messages.
func Redact(dsn string) string { return redact.DSN(dsn) }
