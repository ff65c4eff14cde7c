package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"example.com/billing/internal/postgres"
	"example.com/billing/internal/testenv/dbtest"
)

func newTable(t *testing.T, ddl string) *sqlx.DB {
	t.Helper()
	db := dbtest.Open(t, dbtest.Empty(t), 4)
	if _, err := db.ExecContext(dbtest.Context(t), ddl); err != nil {
		t.Fatalf("create table: %v", err)
	}
	return db
}

func count(t *testing.T, db *sqlx.DB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := db.GetContext(dbtest.Context(t), &n, q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

func TestInTx(t *testing.T) {
	t.Parallel()

	t.Run("OK_CommitsOnNil", func(t *testing.T) {
		t.Parallel()
		db := newTable(t, `CREATE TABLE item (id int PRIMARY KEY)`)
		err := postgres.InTx(dbtest.Context(t), db, func(tx *sqlx.Tx) error {
			_, err := tx.ExecContext(dbtest.Context(t), `INSERT INTO item VALUES (1), (2)`)
			return err
		})
		if err != nil {
			t.Fatalf("InTx: %v", err)
		}
		if n := count(t, db, `SELECT count(*) FROM item`); n != 2 {
			t.Errorf("%d rows after commit, want 2", n)
		}
		if n := db.Stats().InUse; n != 0 {
			t.Errorf("%d connections still in use after InTx", n)
		}
	})

	t.Run("ErrRollsBackAndReturnsFnError", func(t *testing.T) {
		t.Parallel()
		db := newTable(t, `CREATE TABLE item (id int PRIMARY KEY)`)
		errBusiness := errors.New("business rule failed")
		err := postgres.InTx(dbtest.Context(t), db, func(tx *sqlx.Tx) error {
			if _, err := tx.ExecContext(dbtest.Context(t), `INSERT INTO item VALUES (1)`); err != nil {
				return err
			}
			return fmt.Errorf("charge: %w", errBusiness)
		})
		if !errors.Is(err, errBusiness) {
			t.Fatalf("InTx = %v, want fn's error", err)
		}
		if n := count(t, db, `SELECT count(*) FROM item`); n != 0 {
			t.Errorf("%d rows after fn failed, want 0 (rolled back)", n)
		}
		if n := db.Stats().InUse; n != 0 {
			t.Errorf("%d connections still in use after InTx", n)
		}
	})

	t.Run("ErrPanicRollsBack", func(t *testing.T) {
		t.Parallel()
		db := newTable(t, `CREATE TABLE item (id int PRIMARY KEY)`)
		func() {
			defer func() {
				if recover() == nil {
					t.Error("InTx swallowed fn's panic")
				}
			}()
			_ = postgres.InTx(dbtest.Context(t), db, func(tx *sqlx.Tx) error {
				if _, err := tx.ExecContext(dbtest.Context(t), `INSERT INTO item VALUES (1)`); err != nil {
					t.Errorf("insert: %v", err)
				}
				panic("boom")
			})
		}()
		if n := count(t, db, `SELECT count(*) FROM item`); n != 0 {
			t.Errorf("%d rows after fn panicked, want 0 (rolled back)", n)
		}
	})

	// A commit can fail after fn succeeded: a deferred constraint, a
	// serialization failure, a connection lost at COMMIT. The caller must
	// learn about it, or it would mark an offset for a charge never stored.
	t.Run("ErrCommitFailureReturned", func(t *testing.T) {
		t.Parallel()
		db := newTable(t, `CREATE TABLE item (id int PRIMARY KEY, code int NOT NULL,
			CONSTRAINT item_code_unique UNIQUE (code) DEFERRABLE INITIALLY DEFERRED)`)
		fnDone := false
		err := postgres.InTx(dbtest.Context(t), db, func(tx *sqlx.Tx) error {
			// Both inserts succeed: the check waits for COMMIT.
			_, err := tx.ExecContext(dbtest.Context(t), `INSERT INTO item VALUES (1, 7), (2, 7)`)
			fnDone = err == nil
			return err
		})
		if !fnDone {
			t.Fatal("fn failed before commit; the test needs the violation at commit")
		}
		if err == nil {
			t.Fatal("InTx = nil, want the commit error")
		}
		var pqErr *pq.Error
		if !errors.As(err, &pqErr) || pqErr.Code != "23505" || pqErr.Constraint != "item_code_unique" {
			t.Errorf("InTx = %v, want the unique violation of item_code_unique at commit", err)
		}
		if n := count(t, db, `SELECT count(*) FROM item`); n != 0 {
			t.Errorf("%d rows after a failed commit, want 0", n)
		}
	})

	t.Run("OK_ReadCommittedDespiteSerializableDefault", func(t *testing.T) {
		t.Parallel()
		dsn := dbtest.Empty(t)
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(u.Path, "/")
		admin := dbtest.Open(t, dsn, 1)
		if _, err := admin.ExecContext(dbtest.Context(t), `ALTER DATABASE `+pq.QuoteIdentifier(name)+` SET default_transaction_isolation = 'serializable'`); err != nil {
			t.Fatalf("alter database: %v", err)
		}
		admin.Close()

		db := dbtest.Open(t, dsn, 2) // new sessions pick the database default up
		var def string
		if err := db.GetContext(dbtest.Context(t), &def, `SHOW default_transaction_isolation`); err != nil || def != "serializable" {
			t.Fatalf("default_transaction_isolation = %q (err %v); the test setup did not take", def, err)
		}
		var level string
		err = postgres.InTx(dbtest.Context(t), db, func(tx *sqlx.Tx) error {
			return tx.GetContext(dbtest.Context(t), &level, `SHOW transaction_isolation`)
		})
		if err != nil {
			t.Fatalf("InTx: %v", err)
		}
		if level != "read committed" {
			t.Errorf("InTx runs in %q, want read committed", level)
		}
	})
}

// closedPort returns a local TCP port nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

// withURL returns the test server's URL changed by edit.
func withURL(t *testing.T, edit func(u *url.URL)) string {
	t.Helper()
	u, err := url.Parse(dbtest.ServerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	edit(u)
	return u.String()
}

func TestIsConfigError(t *testing.T) {
	t.Parallel()
	ping := func(t *testing.T, dsn string) error {
		t.Helper()
		db := dbtest.Open(t, dsn, 1)
		err := db.PingContext(dbtest.Context(t))
		if err == nil {
			t.Fatalf("ping %s succeeded, want an error", postgres.Redact(dsn))
		}
		return err
	}
	tests := []struct {
		name string
		err  func(t *testing.T) error
		want bool
	}{
		{"OK_UnknownDatabase", func(t *testing.T) error {
			return ping(t, withURL(t, func(u *url.URL) { u.Path = "/billing_no_such_database" }))
		}, true},
		{"OK_UnknownRole", func(t *testing.T) error {
			return ping(t, withURL(t, func(u *url.URL) { u.User = url.User("billing_no_such_role") }))
		}, true},
		{"OK_WrappedUnknownDatabase", func(t *testing.T) error {
			return fmt.Errorf("ping: %w", ping(t, withURL(t, func(u *url.URL) { u.Path = "/billing_no_such_database" })))
		}, true},
		{"OK_ClosedPortIsNot", func(t *testing.T) error {
			return ping(t, withURL(t, func(u *url.URL) { u.Host = "127.0.0.1:" + strconv.Itoa(closedPort(t)) }))
		}, false},
		{"OK_SQLErrorIsNot", func(t *testing.T) error {
			db := dbtest.Open(t, dbtest.ServerURL(t), 1)
			_, err := db.ExecContext(dbtest.Context(t), `SELEC 1`)
			return err
		}, false},
		{"OK_CanceledIsNot", func(t *testing.T) error { return context.Canceled }, false},
		{"OK_NilIsNot", func(t *testing.T) error { return nil }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.err(t)
			if got := postgres.IsConfigError(err); got != tt.want {
				t.Errorf("IsConfigError(%v) = %v, want %v", err, got, tt.want)
			}
		})
	}
}

// CheckWritable tells a database that takes writes from one whose sessions
// are read-only (a hot standby answers the same way, through
// pg_is_in_recovery).
func TestCheckWritable(t *testing.T) {
	db, _ := dbtest.New(t)
	conn, err := db.Connx(dbtest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := postgres.CheckWritable(dbtest.Context(t), conn); err != nil {
		t.Fatalf("a writable database: %v", err)
	}
	if _, err := conn.ExecContext(dbtest.Context(t), `SET default_transaction_read_only = on`); err != nil {
		t.Fatal(err)
	}
	if err := postgres.CheckWritable(dbtest.Context(t), conn); err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Errorf("read-only sessions: %v, want an error saying so", err)
	}
	if _, err := conn.ExecContext(dbtest.Context(t), `RESET default_transaction_read_only`); err != nil {
		t.Fatal(err)
	}
}
