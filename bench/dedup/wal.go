package main

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"time"
)

// walWindow measures the WAL written between begin and end.
//
// The server's WAL position covers every database, and other engineers'
// tests write WAL too, so the records that touch this database's relations
// are read back with pg_walinspect. The WAL must still be there to be read:
// other sessions' checkpoints (a DROP DATABASE forces one) recycle old
// segments within seconds. A temporary physical replication slot keeps it;
// the server drops such a slot itself when its session ends, so a benchmark
// that dies leaves none behind.
type walWindow struct {
	b     *bench
	conn  *sql.Conn // holds the slot
	slot  string    // "" without one: the cluster figure only
	start string
	ckpt  int64
}

func (b *bench) beginWAL(ctx context.Context) (*walWindow, error) {
	w := &walWindow{b: b}
	if b.hasWalInspect {
		conn, err := b.ctl.Conn(ctx)
		if err != nil {
			return nil, fmt.Errorf("wal window: %w", err)
		}
		slot := "bench_dedup_" + randomHex(4)
		if _, err := conn.ExecContext(ctx, `SELECT pg_create_physical_replication_slot($1, true, true)`, slot); err != nil {
			b.log.Warn("no replication slot to keep the WAL: the WAL figure is the whole cluster's", "err", err)
			conn.Close()
		} else {
			w.conn, w.slot = conn, slot
		}
	}
	if err := b.ctl.QueryRowContext(ctx, `SELECT pg_current_wal_lsn()::text, (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter)`).Scan(&w.start, &w.ckpt); err != nil {
		w.close()
		return nil, fmt.Errorf("wal position: %w", err)
	}
	return w, nil
}

// stop measures the WAL position and checkpoints since begin: call it as
// soon as the measured work ends.
func (w *walWindow) stop(ctx context.Context) (WAL, error) {
	r := WAL{Ours: -1, OursFPI: -1}
	var ckpt int64
	if err := w.b.ctl.QueryRowContext(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint, (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter)`,
		w.start).Scan(&r.Cluster, &ckpt); err != nil {
		return r, fmt.Errorf("wal position: %w", err)
	}
	r.Checkpoints = max(ckpt-w.ckpt, 0)
	return r, nil
}

// readBack adds to r this database's part of the WAL since begin and
// releases the slot. It reads up to what is flushed: with
// synchronous_commit=off, call it a second after stop, when the WAL writer
// (every 200ms) has flushed the last commits.
func (w *walWindow) readBack(ctx context.Context, r WAL) WAL {
	defer w.close()
	if w.slot == "" {
		return r
	}
	const q = `
SELECT coalesce(sum(record_length), 0)::bigint, coalesce(sum(fpi_length), 0)::bigint
FROM pg_get_wal_records_info($1::pg_lsn, pg_current_wal_flush_lsn())
WHERE block_ref LIKE '% rel %/' || (SELECT oid FROM pg_database WHERE datname = current_database()) || '/%'`
	if err := w.conn.QueryRowContext(ctx, q, w.start).Scan(&r.Ours, &r.OursFPI); err != nil {
		w.b.log.Warn("cannot read the WAL back: the WAL figure is the whole cluster's", "err", err)
		r.Ours, r.OursFPI = -1, -1
	}
	return r
}

func (w *walWindow) close() {
	if w.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := w.conn.ExecContext(ctx, `SELECT pg_drop_replication_slot($1)`, w.slot); err != nil {
		// Discard the session instead: its end drops the temporary slot.
		w.conn.Raw(func(any) error { return driver.ErrBadConn }) //nolint:errcheck // the error is the point
	}
	w.conn.Close()
	w.conn = nil
}
