package main

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"example.com/billing/internal/postgres"
)

// dbCost is what a scenario cost its database over the database window:
// from just before serve started (after a CHECKPOINT) until the group had
// committed every offset and the outbox relay had published every outcome
// it recorded. It starts before the throughput window and ends after it,
// because serve's first and the relay's last writes are the events' too.
type dbCost struct {
	measured bool // false on a server that is not the benchmark's own
	window   time.Duration
	// wal is the bytes between the two WAL positions: what a standby or
	// an archive receives, page headers and alignment included.
	wal int64
	// records, recordBytes and fpiBytes are pg_get_wal_stats' totals over
	// the window: the records, their bytes without full-page images, and
	// the full-page images' bytes.
	records, recordBytes, fpiBytes int64
	// commits are the write transactions (Transaction/COMMIT records; a
	// transaction that wrote nothing logs none), checkpoints the
	// checkpoint records in the window (0 unless one came uninvited).
	commits, checkpoints int64
	cpu                  time.Duration // the server's processes, from /proc
	byType               []walGroup    // by resource manager and record type
	// byRelation (0 ms only) attributes each record to the relation of
	// its first block reference.
	byRelation []walGroup
	// vacuum (0 ms only) is what a VACUUM of billing's tables wrote right
	// after the window: the dead rows the window left, paid for later.
	vacuum, vacuumFPI int64
}

// walGroup is a set of WAL records: a resource manager and record type
// ("Heap/HOT_UPDATE"), with the relation they touch when attributed.
type walGroup struct {
	relation string // "charge", "charge_pkey (index)", "" when not attributed
	kind     string
	count    int64
	bytes    int64 // without full-page images
	fpi      int64
}

// dbWindow is an open database window.
type dbWindow struct {
	pg      *pgCluster
	ctl     *sqlx.DB // the maintenance database, where pg_walinspect is
	start   lsn
	cpu0    time.Duration
	started time.Time
}

