// Package lease decides which process does a job that one process at a
// time must do: the outbox relay, and the retention of processed_event and
// of the outbox. A lease is a row of billing_lease (migration 12): a
// holder, an expiry the holder renews while it works, and a fencing token
// that grows with every new tenure and that the holder's writes check.
//
// Leases replace session advisory locks, which belong to a server session
// and so break behind a transaction pooler (PgBouncer in transaction mode),
// where consecutive statements of one client run on different server
// sessions: a lock left on an idle pooled session outlives its process,
// and an unlock reaches a session that does not hold it. Every statement
// here stands alone, so a lease works through any pooler, and the database
// is its only clock (now()): the processes' clocks need not agree.
//
// What a lease promises:
//   - one holder at a time: a lease is taken only once its expiry has
//     passed (or it was given back), and every taking raises the token;
//   - no tenure outlives its expiry: the holder renews every ttl/3, and its
//     tenure's context ends when a renewal finds the lease taken over, or
//     when the expiry it last secured passes without a renewal (its own
//     deadline is measured from before it asked, so it ends no later than
//     the database's);
//   - a holder that lost its lease cannot write: its writes check the token
//     in their own statement (Tenure.Check, billing_lease_held), which also
//     keeps the lease from passing to another holder until the write has
//     committed. A holder paused past its expiry (a stopped process, a long
//     GC) finds its write refused when it wakes.
//   - nothing is held after every holder stopped: a holder gives its lease
//     back when it stops, and a killed one's lease expires ttl after its
//     last renewal.
package lease

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
)

// Name is a lease's job. The names must never change: during a rolling
// update two releases take the same lease only if they name it alike.
type Name string

// Every lease billing takes.
const (
	// OutboxRelay: one relay at a time (outbox.Relay), so that a single
	// publisher keeps each order's outcome events in order.
	OutboxRelay Name = "outbox-relay"
	// DedupRetention: one maintainer of processed_event at a time
	// (dedup.Retention).
	DedupRetention Name = "dedup-retention"
	// OutboxRetention: one maintainer of the outbox at a time
	// (outbox.Retention).
	OutboxRetention Name = "outbox-retention"
)

// ErrLost is why a tenure ended before its holder stopped it: another
// holder took the lease over, or the holder could not renew it before its
// expiry (the database did not answer in time).
var ErrLost = errors.New("the lease was lost: it expired before it was renewed, or another holder took it over")

// HeldError says that another holder holds a lease that was asked for.
type HeldError struct {
	Name   Name
	Holder string
	// Left is how long its lease runs unless renewed.
	Left time.Duration
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("lease %s is held by %s for %s unless renewed", e.Name, e.Holder, e.Left.Round(time.Millisecond))
}

// Lease is one holder's handle on the lease of a job.
type Lease struct {
	db     *sqlx.DB
	name   Name
	holder string
	ttl    time.Duration
}

// New returns the handle of a new holder (this process, and a random part:
// two handles of one process are two holders) on the lease name, taken for
// ttl and renewed every ttl/3. A handle is for one goroutine at a time (its
// Do takes back its own lease).
func New(db *sqlx.DB, name Name, ttl time.Duration) *Lease {
	return &Lease{db: db, name: name, holder: newHolder(), ttl: ttl}
}

// newHolder names a holder: its host and process id, for operators, and
// a random part that makes it unique.
func newHolder() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// Holder is the name this handle holds its lease under.
func (l *Lease) Holder() string { return l.holder }

// Tenure is one uninterrupted holding of a lease.
type Tenure struct {
	Name   Name
	Holder string
	// Token is the fencing token: higher than every earlier tenure's.
	Token int64

	deadline func() time.Time
}

// Check returns nil when t still holds its lease, ErrLost when it does not.
// Run inside a transaction, it keeps the lease from passing to another
// holder until that transaction ends: the transaction's writes are the
// holder's. A statement that fences itself (one round trip) calls
// billing_lease_held with Args instead.
func (t Tenure) Check(ctx context.Context, q sqlx.QueryerContext) error {
	var held bool
	if err := sqlx.GetContext(ctx, q, &held, `SELECT billing_lease_held($1, $2, $3)`, t.Args()...); err != nil {
		return fmt.Errorf("check lease %s: %w", t.Name, err)
	}
	if !held {
		return fmt.Errorf("lease %s, token %d: %w", t.Name, t.Token, ErrLost)
	}
	return nil
}

// Args are the arguments of billing_lease_held(name, holder, token) for
// t's lease.
func (t Tenure) Args() []any { return []any{string(t.Name), t.Holder, t.Token} }

// Left is how long t's lease is known to last, from this process's view:
// until the expiry its last renewal secured. A holder about to do
// something it cannot take back and that the database does not fence (a
// publication to Kafka) does it only with time left.
func (t Tenure) Left() time.Duration { return time.Until(t.deadline()) }

