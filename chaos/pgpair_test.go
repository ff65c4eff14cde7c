//go:build chaos

package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"example.com/billing/internal/dev/pgserver"
	"example.com/billing/internal/postgres"
)

// pgPair is a primary and a streaming standby of a scenario's own, with
// billing (every replica, migrate and the suite's checks) connected through
// endpoint, a TCP proxy the suite points at the primary and, after a
// failover, at the standby: lib/pq has no multi-host failover, so
// production puts a virtual IP, a DNS name or a proxy (PgBouncer, HAProxy)
// there. The standby replicates through link, a second proxy, so that the
// replication can be cut while the primary takes writes.
type pgPair struct {
	primary, standby *pgCluster
	endpoint, link   *tcpProxy
	sync             bool
}

// startPair creates the primary (initdb), its standby (pg_basebackup -R
// through link) and the endpoint. With sync, commits wait for the standby
// (synchronous_standby_names '*', synchronous_commit on); without, the
// standby may lag behind what the primary acknowledged.
func startPair(dir string, sync bool, seed uint64) (_ *pgPair, err error) {
	p := &pgPair{sync: sync}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	if p.primary, err = newCluster(filepath.Join(dir, "primary"), pgOptions{}); err != nil {
		return nil, err
	}
	if err := p.primary.initdb(); err != nil {
		return nil, err
	}
	if err := p.primary.start(); err != nil {
		return nil, err
	}
	primaryAddr := fmt.Sprintf("127.0.0.1:%d", p.primary.port)
	if p.link, err = startProxy("replication", primaryAddr, seed); err != nil {
		return nil, err
	}
	if p.standby, err = newCluster(filepath.Join(dir, "standby"), pgOptions{}); err != nil {
		return nil, err
	}
	// -R writes primary_conninfo (through link) and standby.signal.
	bb := p.standby.command(pgBin("pg_basebackup"), "-h", "127.0.0.1", "-p", fmt.Sprint(p.link.port()), "-U", "postgres",
		"-D", p.standby.data, "-R", "-X", "stream", "-c", "fast", "--no-sync")
	if out, err := bb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pg_basebackup: %w\n%s", err, out)
	}
	if err := p.standby.start(); err != nil {
		return nil, err
	}
	if err := p.waitStreaming(time.Minute); err != nil {
		return nil, err
	}
	if sync {
		// Set once the standby streams: before, every commit would wait.
		if err := p.primaryExec(`ALTER SYSTEM SET synchronous_standby_names = '*'`, `SELECT pg_reload_conf()`); err != nil {
			return nil, err
		}
		if err := p.waitSyncState("sync", 30*time.Second); err != nil {
			return nil, err
		}
	}
	if p.endpoint, err = startProxy("endpoint", primaryAddr, seed+1); err != nil {
		return nil, err
	}
	return p, nil
}

// URL is the URL of database name through the endpoint.
func (p *pgPair) URL(name string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", p.endpoint.addr(), name)
}

// createDatabase creates database name through the endpoint.
func (p *pgPair) createDatabase(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := pgserver.Recreate(ctx, p.URL("postgres"), name)
	return err
}

func (p *pgPair) primaryExec(stmts ...string) error {
	db, err := postgres.Open(p.primary.URL("postgres"), 1)
	if err != nil {
		return err
	}
	defer db.Close()
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// waitStreaming waits until the primary has a walsender streaming to the
// standby.
func (p *pgPair) waitStreaming(timeout time.Duration) error {
	return p.waitSyncState("", timeout)
}

// waitSyncState waits until the primary's standby streams and, when want
// is set, has that sync_state (sync, async).
func (p *pgPair) waitSyncState(want string, timeout time.Duration) error {
	db, err := postgres.Open(p.primary.URL("postgres"), 1)
	if err != nil {
		return err
	}
	defer db.Close()
	deadline := time.Now().Add(timeout)
	for {
		var state, sync string
		err := db.QueryRow(`SELECT state, sync_state FROM pg_stat_replication LIMIT 1`).Scan(&state, &sync)
		if err == nil && state == "streaming" && (want == "" || sync == want) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the standby does not stream (state %q, sync_state %q, want %q) within %s: %v", state, sync, want, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// close stops both servers and both proxies.
func (p *pgPair) close() {
	for _, x := range []*tcpProxy{p.endpoint, p.link} {
		if x != nil {
			x.close()
		}
	}
	for _, c := range []*pgCluster{p.primary, p.standby} {
		if c != nil {
			c.close()
		}
	}
}

// dbCounts are the rows billing wrote, as one server sees them.
type dbCounts struct {
	Processed int64  `db:"processed"`
	Charges   int64  `db:"charges"`
	Settled   int64  `db:"settled"`
	LSN       string `db:"lsn"`
}

// countRows reads dbCounts from database name of cluster c, directly (not
// through the endpoint). lsn is the expression of the server's WAL
// position to report.
func countRows(c *pgCluster, name, lsn string) (dbCounts, error) {
	db, err := postgres.Open(c.URL(name), 1)
	if err != nil {
		return dbCounts{}, err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n dbCounts
	err = db.GetContext(ctx, &n, `SELECT
		(SELECT count(*) FROM processed_event) AS processed,
		(SELECT count(*) FROM charge) AS charges,
		(SELECT count(*) FROM charge WHERE status <> 'pending') AS settled,
		coalesce(`+lsn+`::text, '') AS lsn`)
	if err != nil {
		return n, fmt.Errorf("count rows on port %d: %w", c.port, err)
	}
	return n, nil
}

// lsnBytes returns how many bytes of WAL lie between two LSNs.
func lsnBytes(c *pgCluster, from, to string) (int64, error) {
	if from == "" || to == "" {
		return 0, errors.New("no LSN")
	}
	db, err := postgres.Open(c.URL("postgres"), 1)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var n int64
	err = db.QueryRow(`SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint`, to, from).Scan(&n)
	return n, err
}
