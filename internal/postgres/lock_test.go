package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pressly/goose/v3/lock"

	"example.com/billing/internal/postgres"
	"example.com/billing/internal/testenv/dbtest"
	"example.com/billing/internal/testenv/wait"
)

func TestLock_Keys(t *testing.T) {
	t.Parallel()
	keys := map[postgres.Lock]string{
		postgres.LockDedupRetention:  "billdedu",
		postgres.LockOutboxRetention: "billoutr",
		postgres.LockOutboxRelay:     "billoutb",
		postgres.LockMigrations:      "4097083626",
	}
	if len(keys) != 4 {
		t.Fatalf("two locks share a key: %v", keys)
	}
	for key, name := range keys {
		if key.String() != name {
			t.Errorf("Lock(%d).String() = %q, want %q", int64(key), key.String(), name)
		}
	}
	// Pinned: earlier versions took goose's default, and a migrate of this
	// version must exclude theirs.
	if int64(postgres.LockMigrations) != lock.DefaultLockID {
		t.Errorf("LockMigrations = %d, goose's default is %d", postgres.LockMigrations, lock.DefaultLockID)
	}
}

func TestWithSessionLock(t *testing.T) {
	t.Parallel()
	db, dsn := dbtest.New(t)
	ctx := context.Background()
	const key = postgres.LockDedupRetention
	// other is another process's session: it sees whether the lock is free.
	other := dbtest.Open(t, dsn, 1)
	free := func() bool {
		var ok bool
		if err := other.GetContext(ctx, &ok, `SELECT pg_try_advisory_lock($1)`, int64(key)); err != nil {
			t.Fatal(err)
		}
		if ok {
			if _, err := other.ExecContext(ctx, `SELECT pg_advisory_unlock($1)`, int64(key)); err != nil {
				t.Fatal(err)
			}
		}
		return ok
	}

	t.Run("OK_RunsHoldingTheLockAndReleasesIt", func(t *testing.T) {
		ran, err := postgres.WithSessionLock(ctx, db, key, func(conn *sqlx.Conn) error {
			if free() {
				t.Error("the lock is free while fn runs")
			}
			// The server ends the session, and so frees the lock, within
			// seconds of its client going silent (a cut network), not after
			// the system's two hours of keepalive.
			for name, want := range map[string]string{"tcp_keepalives_idle": "5", "tcp_keepalives_interval": "2", "tcp_keepalives_count": "3"} {
				var got string
				if err := conn.GetContext(ctx, &got, `SELECT current_setting($1)`, name); err != nil || got != want {
					t.Errorf("the locking session's %s = %q (%v), want %s", name, got, err, want)
				}
			}
			return nil
		})
		if !ran || err != nil {
			t.Fatalf("WithSessionLock = %v, %v; want true, nil", ran, err)
		}
		if !free() {
			t.Error("the lock is still held after fn returned")
		}
	})

	t.Run("ErrFn_ReturnedAndTheLockReleased", func(t *testing.T) {
		boom := errors.New("boom")
		ran, err := postgres.WithSessionLock(ctx, db, key, func(*sqlx.Conn) error { return boom })
		if !ran || !errors.Is(err, boom) {
			t.Fatalf("WithSessionLock = %v, %v; want true, boom", ran, err)
		}
		// Released by ending the session, which the server notices a
		// moment later.
		wait.For(t, 5*time.Second, "the lock released with the session", free)
	})

	t.Run("HeldElsewhere_Skipped", func(t *testing.T) {
		conn, err := other.Connx(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, int64(key)); err != nil {
			t.Fatal(err)
		}
		defer conn.ExecContext(ctx, `SELECT pg_advisory_unlock($1)`, int64(key)) //nolint:errcheck // the test database is dropped anyway
		ran, err := postgres.WithSessionLock(ctx, db, key, func(*sqlx.Conn) error {
			t.Error("fn ran while another session held the lock")
			return nil
		})
		if ran || err != nil {
			t.Fatalf("WithSessionLock = %v, %v; want false, nil", ran, err)
		}
	})
}
