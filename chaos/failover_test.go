//go:build chaos

package chaos_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// preparePair gives the run a primary and a standby of its own (sync or
// async replication), billing's database on them through the endpoint.
func preparePair(sync bool) func(r *run) error {
	return func(r *run) error {
		p, err := startPair(r.dir, sync, uint64(r.seed))
		if err != nil {
			return err
		}
		r.t.Cleanup(p.close)
		r.pair, r.server = p, p
		mode := "asynchronous"
		if sync {
			mode = "synchronous (synchronous_standby_names '*', synchronous_commit on)"
		}
		r.t.Logf("PostgreSQL primary on 127.0.0.1:%d, standby on 127.0.0.1:%d replicating through 127.0.0.1:%d, %s; billing connects through the endpoint 127.0.0.1:%d",
			p.primary.port, p.standby.port, p.link.port(), mode, p.endpoint.port())
		return nil
	}
}

// pg-failover-sync and pg-failover-async: under load, the primary dies
// (kill -9 of all its processes); the endpoint, still pointing at it, leads
// nowhere for a moment (/readyz 503); then it is pointed at the standby
// while that is still in recovery (/readyz 503 saying so: it takes no
// writes), the standby is promoted, and /readyz is 200 again. With async,
// the replication link is cut for 4-6s first, while billing commits on
// the primary: the promoted standby lacks those commits (claims, settles,
// outbox rows) that billing saw acknowledged, while Kafka holds offsets
// committed past them and the provider holds the charges. Figures: what
// the failover lost, the time from the kill to ready and to lag 0 (see
// checkFailover). Required: verify's nothing charged twice and nothing
// lost, each outcome announced once: with async, every event whose effect
// the database lost must be processed again.
func injectFailover(r *run) {
	rng := r.rng("failover")
	p := r.pair
	r.sleepUntil(between(rng, 8*time.Second, 10*time.Second))
	if !p.sync {
		hold := between(rng, 4*time.Second, 6*time.Second)
		r.fault("replication-cut", "the standby's replication connection closed and refused for %s before the primary dies", hold.Round(100*time.Millisecond))
		p.link.cut()
		time.Sleep(hold)
	}

	// What the primary holds right before it dies, and what the standby
	// received.
	before, err := countRows(p.primary, r.dbName, "pg_current_wal_lsn()")
	if err != nil {
		r.t.Errorf("failover: %v", err)
	}
	received, err := countRows(p.standby, r.dbName, "pg_last_wal_receive_lsn()")
	if err != nil {
		r.t.Errorf("failover: %v", err)
	}
	killed := time.Now()
	r.mu.Lock()
	r.faultStart = killed
	r.mu.Unlock()
	if err := p.primary.kill9(); err != nil {
		r.t.Errorf("failover: kill the primary: %v", err)
		return
	}
	r.fault("pg-kill-9", "primary (127.0.0.1:%d) killed with SIGKILL at WAL %s; the standby had received up to %s", p.primary.port, before.LSN, received.LSN)
	r.checkReadyz(http.StatusServiceUnavailable, 10*time.Second)

	// The endpoint moves to the standby, still in recovery: billing can
	// read, not write, and must not say it is ready.
	time.Sleep(between(rng, time.Second, 2*time.Second))
	p.endpoint.setTarget(fmt.Sprintf("127.0.0.1:%d", p.standby.port))
	r.fault("endpoint-moved", "endpoint 127.0.0.1:%d now leads to the standby 127.0.0.1:%d, still in recovery", p.endpoint.port(), p.standby.port)
	for _, c := range r.running() {
		if took, last, ok := waitReadyzBody(c, http.StatusServiceUnavailable, 15*time.Second, "recovery"); ok {
			r.t.Logf("[+%s] %s /readyz 503 naming the recovery %s after the endpoint moved", r.elapsed(), c.name, took.Round(100*time.Millisecond))
		} else {
			r.t.Errorf("%s /readyz while the endpoint leads to a standby in recovery: want 503 naming it within 15s, last %s", c.name, last)
		}
	}
	time.Sleep(between(rng, 2*time.Second, 3*time.Second))
	if err := p.standby.promote(); err != nil {
		r.t.Errorf("failover: %v", err)
		return
	}
	r.faultOver()
	r.t.Logf("[+%s] standby promoted, %s after the kill", r.elapsed(), time.Since(killed).Round(100*time.Millisecond))

	after, err := countRows(p.standby, r.dbName, "pg_current_wal_lsn()")
	if err != nil {
		r.t.Errorf("failover: %v", err)
	}
	lostWAL, _ := lsnBytes(p.standby, received.LSN, before.LSN)
	lost := dbCounts{
		Processed: max(before.Processed-after.Processed, 0), Charges: max(before.Charges-after.Charges, 0),
		Settled: max(before.Settled-after.Settled, 0),
	}
	// The outbox is left out: the relay deletes what it published, so its
	// rows come and go (every settle counted here recorded its outcome).
	r.figure("failover lost %d processed_event rows, %d charge rows, %d settles (%d bytes of WAL the standby never received)",
		lost.Processed, lost.Charges, lost.Settled, max(lostWAL, 0))
	switch {
	case p.sync && lost != (dbCounts{}):
		r.t.Errorf("synchronous replication, yet the promoted standby lacks commits the primary had acknowledged: %+v", lost)
	case !p.sync && lost.Processed == 0 && lost.Settled == 0:
		r.t.Errorf("the promoted standby lost no commit: the replication cut caught nothing, the scenario proves nothing")
	}

	ready := true
	for _, c := range r.running() {
		if _, last, ok := waitReadyzBody(c, http.StatusOK, 30*time.Second); !ok {
			ready = false
			r.t.Errorf("%s /readyz not 200 within 30s of the promotion: %s", c.name, last)
		}
	}
	if ready {
		r.figure("all ready %s after the kill", time.Since(killed).Round(100*time.Millisecond))
	}
}

