package lease_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"example.com/billing/internal/lease"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/testenv/dbtest"
	"example.com/billing/internal/testenv/pgbouncer"
	"example.com/billing/internal/testenv/wait"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// forEachRoute runs test once per route, on a fresh migrated database.
func forEachRoute(t *testing.T, test func(t *testing.T, db *sqlx.DB, dsn string)) {
	for _, r := range pgbouncer.Routes() {
		t.Run(r.Name, func(t *testing.T) {
			t.Parallel()
			_, direct := dbtest.New(t)
			dsn := r.Via(t, direct)
			test(t, dbtest.Open(t, dsn, 8), dsn)
		})
	}
}

// One holder at a time: a second one is told who holds the lease and for
// how long, and takes it as soon as the first gives it back, with a higher
// token.
func TestLease_OneHolderAtATime(t *testing.T) {
	forEachRoute(t, func(t *testing.T, db *sqlx.DB, _ string) {
		ctx := dbtest.Context(t)
		first := lease.New(db, lease.OutboxRelay, 10*time.Second)
		second := lease.New(db, lease.OutboxRelay, 10*time.Second)
		var firstToken int64
		err := first.Do(ctx, func(ctx context.Context, tn lease.Tenure) error {
			firstToken = tn.Token
			if err := tn.Check(ctx, db); err != nil {
				t.Errorf("Check of the holder = %v, want nil", err)
			}
			err := second.Do(ctx, func(context.Context, lease.Tenure) error {
				t.Error("a second holder ran while the first held the lease")
				return nil
			})
			var held *lease.HeldError
			if !errors.As(err, &held) || held.Holder != first.Holder() || held.Left <= 5*time.Second {
				t.Errorf("second Do = %v, want HeldError naming %s with ~10s left", err, first.Holder())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		// Given back: the second takes it at once, and its token is higher.
		err = second.Do(ctx, func(ctx context.Context, tn lease.Tenure) error {
			if tn.Token <= firstToken {
				t.Errorf("token %d after %d, want it higher", tn.Token, firstToken)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("second Do after the first gave the lease back: %v", err)
		}
		// A holder whose tenure ended without giving the lease back (the
		// database did not answer) takes it back at once, with a new token.
		third := lease.New(db, lease.OutboxRelay, 10*time.Second)
		var tokens []int64
		for range 2 {
			err := third.Do(ctx, func(ctx context.Context, tn lease.Tenure) error {
				tokens = append(tokens, tn.Token)
				return nil
			})
			if err != nil {
				t.Fatalf("a holder taking back its own lease: %v", err)
			}
			// As if the database had not answered its giving back.
			if _, err := db.ExecContext(ctx, `UPDATE billing_lease SET expires_at = now() + interval '1 hour' WHERE name = $1`, string(lease.OutboxRelay)); err != nil {
				t.Fatal(err)
			}
			if err := second.Do(ctx, func(context.Context, lease.Tenure) error { return nil }); err == nil {
				t.Error("another holder took a lease that has not expired")
			}
		}
		if tokens[1] <= tokens[0] {
			t.Errorf("tokens %v: a tenure taken back must have a new token", tokens)
		}
		if _, err := db.ExecContext(ctx, `UPDATE billing_lease SET expires_at = now() WHERE name = $1`, string(lease.OutboxRelay)); err != nil {
			t.Fatal(err)
		}

		// Leases are independent of each other.
		other := lease.New(db, lease.DedupRetention, 10*time.Second)
		err = first.Do(ctx, func(ctx context.Context, _ lease.Tenure) error {
			return other.Do(ctx, func(context.Context, lease.Tenure) error { return nil })
		})
		if err != nil {
			t.Errorf("two different leases at once: %v", err)
		}
		assertNothingHeld(t, db)
	})
}

// A holder renews its lease for as long as it works, far beyond the
// lease's duration, and no one else takes it meanwhile.
func TestLease_RenewedWhileItsHolderWorks(t *testing.T) {
	forEachRoute(t, func(t *testing.T, db *sqlx.DB, _ string) {
		ctx := dbtest.Context(t)
		const ttl = 600 * time.Millisecond
		holder := lease.New(db, lease.DedupRetention, ttl)
		other := lease.New(db, lease.DedupRetention, ttl)
		err := holder.Do(ctx, func(ctx context.Context, tn lease.Tenure) error {
			for range 10 {
				select {
				case <-ctx.Done():
					return fmt.Errorf("tenure ended while its holder works: %w", context.Cause(ctx))
				case <-time.After(ttl / 3):
				}
				if err := other.Do(ctx, func(context.Context, lease.Tenure) error { return nil }); err == nil {
					t.Error("another holder took a lease that is being renewed")
				}
			}
			if left := tn.Left(); left <= 0 || left > ttl {
				t.Errorf("Left() = %s, want within (0, %s]", left, ttl)
			}
			return tn.Check(ctx, db)
		})
		if err != nil {
			t.Fatal(err)
		}
		assertNothingHeld(t, db)
	})
}

// A holder that cannot renew (its pooler is gone) ends its tenure by its
// own clock before the lease expires in the database, and only then does
// another holder, reaching the database another way, take it.
func TestLease_AHolderThatCannotRenewStopsBeforeItsLeaseExpires(t *testing.T) {
	t.Parallel()
	_, direct := dbtest.New(t)
	bouncer := pgbouncer.Require(t, direct, pgbouncer.Options{})
	pooled := dbtest.Open(t, bouncer.URL(direct), 4)
	db := dbtest.Open(t, direct, 4)
	ctx := dbtest.Context(t)
	const ttl = 1500 * time.Millisecond
	cutOff := lease.New(pooled, lease.OutboxRelay, ttl)
	var ended time.Time
	var cause error
	tenure := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- cutOff.Do(ctx, func(ctx context.Context, _ lease.Tenure) error {
			close(tenure)
			<-ctx.Done()
			ended, cause = time.Now(), context.Cause(ctx)
			return nil
		})
	}()
	<-tenure
	bouncer.Kill()
	next := lease.New(db, lease.OutboxRelay, ttl)
	var took time.Time
	wait.For(t, 3*ttl, "the lease taken over once it expired", func() bool {
		return next.Do(ctx, func(context.Context, lease.Tenure) error { took = time.Now(); return nil }) == nil
	})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !errors.Is(cause, lease.ErrLost) {
		t.Errorf("the cut-off tenure ended with %v, want ErrLost", cause)
	}
	if !ended.Before(took) {
		t.Errorf("the cut-off holder's tenure ended at %s, after the next one began at %s", ended.Format(time.StampMilli), took.Format(time.StampMilli))
	}
}

// A leader killed with -9 is replaced within its lease's duration, and
// nothing of it is held afterwards: no lease, no advisory lock, directly
// and through a transaction pooler (where a session advisory lock stayed
// with the pooled server session).
func TestLease_AKilledHolderIsReplacedWithinTheLease(t *testing.T) {
	forEachRoute(t, func(t *testing.T, db *sqlx.DB, dsn string) {
		ctx := dbtest.Context(t)
		const ttl = 2 * time.Second
		h := startHolder(t, dsn, ttl)
		token := h.acquired(t)
		if err := h.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		next := lease.New(db, lease.OutboxRelay, ttl)
		var newToken int64
		wait.For(t, ttl+time.Second, "the killed holder's lease taken over", func() bool {
			return next.Do(ctx, func(_ context.Context, tn lease.Tenure) error { newToken = tn.Token; return nil }) == nil
		})
		replaced := time.Since(killed)
		t.Logf("%s: a holder killed with -9 replaced after %s (lease %s)", t.Name(), replaced.Round(time.Millisecond), ttl)
		if replaced > ttl+200*time.Millisecond {
			t.Errorf("replaced %s after the kill, want within the lease's %s", replaced, ttl)
		}
		if newToken <= token {
			t.Errorf("token %d after the killed holder's %d, want it higher", newToken, token)
		}
		assertNothingHeld(t, db)
	})
}

// A holder paused past its lease (SIGSTOP: a stopped process, a long GC)
// writes nothing once another holder took the lease over: its first write
// after it woke is refused by the fence, although nothing in its own
// process told it that it lost the lease.
func TestLease_APausedHoldersLateWriteIsRefused(t *testing.T) {
	forEachRoute(t, func(t *testing.T, db *sqlx.DB, dsn string) {
		ctx := dbtest.Context(t)
		if _, err := db.ExecContext(ctx, `CREATE TABLE lease_probe (token bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
			t.Fatal(err)
		}
		const ttl = time.Second
		h := startHolder(t, dsn, ttl)
		token := h.acquired(t)
		wait.For(t, 5*time.Second, "the holder's first fenced writes", func() bool { return probes(t, db, token) > 0 })
		if err := h.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		wait.For(t, 3*ttl, "the paused holder's lease expired", func() bool {
			var expired bool
			if err := db.Get(&expired, `SELECT expires_at <= now() FROM billing_lease WHERE name = $1`, string(lease.OutboxRelay)); err != nil {
				t.Fatal(err)
			}
			return expired
		})
		next := lease.New(db, lease.OutboxRelay, 10*time.Second)
		var took time.Time
		taken, release := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- next.Do(ctx, func(context.Context, lease.Tenure) error {
				took = time.Now()
				close(taken)
				<-release
				return nil
			})
		}()
		select {
		case <-taken:
		case err := <-done:
			t.Fatalf("the expired lease of the paused holder could not be taken: %v", err)
		}
		if err := h.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		line := h.line(t)
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if line != fmt.Sprintf("refused %d", token) {
			t.Errorf("the paused holder said %q after it woke, want its write refused", line)
		}
		var late int
		if err := db.GetContext(ctx, &late, `SELECT count(*) FROM lease_probe WHERE token = $1 AND at >= $2`, token, took); err != nil {
			t.Fatal(err)
		}
		if late != 0 {
			t.Errorf("the paused holder wrote %d rows after its lease was taken over", late)
		}
	})
}

func probes(t *testing.T, db *sqlx.DB, token int64) int {
	t.Helper()
	var n int
	if err := db.Get(&n, `SELECT count(*) FROM lease_probe WHERE token = $1`, token); err != nil {
		t.Fatal(err)
	}
	return n
}

// assertNothingHeld fails t when a lease is still held or a session
// advisory lock is held in t's database.
func assertNothingHeld(t *testing.T, db *sqlx.DB) {
	t.Helper()
	var leases, locks int
	if err := db.Get(&leases, `SELECT count(*) FROM billing_lease WHERE expires_at > now()`); err != nil {
		t.Fatal(err)
	}
	if err := db.Get(&locks, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`); err != nil {
		t.Fatal(err)
	}
	if leases != 0 || locks != 0 {
		t.Errorf("after every holder stopped: %d leases and %d advisory locks held, want none", leases, locks)
	}
}

// holder is a lease holder in a process of its own (this test binary run
// as TestHolderProcess), so that it can be killed and paused.
type holder struct {
	cmd   *exec.Cmd
	lines chan string
}

func startHolder(t *testing.T, dsn string, ttl time.Duration) *holder {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHolderProcess$")
	cmd.Env = append(os.Environ(), "LEASE_HOLDER_URL="+dsn, "LEASE_HOLDER_TTL="+ttl.String())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &holder{cmd: cmd, lines: make(chan string, 16)}
	var wg sync.WaitGroup
	wg.Go(func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
		close(h.lines)
	})
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		wg.Wait()
	})
	return h
}

// line returns the holder's next line of output.
func (h *holder) line(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-h.lines:
		if !ok {
			t.Fatal("the holder process exited")
		}
		return l
	case <-time.After(15 * time.Second):
		t.Fatal("the holder process said nothing for 15s")
	}
	return ""
}

// acquired waits for the holder's lease and returns its token.
func (h *holder) acquired(t *testing.T) int64 {
	t.Helper()
	l := h.line(t)
	token, err := strconv.ParseInt(strings.TrimPrefix(l, "acquired "), 10, 64)
	if err != nil {
		t.Fatalf("the holder said %q, want acquired <token>", l)
	}
	return token
}

// TestHolderProcess is the holder process of startHolder, not a test: it
// takes the relay's lease, says "acquired <token>", and writes a fenced
// row every 20 ms, ignoring its tenure's context as a leader that does
// not know it was paused would, until the fence refuses a write: then it
// says "refused <token>" and exits.
func TestHolderProcess(t *testing.T) {
	dsn := os.Getenv("LEASE_HOLDER_URL")
	if dsn == "" {
		t.Skip("the holder process of the lease tests (startHolder)")
	}
	ttl, err := time.ParseDuration(os.Getenv("LEASE_HOLDER_TTL"))
	if err != nil {
		t.Fatal(err)
	}
	db, err := postgres.Open(dsn, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	out := bufio.NewWriter(os.Stdout)
	say := func(format string, args ...any) {
		fmt.Fprintf(out, format+"\n", args...)
		_ = out.Flush()
	}
	err = lease.New(db, lease.OutboxRelay, ttl).Do(context.Background(), func(_ context.Context, tn lease.Tenure) error {
		say("acquired %d", tn.Token)
		const write = `
WITH fence AS (SELECT billing_lease_held($1, $2, $3) AS held)
INSERT INTO lease_probe (token) SELECT $3 FROM fence WHERE held`
		for {
			res, err := db.Exec(write, tn.Args()...)
			if err != nil {
				// lease_probe may not exist (the kill test): hold on.
				time.Sleep(20 * time.Millisecond)
				continue
			}
			if n, _ := res.RowsAffected(); n == 0 {
				say("refused %d", tn.Token)
				return nil
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}