// beginDB checkpoints the benchmark's cluster and notes its WAL position
// and CPU: call it before serve starts. Nil without a cluster of our own.
func beginDB(ctx context.Context, pg *pgCluster) (*dbWindow, error) {
	if pg == nil {
		return nil, nil
	}
	ctl, err := postgres.Open(pg.URL("postgres"), 2)
	if err != nil {
		return nil, err
	}
	w := &dbWindow{pg: pg, ctl: ctl}
	// Every window starts right after a checkpoint, so every window logs
	// the same full-page images: the first change of each page it touches.
	if _, err := ctl.ExecContext(ctx, `CHECKPOINT`); err != nil {
		ctl.Close()
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	if w.start, err = w.position(ctx); err != nil {
		ctl.Close()
		return nil, err
	}
	if w.cpu0, err = serverCPU(pg.postmaster()); err != nil {
		ctl.Close()
		return nil, err
	}
	w.started = time.Now()
	return w, nil
}

// position is the end of the WAL inserted so far.
func (w *dbWindow) position(ctx context.Context) (lsn, error) {
	var s string
	if err := w.ctl.QueryRowContext(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&s); err != nil {
		return 0, fmt.Errorf("wal position: %w", err)
	}
	return parseLSN(s)
}

// flushedTo waits until the WAL up to at is flushed (the WAL writer does
// it within wal_writer_delay, 200 ms): pg_walinspect reads no further.
func (w *dbWindow) flushedTo(ctx context.Context, at lsn) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var s string
		if err := w.ctl.QueryRowContext(ctx, `SELECT pg_current_wal_flush_lsn()::text`).Scan(&s); err != nil {
			return fmt.Errorf("wal flush position: %w", err)
		}
		flushed, err := parseLSN(s)
		if err != nil {
			return err
		}
		if flushed >= walRecordStart(at) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("WAL flushed to %s, not yet to %s after 10 s", flushed, at)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WAL pages are 8 KiB and start with a header, 24 bytes, or 40 at the
// start of a 16 MiB segment.
const (
	walPage       = 8192
	walSegment    = 16 << 20
	walPageHeader = 24
	walLongHeader = 40
)

// walRecordStart is where the record at position at began to be written:
// at itself, or, when at is right after a page's header (a record ended on
// the page boundary, and the insert position moved past the next page's
// header), the page's start. Nothing was written there yet, so the flush
// position stays at the page's start and never reaches at.
func walRecordStart(at lsn) lsn {
	page := at - at%walPage
	header := lsn(walPageHeader)
	if page%walSegment == 0 {
		header = walLongHeader
	}
	if at-page == header {
		return page
	}
	return at
}

// end closes the window: the WAL and CPU since begin, the WAL by record
// type and, when detail is set, by relation of database dbName and what
// vacuuming billing's tables then writes.
func (w *dbWindow) end(ctx context.Context, dbName string, detail bool) (dbCost, error) {
	defer w.ctl.Close()
	c := dbCost{measured: true}
	stop, err := w.position(ctx)
	if err != nil {
		return c, err
	}
	cpu1, err := serverCPU(w.pg.postmaster())
	if err != nil {
		return c, err
	}
	c.window = time.Since(w.started)
	c.cpu = cpu1 - w.cpu0
	c.wal = int64(stop - w.start)
	if err := w.flushedTo(ctx, stop); err != nil {
		return c, err
	}
	if c.byType, err = walStats(ctx, w.ctl, w.start, stop); err != nil {
		return c, err
	}
	for _, g := range c.byType {
		c.records += g.count
		c.recordBytes += g.bytes
		c.fpiBytes += g.fpi
		switch g.kind {
		case "Transaction/COMMIT", "Transaction/COMMIT_PREPARED":
			c.commits += g.count
		case "XLOG/CHECKPOINT_ONLINE", "XLOG/CHECKPOINT_SHUTDOWN":
			c.checkpoints += g.count
		}
	}
	if !detail {
		return c, nil
	}
	if c.byRelation, err = walByRelation(ctx, w.ctl, w.pg.URL(dbName), w.start, stop); err != nil {
		return c, err
	}
	if c.vacuum, c.vacuumFPI, err = w.vacuum(ctx, dbName); err != nil {
		return c, err
	}
	return c, nil
}

// vacuum runs VACUUM on billing's tables in dbName and returns the WAL it
// wrote and the full-page images among it.
func (w *dbWindow) vacuum(ctx context.Context, dbName string) (wal, fpi int64, err error) {
	db, err := postgres.Open(w.pg.URL(dbName), 1)
	if err != nil {
		return 0, 0, err
	}
	defer db.Close()
	var tables []string
	if err := db.SelectContext(ctx, &tables, `
SELECT relname FROM pg_class
WHERE relname IN ('processed_event', 'charge', 'outbox', 'consumer_position') AND relnamespace = 'public'::regnamespace`); err != nil {
		return 0, 0, fmt.Errorf("billing's tables: %w", err)
	}
	if len(tables) == 0 {
		return 0, 0, nil
	}
	start, err := w.position(ctx)
	if err != nil {
		return 0, 0, err
	}
	if _, err := db.ExecContext(ctx, `VACUUM `+strings.Join(tables, ", ")); err != nil {
		return 0, 0, fmt.Errorf("vacuum: %w", err)
	}
	stop, err := w.position(ctx)
	if err != nil {
		return 0, 0, err
	}
	if err := w.flushedTo(ctx, stop); err != nil {
		return 0, 0, err
	}
	groups, err := walStats(ctx, w.ctl, start, stop)
	if err != nil {
		return 0, 0, err
	}
	for _, g := range groups {
		fpi += g.fpi
	}
	return int64(stop - start), fpi, nil
}

// walStats is pg_get_wal_stats by record type between from and to.
func walStats(ctx context.Context, ctl *sqlx.DB, from, to lsn) ([]walGroup, error) {
	rows, err := ctl.QueryContext(ctx, `
SELECT "resource_manager/record_type", count, record_size, fpi_size
FROM pg_get_wal_stats($1::pg_lsn, $2::pg_lsn, true) WHERE count > 0`, from.String(), to.String())
	if err != nil {
		return nil, fmt.Errorf("pg_get_wal_stats: %w", err)
	}
	defer rows.Close()
	var out []walGroup
	for rows.Next() {
		var g walGroup
		if err := rows.Scan(&g.kind, &g.count, &g.bytes, &g.fpi); err != nil {
			return nil, fmt.Errorf("pg_get_wal_stats: %w", err)
		}
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pg_get_wal_stats: %w", err)
	}
	sortGroups(out)
	return out, nil
}

// walByRelation reads every record between from and to
// (pg_get_wal_records_info) and groups them by record type and the
// relation of their first block reference, named in the database at
// dbURL: a partition by its partitioned table, an index by its partitioned
// index, with its fork when not the main one.
func walByRelation(ctx context.Context, ctl *sqlx.DB, dbURL string, from, to lsn) ([]walGroup, error) {
	// record_length counts the full-page images too: they are apart here,
	// as in pg_get_wal_stats.
	rows, err := ctl.QueryContext(ctx, `
SELECT resource_manager || '/' || record_type,
       coalesce(substring(block_ref from '^blkref #[0-9]+: rel ([0-9]+/[0-9]+/[0-9]+)'), ''),
       coalesce(substring(block_ref from '^blkref #[0-9]+: rel [0-9/]+ fork ([a-z]+)'), ''),
       count(*), sum(record_length - fpi_length), sum(fpi_length)
FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn)
GROUP BY 1, 2, 3`, from.String(), to.String())
	if err != nil {
		return nil, fmt.Errorf("pg_get_wal_records_info: %w", err)
	}
	defer rows.Close()
	type raw struct {
		kind, rel, fork string
		count, bytes    int64
		fpi             int64
	}
	var raws []raw
	for rows.Next() {
		var r raw
		if err := rows.Scan(&r.kind, &r.rel, &r.fork, &r.count, &r.bytes, &r.fpi); err != nil {
			return nil, fmt.Errorf("pg_get_wal_records_info: %w", err)
		}
		raws = append(raws, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pg_get_wal_records_info: %w", err)
	}
	db, err := postgres.Open(dbURL, 1)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	var dbOID uint32
	if err := db.QueryRowContext(ctx, `SELECT oid FROM pg_database WHERE datname = current_database()`).Scan(&dbOID); err != nil {
		return nil, fmt.Errorf("database oid: %w", err)
	}
	names := map[relPath]string{}
	merged := map[[2]string]*walGroup{}
	for _, r := range raws {
		name := "(no block: " + r.kind + ")"
		if r.rel != "" {
			p, err := parseRelPath(r.rel)
			if err != nil {
				return nil, err
			}
			n, ok := names[p]
			if !ok {
				if n, err = relationName(ctx, db, p, dbOID); err != nil {
					return nil, err
				}
				names[p] = n
			}
			name = n
			if r.fork != "main" && r.fork != "" {
				name += " [" + r.fork + "]"
			}
		}
		k := [2]string{name, r.kind}
		g, ok := merged[k]
		if !ok {
			g = &walGroup{relation: name, kind: r.kind}
			merged[k] = g
		}
		g.count += r.count
		g.bytes += r.bytes
		g.fpi += r.fpi
	}
	out := make([]walGroup, 0, len(merged))
	for _, g := range merged {
		out = append(out, *g)
	}
	sortGroups(out)
	return out, nil
}

// relationName names the relation at p for the tables: a partition by its
// root, an index as "<root index> (index)", a catalog or another
// database's relation as such.
func relationName(ctx context.Context, db *sqlx.DB, p relPath, dbOID uint32) (string, error) {
	switch {
	case p.db == 0:
		return fmt.Sprintf("shared catalog %d", p.node), nil
	case p.db != dbOID:
		return fmt.Sprintf("database %d, relation %d", p.db, p.node), nil
	}
	var name, kind sql.NullString
	err := db.QueryRowContext(ctx, `
SELECT coalesce(pg_partition_root(c.oid), c.oid)::regclass::text, c.relkind::text
FROM pg_class c WHERE c.oid = pg_filenode_relation($1, $2)`, p.spc, p.node).Scan(&name, &kind)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		// Dropped since (a detached partition), or a relation being
		// rewritten.
		return fmt.Sprintf("relfilenode %d (gone)", p.node), nil
	case err != nil:
		return "", fmt.Errorf("name relfilenode %d: %w", p.node, err)
	}
	switch kind.String {
	case "i", "I":
		return name.String + " (index)", nil
	case "t":
		return name.String + " (TOAST)", nil
	case "S":
		return name.String + " (sequence)", nil
	}
	return name.String, nil
}

// sortGroups puts the most bytes first.
func sortGroups(gs []walGroup) {
	slices.SortFunc(gs, func(a, b walGroup) int {
		return cmp.Or(cmp.Compare(b.bytes+b.fpi, a.bytes+a.fpi), strings.Compare(a.relation, b.relation), strings.Compare(a.kind, b.kind))
	})
}
