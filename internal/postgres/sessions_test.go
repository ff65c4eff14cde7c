package postgres_test

import (
	"errors"
	"strings"
	"testing"

	"example.com/billing/internal/postgres"
	"example.com/billing/internal/testenv/dbtest"
	"example.com/billing/internal/testenv/pgbouncer"
)

// DetectSessions tells a transaction pooler from PostgreSQL itself and
// from a pooler in session mode, which keeps a client on one server
// session as PostgreSQL does.
func TestDetectSessions(t *testing.T) {
	t.Parallel()
	_, dsn := dbtest.New(t)
	tests := []struct {
		name string
		via  func(t *testing.T) string
		want postgres.Sessions
	}{
		{"OK_Direct", func(*testing.T) string { return dsn }, postgres.OwnSessions},
		{"OK_PgBouncerSessionMode", func(t *testing.T) string {
			return pgbouncer.Require(t, dsn, pgbouncer.Options{Mode: pgbouncer.Session}).URL(dsn)
		}, postgres.OwnSessions},
		{"OK_PgBouncerTransactionMode", func(t *testing.T) string {
			return pgbouncer.Require(t, dsn, pgbouncer.Options{Mode: pgbouncer.Transaction}).URL(dsn)
		}, postgres.SharedSessions},
		{"OK_PgBouncerTransactionModeOneServerSession", func(t *testing.T) string {
			return pgbouncer.Require(t, dsn, pgbouncer.Options{Mode: pgbouncer.Transaction, PoolSize: 1}).URL(dsn)
		}, postgres.SharedSessions},
		{"OK_PgBouncerStatementMode", func(t *testing.T) string {
			return pgbouncer.Require(t, dsn, pgbouncer.Options{Mode: "statement"}).URL(dsn)
		}, postgres.SharedStatements},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			db := dbtest.Open(t, tt.via(t), 4)
			got, err := postgres.DetectSessions(dbtest.Context(t), db)
			if err != nil || got != tt.want {
				t.Errorf("DetectSessions = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func TestCheckSessions(t *testing.T) {
	t.Parallel()
	const url = "postgres://billing@db:5432/billing?sslmode=disable"
	tests := []struct {
		name     string
		sessions postgres.Sessions
		dsn      string
		wantErr  bool
	}{
		{"OK_OwnSessions", postgres.OwnSessions, url, false},
		{"OK_OwnSessionsWithoutBinaryParameters", postgres.OwnSessions, url + "&binary_parameters=no", false},
		{"OK_SharedSessions", postgres.SharedSessions, url, false},
		{"OK_SharedSessionsBinaryParametersSaid", postgres.SharedSessions, url + "&binary_parameters=yes", false},
		{"ErrSharedSessionsWithoutBinaryParameters", postgres.SharedSessions, url + "&binary_parameters=no", true},
		{"ErrStatementMode", postgres.SharedStatements, url, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := postgres.CheckSessions(tt.sessions, tt.dsn)
			if (err != nil) != tt.wantErr {
				t.Fatalf("CheckSessions = %v, want error: %v", err, tt.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), "pool mode "+tt.sessions.Mode()) {
				t.Errorf("CheckSessions = %v, want it to name the pool mode", err)
			}
			if err != nil && tt.sessions == postgres.SharedSessions && !errors.Is(err, postgres.ErrUnnamedStatements) {
				t.Errorf("CheckSessions = %v, want ErrUnnamedStatements", err)
			}
		})
	}
}
