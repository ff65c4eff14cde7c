// Package fleet makes the replicas of one consumer group a fleet, through
// PostgreSQL (migration 16): they share one budget of requests per second
// at the provider's account (PAYMENT_ACCOUNT_MAX_RPS), and they follow the
// operator's pause of charging (billing pause, billing resume).
//
// Every replica is a Member. Every Interval it renews its row of
// fleet_member in one short transaction that locks its group's
// payment_budget row, so that the renewals of a group follow one another:
//
//   - It takes its share of the budget: an equal part among the live
//     members, in whole requests a second (shareOf says why), but never
//     more than the others' unexpired shares leave. A replica that joins
//     starts with what is free and grows as the others shrink to their
//     equal parts at their next renewals (it renews every shortInterval
//     meanwhile).
//   - A share is a lease. The replica uses it until LeaseTTL after it
//     asked, less a margin, by its own monotonic clock; the others count
//     it until its row's expiry, LeaseTTL after the transaction began by
//     the database's clock, which is later. A replica that cannot renew
//     sends nothing once its lease lapses; one that died gives its share
//     back when its row expires, within LeaseTTL.
//   - A share that shrinks applies before the transaction commits, one
//     that grows after it: at no moment do the shares in use exceed the
//     budget, so the fleet never sends more than the budget in any second
//     (the payment client paces its share, see payment.Client).
//   - The 429s a replica saw since its last renewal cut the group's budget
//     by a quarter (once per cutSpacing, never below a tenth of
//     PAYMENT_ACCOUNT_MAX_RPS); once none came for a quiet period it grows
//     back by a twentieth a second. Every replica follows the table's
//     budget at its next renewal.
//   - It reads the group's charging state (charging_state), applies it
//     (its Followers: the payment client holds every request that could
//     create a payment, the consumer stops fetching without leaving the
//     group) and records the version it applies, which billing pause
//     reads to tell which replicas follow it.
//
// Nothing is kept in a database session (every lock is a row's, held by
// one transaction), so it works through a transaction pooler.
package fleet

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"

	"example.com/billing/internal/metrics"
	"example.com/billing/internal/postgres"
)

const (
	// Interval is how often a member renews its share and reads the
	// charging state: a pause applies within it.
	Interval = time.Second
	// shortInterval is how often a member that holds less than its equal
	// part renews (one that joined, or whose peer died): the others
	// shrink to theirs within Interval, and it takes what they free
	// within shortInterval after, rather than a whole Interval later.
	shortInterval = Interval / 5
	// LeaseTTL is how long a share lasts unless renewed: a member that
	// died gives its share back within it.
	LeaseTTL = 3 * time.Second
	// leaseMargin is how much earlier than its row's expiry a member stops
	// using its share: its clock may run a little faster than the
	// database's, and the transaction began after it asked.
	leaseMargin = 500 * time.Millisecond
	// forgetAfter is how long the rows of members that died are kept.
	forgetAfter = time.Hour
)

// Config is one replica's place in its fleet.
type Config struct {
	// Group is the consumer group (KAFKA_GROUP_ID): the fleet.
	Group string
	// Instance names the replica (its billing_replica record).
	Instance uuid.UUID
	// AccountMaxRPS is PAYMENT_ACCOUNT_MAX_RPS: the requests per second
	// the provider's account takes from the whole group; 0: no shared
	// budget (the member still follows the charging state).
	AccountMaxRPS float64
}

// Budgeted is the payment client a member gives its share to
// (payment.Client).
type Budgeted interface {
	// SetAccountShare lets it send rps requests a second until until.
	SetAccountShare(rps float64, until time.Time)
	// RateLimited is how many 429s the provider answered it so far.
	RateLimited() uint64
}

// Follower applies the group's charging state (payment.Client,
// consumer.Consumer).
type Follower interface {
	SetPaused(paused bool)
}

// Member is one replica in its fleet.
type Member struct {
	db      *sqlx.DB
	cfg     Config
	client  Budgeted
	metrics *metrics.Metrics
	log     *slog.Logger

	mu        sync.Mutex
	state     State // the charging state applied
	followers []Follower
	share     float64   // the share in use
	short     bool      // it is below its equal part: renew sooner
	until     time.Time // when it lapses, by this process's clock
	limited   uint64    // the client's 429s already reported
	failing   time.Time // when renewals began to fail; zero while they succeed
	warned    time.Time // when that was last said
	mixed     bool      // warned that the members' limits differ
}

// NewMember returns the member of cfg's group that gives its shares to
// client (which sends nothing meanwhile, when the budget is shared).
func NewMember(db *sqlx.DB, cfg Config, client Budgeted, m *metrics.Metrics, log *slog.Logger) *Member {
	return &Member{db: db, cfg: cfg, client: client, metrics: m, log: log}
}

// shared reports whether the group's replicas share a budget.
func (m *Member) shared() bool { return m.cfg.AccountMaxRPS > 0 }

// Join renews for the first time: the member takes what is free of the
// budget and learns the charging state, which applies to the followers
// that follow from now on. A replica that starts while charging is paused
// starts paused: serve joins before it consumes.
func (m *Member) Join(ctx context.Context) error {
	return m.renew(ctx)
}

