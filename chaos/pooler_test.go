//go:build chaos

package chaos_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"

	"example.com/billing/internal/postgres"
	"example.com/billing/internal/testenv/pgbouncer"
)

// Behind a transaction pooler (issue 40): the replicas of serve and two
// loops of billing maintain reach PostgreSQL through PgBouncer in
// transaction mode, where consecutive statements of one client run on
// whichever server session is free, and the pooler is killed with -9 and
// restarted twice while the stream runs (the second time for longer than
// the relay's lease). Beyond the common books: one relay at a time (the
// relays' tenures, from their logs: no two publish at once), no lease and
// no advisory lock left once every process stopped, maintain never skipped
// for a holder that is not running, and how many server sessions the
// clients shared. CHAOS_POOL_MODE=session runs the same through a pooler in
// session mode; CHAOS_POOL_SIZE sets default_pool_size.

// pooler is the scenario's PgBouncer in front of the suite's cluster, and
// the run's server: its URLs go through the pooler.
type pooler struct {
	direct  *pgCluster
	bouncer *pgbouncer.Bouncer
	mode    string
	size    int
	loops   []*maintainLoop

	stopSampling chan struct{}
	sampled      chan struct{}

	mu sync.Mutex
	// down are the pooler's outages, from the kill to the restart.
	down [][2]time.Time
	// The most clients, server sessions (in use by a client: active) and
	// PostgreSQL backends seen for the run's database, and clients waiting
	// for a server session.
	clients, servers, active, backends, waiting int
}

func (p *pooler) URL(name string) string           { return p.bouncer.URL(p.direct.URL(name)) }
func (p *pooler) createDatabase(name string) error { return p.direct.createDatabase(name) }

// poolMode is the pool mode the scenario runs in: CHAOS_POOL_MODE, by
// default transaction.
func poolMode() string {
	if os.Getenv("CHAOS_POOL_MODE") == pgbouncer.Session {
		return pgbouncer.Session
	}
	return pgbouncer.Transaction
}

// poolerAvailable says why the scenario cannot run here: no pgbouncer.
func poolerAvailable() error {
	_, err := pgbouncer.Binary()
	return err
}

// Pool sizes: in transaction mode fewer server sessions than the clients
// open connections (two replicas' pools of 16, two maintains' of 2); in
// session mode each client connection holds a server session as long as it
// lives, so the pool must hold them all.
const (
	transactionPoolSize = 10
	sessionPoolSize     = 80
)