// Do runs fn as the holder of the lease, and returns *HeldError at once,
// without running fn, while another holder's lease has not expired. This
// handle takes its own lease back at once, with a new token: its earlier
// tenure has ended (Do returned), but a database that did not answer may
// have kept it from giving the lease back.
//
// fn's context ends when the tenure does: ctx ended, or the lease was lost
// (context.Cause is then ErrLost). The lease is renewed every ttl/3 while
// fn runs, and given back when fn returns, so that another holder can take
// it at once. Do returns fn's error.
func (l *Lease) Do(ctx context.Context, fn func(ctx context.Context, t Tenure) error) error {
	asked := time.Now()
	var token int64
	err := l.db.GetContext(ctx, &token, `
INSERT INTO billing_lease AS l (name, holder, token, acquired_at, expires_at)
VALUES ($1, $2, 1, now(), now() + $3::bigint * interval '1 millisecond')
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, token = l.token + 1, acquired_at = now(), expires_at = excluded.expires_at
WHERE l.expires_at <= now() OR l.holder = excluded.holder
RETURNING token`, string(l.name), l.holder, l.ttl.Milliseconds())
	if errors.Is(err, sql.ErrNoRows) {
		return l.held(ctx)
	}
	if err != nil {
		return fmt.Errorf("take lease %s: %w", l.name, err)
	}
	tctx, end := context.WithCancelCause(ctx)
	defer end(nil)
	r := &renewal{lease: l, token: token, end: end, deadline: asked.Add(l.ttl), stop: make(chan struct{}), done: make(chan struct{})}
	go r.run(tctx)
	err = fn(tctx, Tenure{Name: l.name, Holder: l.holder, Token: token, deadline: r.until})
	close(r.stop)
	<-r.done
	l.giveBack(ctx, token)
	return err
}

// held returns the *HeldError of a lease that could not be taken.
func (l *Lease) held(ctx context.Context) error {
	var h struct {
		Holder string  `db:"holder"`
		Left   float64 `db:"left"`
	}
	err := l.db.GetContext(ctx, &h, `SELECT holder, greatest(extract(epoch FROM expires_at - now()), 0)::float8 AS left FROM billing_lease WHERE name = $1`, string(l.name))
	if errors.Is(err, sql.ErrNoRows) {
		// Given back between the two statements: it is free now, and the
		// caller asks again at its next turn.
		return &HeldError{Name: l.name}
	}
	if err != nil {
		return fmt.Errorf("lease %s: %w", l.name, err)
	}
	return &HeldError{Name: l.name, Holder: h.Holder, Left: time.Duration(h.Left * float64(time.Second))}
}

// giveBack ends the tenure token in the database, so that another holder
// need not wait for its expiry. It may fail (the database away): the lease
// then expires by itself.
func (l *Lease) giveBack(ctx context.Context, token int64) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_, _ = l.db.ExecContext(ctx, `UPDATE billing_lease SET expires_at = now() WHERE name = $1 AND holder = $2 AND token = $3 AND expires_at > now()`,
		string(l.name), l.holder, token)
}

// renewal keeps one tenure's lease: it renews it every ttl/3 and ends the
// tenure when it is lost.
type renewal struct {
	lease *Lease
	token int64
	end   context.CancelCauseFunc
	stop  chan struct{} // closed when fn returned
	done  chan struct{} // closed when run returned

	mu       sync.Mutex
	deadline time.Time // the expiry the last renewal secured, by this process's clock
}

func (r *renewal) until() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.deadline
}

func (r *renewal) extend(d time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deadline = d
}

func (r *renewal) run(ctx context.Context) {
	defer close(r.done)
	l := r.lease
	every := l.ttl / 3
	expired := time.NewTimer(time.Until(r.until()))
	defer expired.Stop()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-ctx.Done():
			return
		case <-expired.C:
			r.end(fmt.Errorf("lease %s not renewed within %s: %w", l.name, l.ttl, ErrLost))
			return
		case <-tick.C:
		}
		asked := time.Now()
		// A renewal that cannot answer before the lease expires is no use.
		rctx, cancel := context.WithDeadline(ctx, r.until())
		res, err := l.db.ExecContext(rctx, `
UPDATE billing_lease SET expires_at = now() + $4::bigint * interval '1 millisecond'
WHERE name = $1 AND holder = $2 AND token = $3 AND expires_at > now()`, string(l.name), l.holder, r.token, l.ttl.Milliseconds())
		cancel()
		if err != nil {
			continue // the database is away: try again until the expiry
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			r.end(fmt.Errorf("lease %s, token %d, taken over: %w", l.name, r.token, ErrLost))
			return
		}
		r.extend(asked.Add(l.ttl))
		expired.Reset(time.Until(r.until()))
	}
}