// Follow applies the charging state to f now and at every change.
func (m *Member) Follow(f Follower) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.followers = append(m.followers, f)
	f.SetPaused(m.state.Paused)
}

// Paused reports whether the member applies a pause of charging.
func (m *Member) Paused() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state.Paused
}

// Run renews every Interval until ctx ends. A renewal that fails is tried
// again at the next interval; meanwhile the share lapses at its lease's
// end and the client sends nothing, and the charging state stays as last
// read.
func (m *Member) Run(ctx context.Context) {
	next := time.NewTimer(m.interval())
	defer next.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-next.C:
		}
		// A renewal that cannot answer before the lease would lapse
		// anyway is no use.
		rctx, cancel := context.WithTimeout(ctx, LeaseTTL-leaseMargin)
		err := m.renew(rctx)
		cancel()
		if ctx.Err() == nil {
			m.renewed(err)
		}
		next.Reset(m.interval())
	}
}

// interval is how long until the next renewal: shortInterval while the
// member holds less than its equal part of the budget, else Interval.
func (m *Member) interval() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.short {
		return shortInterval
	}
	return Interval
}

// renewed says when renewals begin to fail (and once a minute while they
// do) and when they succeed again, and zeroes the share's gauge once its
// lease lapsed.
func (m *Member) renewed(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case err == nil && !m.failing.IsZero():
		m.log.Info("fleet membership renewed again", "group", m.cfg.Group, "failed_for", time.Since(m.failing))
		m.failing = time.Time{}
	case err == nil:
	case m.failing.IsZero():
		m.failing, m.warned = time.Now(), time.Now()
		m.log.Warn("cannot renew this replica's place in the fleet; it keeps the charging state it last read, and with a shared budget it sends nothing once its share's lease lapses",
			"group", m.cfg.Group, "err", err, "lease", LeaseTTL)
	case time.Since(m.warned) >= time.Minute:
		m.warned = time.Now()
		m.log.Warn("still cannot renew this replica's place in the fleet", "group", m.cfg.Group, "err", err, "failing_for", time.Since(m.failing))
	}
	if m.shared() && !time.Now().Before(m.until) {
		m.metrics.AccountShare.Set(0)
	}
}

// Leave gives the member's share back and removes its row, so that the
// others take its share at their next renewal. serve calls it once it
// sends no more requests; a member that never leaves (killed) is counted
// until its row expires.
func (m *Member) Leave(ctx context.Context) error {
	if m.shared() {
		m.client.SetAccountShare(0, time.Time{})
		m.metrics.AccountShare.Set(0)
	}
	const q = `DELETE FROM fleet_member WHERE consumer_group = $1 AND instance = $2`
	if _, err := m.db.ExecContext(ctx, q, m.cfg.Group, m.cfg.Instance); err != nil {
		return fmt.Errorf("leave the fleet: %w", err)
	}
	return nil
}