func preparePooler(r *run) error {
	if err := suite.pg.ensureRunning(); err != nil {
		return err
	}
	p := &pooler{direct: suite.pg, mode: poolMode(), size: transactionPoolSize, stopSampling: make(chan struct{}), sampled: make(chan struct{})}
	if p.mode == pgbouncer.Session {
		p.size = sessionPoolSize
	}
	if n, err := strconv.Atoi(os.Getenv("CHAOS_POOL_SIZE")); err == nil && n > 0 {
		p.size = n
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := pgbouncer.Start(ctx, suite.pg.URL("postgres"), pgbouncer.Options{Mode: p.mode, PoolSize: p.size})
	if err != nil {
		return err
	}
	r.t.Cleanup(func() {
		if err := b.Close(); err != nil {
			r.t.Logf("pgbouncer: %v", err)
		}
	})
	p.bouncer = b
	r.pooler, r.server = p, p
	r.t.Logf("PgBouncer on 127.0.0.1:%d (pool_mode=%s, default_pool_size=%d) in front of PostgreSQL on 127.0.0.1:%d; its log: %s",
		b.Port, p.mode, p.size, suite.pg.port, b.LogPath())
	return nil
}

// sample records, every half second until stopped, the clients and server
// sessions of the run's database in the pooler (SHOW POOLS) and its
// backends in PostgreSQL.
func (p *pooler) sample(r *run) {
	defer close(p.sampled)
	db, err := postgres.Open(p.direct.URL(r.dbName), 1)
	if err != nil {
		r.t.Errorf("pooler: %v", err)
		return
	}
	defer db.Close()
	for {
		select {
		case <-p.stopSampling:
			return
		case <-time.After(500 * time.Millisecond):
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		pools, err := p.bouncer.Pools(ctx)
		var backends int
		berr := db.GetContext(ctx, &backends, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend' AND pid <> pg_backend_pid()`, r.dbName)
		cancel()
		p.mu.Lock()
		if berr == nil {
			p.backends = max(p.backends, backends)
		}
		for _, pl := range pools {
			if err == nil && pl.Database == r.dbName {
				p.clients = max(p.clients, pl.ClientsActive+pl.ClientsWaiting)
				p.servers = max(p.servers, pl.ServersActive+pl.ServersIdle+pl.ServersUsed)
				p.active = max(p.active, pl.ServersActive)
				p.waiting = max(p.waiting, pl.ClientsWaiting)
			}
		}
		p.mu.Unlock()
	}
}

// outage kills the pooler with -9 and starts it again after pause.
func (p *pooler) outage(r *run, pause time.Duration, why string) {
	r.fault("pooler-kill-9", "PgBouncer (pid %d) killed, restarted in %s (%s)", p.bouncer.Pid(), pause.Round(100*time.Millisecond), why)
	killed := time.Now()
	p.bouncer.Kill()
	time.Sleep(pause)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.bouncer.Restart(ctx); err != nil {
		r.t.Errorf("restart PgBouncer: %v", err)
	}
	p.mu.Lock()
	p.down = append(p.down, [2]time.Time{killed, time.Now()})
	p.mu.Unlock()
	r.faultOver()
}

// wasDown reports whether the pooler was down at some moment of [from, to].
func (p *pooler) wasDown(from, to time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range p.down {
		if from.Before(d[1]) && d[0].Before(to) {
			return true
		}
	}
	return false
}

func injectPooler(r *run) {
	p := r.pooler
	go p.sample(r)
	r.fault("maintain", "two loops of billing maintain, one run after another, through the pooler")
	p.loops = []*maintainLoop{r.startMaintainLoop("maintain-a"), r.startMaintainLoop("maintain-b")}
	rng := r.rng("pooler")
	d := r.stream.duration()
	r.sleepUntil(between(rng, d/6, d/4))
	p.outage(r, between(rng, 2*time.Second, 4*time.Second), "shorter than the relay's lease")

	// A migrate through the pooler, nothing pending: goose's lock table,
	// not a session lock whose unlock the pooler sends elsewhere.
	began := time.Now()
	mig, err := startProc("migrate-pooled", filepath.Join(r.dir, "migrate-pooled.log"), map[string]string{"DATABASE_URL": r.dsn}, nil, "migrate")
	if err != nil {
		r.t.Error(err)
	} else {
		<-mig.done
		if mig.exitErr != nil {
			r.t.Errorf("billing migrate through the pooler: %v\n%s", mig.exitErr, mig.tail(20))
		}
		r.figure("billing migrate through the pooler (%s mode), nothing pending: %s", p.mode, time.Since(began).Round(time.Millisecond))
	}

	r.sleepUntil(between(rng, d/2, 2*d/3))
	p.outage(r, between(rng, 11*time.Second, 13*time.Second), "longer than the relay's lease")
}

// tenure is one relay tenure, from a replica's log.
type tenure struct {
	proc                 string
	token                int64
	began, ended, lastTx time.Time
}

// relayTenures reads the relay's tenures from every serve log: from
// "relaying payment outcome events" to "stopped relaying payment outcome
// events" of the same lease token (to the process's exit when it died
// relaying), publishing from the first to its last send.
func (r *run) relayTenures() []tenure {
	r.mu.Lock()
	all := slices.Clone(r.all)
	r.mu.Unlock()
	var out []tenure
	for _, c := range all {
		f, err := os.Open(c.logPath)
		if err != nil {
			continue
		}
		open := map[int64]*tenure{}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if !strings.Contains(sc.Text(), "relaying payment outcome events") {
				continue
			}
			var l struct {
				Time     time.Time `json:"time"`
				Msg      string    `json:"msg"`
				Token    int64     `json:"lease_token"`
				LastSend time.Time `json:"last_send_ended"`
			}
			if json.Unmarshal(sc.Bytes(), &l) != nil {
				continue
			}
			switch l.Msg {
			case "relaying payment outcome events":
				open[l.Token] = &tenure{proc: c.name, token: l.Token, began: l.Time}
			case "stopped relaying payment outcome events":
				if t, ok := open[l.Token]; ok {
					t.ended, t.lastTx = l.Time, l.LastSend
					out = append(out, *t)
					delete(open, l.Token)
				}
			}
		}
		f.Close()
		for _, t := range open {
			t.ended = c.exitedAt
			if t.ended.IsZero() {
				t.ended = time.Now()
			}
			t.lastTx = t.ended // it may have sent until it died
			out = append(out, *t)
		}
	}
	slices.SortFunc(out, func(a, b tenure) int { return a.began.Compare(b.began) })
	return out
}

// overlap is how long [a0, a1] and [b0, b1] share.
func overlap(a0, a1, b0, b1 time.Time) time.Duration {
	from, to := a0, a1
	if b0.After(from) {
		from = b0
	}
	if b1.Before(to) {
		to = b1
	}
	return max(to.Sub(from), 0)
}

// holderPid is the process id in a lease holder's name (host/pid/random).
func holderPid(holder string) int {
	parts := strings.Split(holder, "/")
	if len(parts) != 3 {
		return 0
	}
	pid, _ := strconv.Atoi(parts[1])
	return pid
}

func checkPooler(r *run) {
	t := r.t
	p := r.pooler
	for _, l := range p.loops {
		l.finish()
	}
	close(p.stopSampling)
	<-p.sampled

	// serve said which pool mode it found, before it took anything.
	modes := map[string]int{}
	r.mu.Lock()
	all := slices.Clone(r.all)
	r.mu.Unlock()
	for _, c := range all {
		b, _ := os.ReadFile(c.logPath)
		for _, line := range strings.Split(string(b), "\n") {
			var l struct {
				Msg  string `json:"msg"`
				Mode string `json:"pool_mode"`
			}
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "database pool mode" {
				modes[l.Mode]++
			}
		}
	}
	if modes[p.mode] != len(all) || len(modes) != 1 {
		t.Errorf("pool modes logged by the %d serve processes: %v, want %s from each", len(all), modes, p.mode)
	}

	// Everything stops, then nothing may be held.
	r.stopAll()
	tenures := r.relayTenures()
	var tenureOverlap, sendOverlap time.Duration
	var tokens []int64
	for i, a := range tenures {
		tokens = append(tokens, a.token)
		for _, b := range tenures[i+1:] {
			if a.proc == b.proc {
				continue
			}
			tenureOverlap += overlap(a.began, a.ended, b.began, b.ended)
			if !a.lastTx.IsZero() && !b.lastTx.IsZero() {
				sendOverlap += overlap(a.began, a.lastTx, b.began, b.lastTx)
			}
		}
	}
	if !slices.IsSorted(tokens) {
		t.Errorf("relay tenures' lease tokens out of order: %v", tokens)
	}
	if sendOverlap > 0 {
		t.Errorf("two relays published at once for %s in all", sendOverlap)
	}
	var desc []string
	for _, tn := range tenures {
		desc = append(desc, fmt.Sprintf("%s token %d for %s", tn.proc, tn.token, tn.ended.Sub(tn.began).Round(100*time.Millisecond)))
	}
	t.Logf("relay tenures: %s", strings.Join(desc, "; "))

	db, err := postgres.Open(p.direct.URL(r.dbName), 1)
	if err != nil {
		t.Errorf("open the database directly: %v", err)
		return
	}
	defer db.Close()
	var leases, locks int
	if err := db.Get(&leases, `SELECT count(*) FROM billing_lease WHERE expires_at > now()`); err != nil {
		t.Error(err)
	}
	if err := db.Get(&locks, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`); err != nil {
		t.Error(err)
	}
	if leases != 0 || locks != 0 {
		t.Errorf("after every process stopped: %d leases and %d advisory locks held", leases, locks)
	}
	logLeases(r, db)

	runs, skipped, phantom, failed := 0, 0, 0, 0
	var ran []maintainRun
	for _, l := range p.loops {
		l.mu.Lock()
		runs += l.runs
		failed += len(l.failures)
		ran = append(ran, l.ran...)
		l.mu.Unlock()
	}
	// A holder that died holding a lease (its run failed while the pooler
	// was down, and so did its giving the lease back) keeps the others
	// away for the rest of the lease, never longer.
	var stale int
	var staleFor time.Duration
	for _, run := range ran {
		for _, h := range run.heldBy {
			skipped++
			gone, known := r.goneFor(holderPid(h), run.began, run.end)
			switch {
			case known && gone == 0:
			case known && gone <= maintainerLease:
				stale++
				staleFor = max(staleFor, gone)
			default:
				phantom++
				t.Errorf("a maintain run (pid %d, %s–%s) skipped for %s, which had not run for longer than a lease (%s)", run.pid,
					run.began.Format(time.StampMilli), run.end.Format(time.StampMilli), h, maintainerLease)
			}
		}
	}
	// A run that failed while the pooler was down is the outage's: billing
	// maintain exits non-zero when the database does not answer.
	failedDown := p.failedWhileDown()
	if failed > failedDown {
		for _, l := range p.loops {
			l.mu.Lock()
			t.Logf("maintain failures: %v", l.failures)
			l.mu.Unlock()
		}
		t.Errorf("%d maintain runs failed, %d of them while the pooler was down", failed, failedDown)
	}

	outcomes, err := r.readTopic(r.outcomeTopic)
	if err != nil {
		t.Errorf("read the outcome topic: %v", err)
	}
	ids := map[string]bool{}
	for _, m := range outcomes {
		var o struct {
			EventID string `json:"eventId"`
		}
		if json.Unmarshal(m.Value, &o) == nil {
			ids[o.EventID] = true
		}
	}

	p.mu.Lock()
	clients, servers, active, backends, waiting := p.clients, p.servers, p.active, p.backends, p.waiting
	p.mu.Unlock()
	r.figure("%s mode: %d relay tenures (tokens %v), overlapping tenures %s, publishing at once %s", p.mode, len(tenures), tokens,
		tenureOverlap.Round(time.Millisecond), sendOverlap)
	r.figure("after every process stopped: %d leases held, %d advisory locks", leases, locks)
	r.figure("maintain: %d runs, %d done, %d failed while the pooler was down; %d tables skipped: %d for a maintainer running, %d for one that had died holding its lease (at most %s before, within the lease's %s), %d for none",
		runs, runs-failed, failedDown, skipped, skipped-stale-phantom, stale, staleFor.Round(100*time.Millisecond), maintainerLease, phantom)
	r.figure("outcome topic: %d records, %d eventIds", len(outcomes), len(ids))
	r.figure("up to %d client connections on up to %d server sessions, up to %d of them linked to a client at once (sv_active: in transaction mode, a client's transaction; default_pool_size %d; PostgreSQL saw up to %d backends for the database; up to %d clients waited for one), sampled every 0.5 s",
		clients, servers, active, p.size, backends, waiting)
}

// failedWhileDown counts the maintain runs that failed while the pooler
// was down.
func (p *pooler) failedWhileDown() int {
	n := 0
	for _, l := range p.loops {
		l.mu.Lock()
		for _, f := range l.failedRuns {
			if p.wasDown(f.began, f.end) {
				n++
			}
		}
		l.mu.Unlock()
	}
	return n
}

// maintainerLease is how long a maintainer's lease lasts unless renewed
// (daytable's).
const maintainerLease = 15 * time.Second

// goneFor says whether a process of the run (serve, maintain) with pid is
// known, and how long before from it had exited: 0 when it ran at some
// moment of [from, to].
func (r *run) goneFor(pid int, from, to time.Time) (time.Duration, bool) {
	type life struct{ began, end time.Time }
	var lives []life
	r.mu.Lock()
	for _, c := range r.all {
		if c.pid() != pid {
			continue
		}
		end := time.Now()
		if c.exited() {
			end = c.exitedAt
		}
		lives = append(lives, life{c.started, end})
	}
	r.mu.Unlock()
	for _, l := range r.pooler.loops {
		l.mu.Lock()
		for _, m := range l.ran {
			if m.pid == pid {
				lives = append(lives, life{m.began, m.end})
			}
		}
		for _, f := range l.failedRuns {
			if f.pid == pid {
				lives = append(lives, life{f.began, f.end})
			}
		}
		l.mu.Unlock()
	}
	gone, known := time.Duration(-1), false
	for _, lf := range lives {
		if lf.began.Before(to) && from.Before(lf.end) {
			return 0, true
		}
		if lf.end.Before(from) && (!known || from.Sub(lf.end) < gone) {
			gone, known = from.Sub(lf.end), true
		}
	}
	return gone, known
}

// logLeases logs the leases' rows: the last holder and token of each.
func logLeases(r *run, db *sqlx.DB) {
	var rows []struct {
		Name   string    `db:"name"`
		Holder string    `db:"holder"`
		Token  int64     `db:"token"`
		Ends   time.Time `db:"expires_at"`
	}
	if err := db.Select(&rows, `SELECT name, holder, token, expires_at FROM billing_lease ORDER BY name`); err != nil {
		r.t.Error(err)
		return
	}
	for _, l := range rows {
		r.t.Logf("lease %s: last held by %s, token %d, given back or expired at %s", l.Name, l.Holder, l.Token, l.Ends.Format(time.StampMilli))
	}
}