// checkFailover prints the time from the kill to lag 0 and, for the
// failover that lost commits, what billing did about it.
func checkFailover(r *run) {
	r.mu.Lock()
	killed, lagZero := r.faultStart, r.lagZero
	r.mu.Unlock()
	if !lagZero.IsZero() {
		r.figure("lag 0 %s after the kill", lagZero.Sub(killed).Round(100*time.Millisecond))
	}
	if r.pair.sync {
		return
	}
	rewinds, err := r.metricSum("billing_consumer_rewinds_total")
	if err != nil {
		r.t.Errorf("scrape /metrics: %v", err)
		return
	}
	rewound, err := r.metricSum("billing_consumer_rewound_messages_total")
	if err != nil {
		r.t.Errorf("scrape /metrics: %v", err)
		return
	}
	r.figure("%.0f partitions rewound to the database's position, %.0f messages consumed again (billing_consumer_rewinds_total, billing_consumer_rewound_messages_total)", rewinds, rewound)
}

// prepareDiskFull gives the run a PostgreSQL cluster of its own whose data
// directory is on a small tmpfs, its WAL (initdb -X) on the suite's disk:
// WAL that cannot be written makes PostgreSQL PANIC, a data file that
// cannot grow fails its statement with SQLSTATE 53100 (disk_full).
func prepareDiskFull(r *run) error {
	dir := filepath.Join(r.dir, "pg-disk")
	c, err := newCluster(dir, pgOptions{wal: filepath.Join(dir, "wal")})
	if err != nil {
		return err
	}
	uid, gid := os.Getuid(), os.Getgid()
	if c.cred != nil {
		uid, gid = int(c.cred.Uid), int(c.cred.Gid)
	}
	disk, err := mountTmpfs(filepath.Join(r.dir, "pg-tmpfs"), diskSize, uid, gid)
	if err != nil {
		return err
	}
	r.t.Cleanup(func() {
		if err := disk.unmount(); err != nil {
			r.t.Errorf("unmount %s: %v", disk.dir, err)
		}
	})
	c.data = filepath.Join(disk.dir, "data")
	if err := c.initdb(); err != nil {
		return err
	}
	if err := c.start(); err != nil {
		return err
	}
	r.t.Cleanup(c.close)
	free, _ := disk.free()
	r.t.Logf("PostgreSQL on 127.0.0.1:%d, data directory on a %d MiB tmpfs (%s, %d MiB free), WAL in %s", c.port, diskSize>>20, disk.dir, free>>20, c.opts.wal)
	r.server, r.disk, r.diskPG = c, disk, c
	return nil
}

// diskSize is the tmpfs under the data directory: initdb takes 23 MiB,
// billing's database 8 MiB more, and the run's rows a few MiB.
const diskSize = 64 << 20

// pg-disk-full: under load, the database's filesystem is filled (a file
// takes every free byte) for 12-15s, then the file is removed. Required:
// an outage, not bad events: retried, never skipped nor parked (verify:
// the DLQ holds the invalid messages only), /readyz 503 naming the full
// disk (SQLSTATE 53100) while writes fail, counted in
// billing_db_errors_total{sqlstate="53100"} (checkDiskFull), and nothing
// charged twice or lost once the space is back.
func injectDiskFull(r *run) {
	rng := r.rng("disk-full")
	r.sleepUntil(between(rng, 6*time.Second, 8*time.Second))
	filler := filepath.Join(r.disk.dir, "filler")
	written, err := r.disk.fill(filler)
	if err != nil {
		r.t.Errorf("disk-full: fill %s: %v", filler, err)
		return
	}
	full := time.Now()
	r.mu.Lock()
	r.faultStart = full
	r.mu.Unlock()
	left, _ := r.disk.free()
	hold := between(rng, 12*time.Second, 15*time.Second)
	r.fault("disk-full", "the data directory's filesystem filled (%d MiB written, %d bytes left) for %s", written>>20, left, hold.Round(100*time.Millisecond))
	for _, c := range r.running() {
		if took, last, ok := waitReadyzBody(c, http.StatusServiceUnavailable, 10*time.Second, "53100", "disk full"); ok {
			r.t.Logf("[+%s] %s /readyz 503 naming the full disk %s after it filled", r.elapsed(), c.name, took.Round(100*time.Millisecond))
		} else {
			r.t.Errorf("%s /readyz while the database's disk is full: want 503 naming it (53100, disk full) within 10s, last %s", c.name, last)
		}
	}
	sleepFor(full, hold)
	failed := strings.Count(tailFile(r.diskPG.logPath, 100000), "No space left on device")
	if err := os.Remove(filler); err != nil {
		r.t.Errorf("disk-full: remove %s: %v", filler, err)
		return
	}
	r.faultOver()
	r.figure("PostgreSQL logged %d writes failing for space", failed)
	if failed == 0 {
		r.t.Errorf("PostgreSQL logged no write failing for space while the disk was full: the scenario proves nothing")
	}
	r.checkReadyz(http.StatusOK, 30*time.Second)
}

// checkDiskFull checks that the full disk was counted by SQLSTATE.
func checkDiskFull(r *run) {
	n, err := r.metricSum("billing_db_errors_total", `sqlstate="53100"`)
	if err != nil {
		r.t.Errorf("scrape /metrics: %v", err)
		return
	}
	r.figure(`billing_db_errors_total{sqlstate="53100"} %.0f`, n)
	if n == 0 {
		r.t.Errorf(`billing_db_errors_total{sqlstate="53100"} is 0 on every replica: no metric says why the database failed`)
	}
}