// renew renews the member's row in one transaction: its share of the
// budget and the charging state it applies.
func (m *Member) renew(ctx context.Context) error {
	asked := time.Now()
	limited := uint64(0)
	if m.shared() {
		limited = m.client.RateLimited()
	}
	var share float64
	err := postgres.InTx(ctx, m.db, func(tx *sqlx.Tx) error {
		share = 0
		if m.shared() {
			var err error
			if share, err = m.takeShare(ctx, tx, limited > m.limited); err != nil {
				return err
			}
		}
		st, err := readState(ctx, tx, m.cfg.Group, false)
		if err != nil {
			return err
		}
		m.apply(st)
		const q = `
INSERT INTO fleet_member AS f (consumer_group, instance, share, account_rps, applied_version, paused, renewed_at, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, now(), now() + $7::bigint * interval '1 millisecond')
ON CONFLICT (consumer_group, instance) DO UPDATE SET share = excluded.share, account_rps = excluded.account_rps,
    applied_version = excluded.applied_version, paused = excluded.paused, renewed_at = excluded.renewed_at, expires_at = excluded.expires_at`
		if _, err := tx.ExecContext(ctx, q, m.cfg.Group, m.cfg.Instance, share, m.cfg.AccountMaxRPS, st.Version, st.Paused, LeaseTTL.Milliseconds()); err != nil {
			return fmt.Errorf("renew the fleet member: %w", err)
		}
		const forget = `DELETE FROM fleet_member WHERE consumer_group = $1 AND expires_at < now() - $2::bigint * interval '1 second'`
		if _, err := tx.ExecContext(ctx, forget, m.cfg.Group, int64(forgetAfter.Seconds())); err != nil {
			return fmt.Errorf("forget the fleet's members gone: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if m.shared() {
		m.mu.Lock()
		m.limited, m.share, m.until = limited, share, asked.Add(LeaseTTL-leaseMargin)
		m.client.SetAccountShare(share, m.until)
		m.mu.Unlock()
		m.metrics.AccountShare.Set(share)
	}
	return nil
}

// budgetRow is payment_budget's row as read.
type budgetRow struct {
	RPS       float64      `db:"rps"`
	LimitedAt sql.NullTime `db:"limited_at"`
	CutAt     sql.NullTime `db:"cut_at"`
	RaisedAt  sql.NullTime `db:"raised_at"`
	Now       time.Time    `db:"now"`
}

// takeShare locks the group's budget, moves it by the 429s reported
// (limited), and returns the member's share of it. A share smaller than
// the one in use applies at once, before the transaction commits: the
// others may take the difference as soon as it has.
func (m *Member) takeShare(ctx context.Context, tx *sqlx.Tx, limited bool) (float64, error) {
	const create = `INSERT INTO payment_budget (consumer_group, rps) VALUES ($1, $2) ON CONFLICT (consumer_group) DO NOTHING`
	if _, err := tx.ExecContext(ctx, create, m.cfg.Group, m.cfg.AccountMaxRPS); err != nil {
		return 0, fmt.Errorf("create the group's payment budget: %w", err)
	}
	var row budgetRow
	const lock = `SELECT rps, limited_at, cut_at, raised_at, now() AS now FROM payment_budget WHERE consumer_group = $1 FOR UPDATE`
	if err := tx.GetContext(ctx, &row, lock, m.cfg.Group); err != nil {
		return 0, fmt.Errorf("lock the group's payment budget: %w", err)
	}
	var others []struct {
		Share      float64 `db:"share"`
		AccountRPS float64 `db:"account_rps"`
	}
	const live = `SELECT share, account_rps FROM fleet_member WHERE consumer_group = $1 AND instance <> $2 AND expires_at > now()`
	if err := tx.SelectContext(ctx, &others, live, m.cfg.Group, m.cfg.Instance); err != nil {
		return 0, fmt.Errorf("read the fleet's shares: %w", err)
	}
	shares := make([]float64, len(others))
	limits := make([]float64, len(others))
	for i, o := range others {
		shares[i], limits[i] = o.Share, o.AccountRPS
	}
	m.checkLimits(limits)

	before := budget{RPS: row.RPS, LimitedAt: row.LimitedAt.Time, CutAt: row.CutAt.Time, RaisedAt: row.RaisedAt.Time}
	after := adjust(before, ceilingOf(m.cfg.AccountMaxRPS, limits), limited, row.Now)
	if after != before {
		const q = `UPDATE payment_budget SET rps = $2, limited_at = $3, cut_at = $4, raised_at = $5 WHERE consumer_group = $1`
		if _, err := tx.ExecContext(ctx, q, m.cfg.Group, after.RPS, nullTime(after.LimitedAt), nullTime(after.CutAt), nullTime(after.RaisedAt)); err != nil {
			return 0, fmt.Errorf("record the group's payment budget: %w", err)
		}
		if after.CutAt != before.CutAt {
			m.log.Warn("the provider answered 429: the group's payment budget is cut", "group", m.cfg.Group, "from_rps", before.RPS, "to_rps", after.RPS)
		}
	}
	m.metrics.AccountBudget.Set(after.RPS)
	share := shareOf(after.RPS, shares)
	m.mu.Lock()
	m.short = share < math.Floor(after.RPS/float64(len(shares)+1))
	if share < m.share {
		m.share = share
		m.client.SetAccountShare(share, m.until)
	}
	m.mu.Unlock()
	return share, nil
}

// checkLimits warns, once, when the live members do not agree on
// PAYMENT_ACCOUNT_MAX_RPS: the lowest applies to those that set one, and a
// replica without one is bounded by nothing but its own PAYMENT_MAX_RPS.
func (m *Member) checkLimits(limits []float64) {
	for _, l := range limits {
		if l != m.cfg.AccountMaxRPS && !m.mixed {
			m.mixed = true
			m.log.Warn("the replicas of the group run with different PAYMENT_ACCOUNT_MAX_RPS (a rollout of a new value?): the lowest set applies to the budget, and a replica without one is not bounded by it",
				"group", m.cfg.Group, "own", m.cfg.AccountMaxRPS, "other", l)
		}
	}
}

// apply makes st the charging state in force for the followers.
func (m *Member) apply(st State) {
	m.mu.Lock()
	defer m.mu.Unlock()
	changed := st.Paused != m.state.Paused
	m.state = st
	paused, since := 0.0, 0.0
	if st.Paused {
		paused, since = 1, st.For.Seconds()
	}
	m.metrics.ChargingPaused.Set(paused)
	m.metrics.ChargingPausedSeconds.Set(since)
	if !changed {
		return
	}
	for _, f := range m.followers {
		f.SetPaused(st.Paused)
	}
	if st.Paused {
		m.log.Warn("charging paused by an operator: no request that could create a payment is sent and fetching is paused, the group and readiness unchanged",
			"group", m.cfg.Group, "since", st.Since, "by", st.By, "reason", st.Reason, "version", st.Version)
		return
	}
	m.log.Info("charging resumed", "group", m.cfg.Group, "by", st.By, "reason", st.Reason, "version", st.Version)
}

func nullTime(t time.Time) sql.NullTime { return sql.NullTime{Time: t, Valid: !t.IsZero()} }
