package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"example.com/billing/internal/dedup"
	"example.com/billing/internal/metrics"
	"github.com/prometheus/client_golang/prometheus"
)

// remover removes the day'th day (0: the oldest) of a table and says how
// many rows it removed (-1: it cannot tell), in how many transactions, the
// slowest of which took slowest.
type remover func(ctx context.Context, day int) (rows int64, txs int, slowest time.Duration, err error)

// removal runs remove on day of v's table and measures it: with nothing
// else writing, for its time, WAL and the bloat it leaves (and, without
// partitions, the VACUUM that clears it); or underLoad, for what concurrent
// inserts see meanwhile.
func (b *bench) removal(ctx context.Context, v variant, method string, remove remover, day int, underLoad bool) (RemoveResult, error) {
	rr := RemoveResult{Variant: v, Method: method, Day: b.dataStart.AddDate(0, 0, day).Format(time.DateOnly), UnderLoad: underLoad}
	// Count the day's rows beforehand: a count is no part of a removal.
	const count = `SELECT count(*) FROM %s WHERE event_id >= processed_event_bound($1::date) AND event_id < processed_event_bound($1::date + 1)`
	if err := b.ctl.GetContext(ctx, &rr.Rows, fmt.Sprintf(count, v.table()), rr.Day); err != nil {
		return rr, fmt.Errorf("count the day's rows: %w", err)
	}
	var err error
	if rr.Before, err = b.sizes(ctx, v, !underLoad); err != nil {
		return rr, err
	}
	if err := b.checkpoint(ctx); err != nil {
		return rr, err
	}
	ww, err := b.beginWAL(ctx)
	if err != nil {
		return rr, err
	}
	defer ww.close()
	timed := func() error {
		t0 := time.Now()
		var err error
		removed, txs, slowest, err := remove(ctx, day)
		rr.Took = time.Since(t0)
		rr.Batches, rr.Slowest = txs, slowest
		if err == nil && removed >= 0 && removed != rr.Rows {
			err = fmt.Errorf("removed %d rows of the %d counted", removed, rr.Rows)
		}
		return err
	}
	if underLoad {
		rr.InsBefore, rr.InsDuring, err = b.window(ctx, v, timed)
	} else {
		err = timed()
	}
	if err != nil {
		return rr, fmt.Errorf("%s: %w", method, err)
	}
	b.rows[v.Schema] -= rr.Rows
	if rr.WAL, err = ww.stop(ctx); err != nil {
		return rr, err
	}
	time.Sleep(time.Second) // for the WAL flush, and the statistics remove pushed out
	rr.WAL = ww.readBack(ctx, rr.WAL)
	c, err := b.counters(ctx, v.Schema)
	if err != nil {
		return rr, err
	}
	rr.DeadTuples = c.NDeadTup
	if rr.After, err = b.sizes(ctx, v, !underLoad); err != nil {
		return rr, err
	}
	if v.Partitioned || underLoad {
		b.log.Info("removed a day", "table", v.Name, "method", method, "under load", underLoad, "rows", rr.Rows,
			"took", rr.Took, "insert p99 before", rr.InsBefore.P99, "during", rr.InsDuring.P99)
		return rr, nil
	}

	// Without partitions the day's rows are dead tuples until a VACUUM
	// (autovacuum would start at 20% of the table dead, by default). Look at
	// them, then time the VACUUM that clears them.
	if b.hasStat {
		if err := b.ctl.QueryRowContext(ctx, `SELECT dead_tuple_percent, free_percent FROM pgstattuple($1::regclass)`,
			v.table()).Scan(&rr.DeadPct, &rr.FreePct); err != nil {
			return rr, fmt.Errorf("pgstattuple: %w", err)
		}
	}
	vw, err := b.beginWAL(ctx)
	if err != nil {
		return rr, err
	}
	defer vw.close()
	t0 := time.Now()
	if _, err := b.ctl.ExecContext(ctx, `VACUUM `+v.table()); err != nil {
		return rr, fmt.Errorf("vacuum after delete: %w", err)
	}
	rr.Vacuum = time.Since(t0)
	vwal, err := vw.stop(ctx)
	if err != nil {
		return rr, err
	}
	vwal = vw.readBack(ctx, vwal)
	rr.VacuumWAL = &vwal
	av, err := b.sizes(ctx, v, true)
	if err != nil {
		return rr, err
	}
	rr.AfterVacuum = &av
	if b.hasStat {
		if err := b.ctl.GetContext(ctx, &rr.FreePctVacuum, `SELECT free_percent FROM pgstattuple($1::regclass)`, v.table()); err != nil {
			return rr, fmt.Errorf("pgstattuple: %w", err)
		}
	}
	b.log.Info("removed a day", "table", v.Name, "method", method, "rows", rr.Rows, "transactions", rr.Batches,
		"took", rr.Took, "vacuum", rr.Vacuum)
	return rr, nil
}

// window measures concurrent inserts into v's table around remove: it
// inserts for a while alone, then runs remove, then inserts a while more.
func (b *bench) window(ctx context.Context, v variant, remove func() error) (before, during latencies, err error) {
	db, err := b.pool(ctx, v, "on")
	if err != nil {
		return before, during, err
	}
	defer db.Close()
	side := min(max(b.cfg.Duration/4, time.Second), 5*time.Second)
	stop := make(chan struct{})
	t0 := time.Now()
	var samples []sample
	var insErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		samples, insErr = b.insertLoad(ctx, db, v.Keys, t0, stop)
	}()
	sleep(ctx, side)
	from := time.Since(t0)
	remErr := remove()
	to := time.Since(t0)
	sleep(ctx, side)
	close(stop)
	<-done
	if err := errors.Join(remErr, insErr); err != nil {
		return before, during, err
	}
	for _, s := range samples {
		b.rows[v.Schema] += int64(s.Rows)
	}
	return summarize(samples, 0, from), summarize(samples, from, to), nil
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// dropPartition removes a day of billing's partitioned table the way
// billing does: dedup.Retention detaches its partition CONCURRENTLY, which
// does not block inserts, then drops it.
func (b *bench) dropPartition(ctx context.Context, day int) (int64, int, time.Duration, error) {
	d := b.dataStart.AddDate(0, 0, day)
	victim := "processed_event_p" + d.Format("20060102")
	// A retention whose horizon is the end of that day. keep is measured
	// from now, so Run's horizon can only fall a little later, never before
	// the end of the day: it drops that partition and no other.
	cut := d.AddDate(0, 0, 1)
	r := dedup.NewRetention(b.ctl, time.Since(cut), 3, metrics.New(prometheus.NewRegistry()), b.log)
	t0 := time.Now()
	rep, err := r.Run(ctx)
	if err != nil {
		return 0, 0, 0, err
	}
	took := time.Since(t0)
	if !slices.Equal(rep.Dropped, []string{victim}) {
		return 0, 0, 0, fmt.Errorf("retention dropped %v, want [%s]", rep.Dropped, victim)
	}
	return -1, 1, took, nil
}

// deleteDay removes a day of the unpartitioned v7 table by DELETEs of
// cfg.DeleteBatch rows, each its own transaction, walking the primary key
// from where the last batch ended (keyset pagination: no batch rescans the
// dead entries of the earlier ones). A v7 day is one key range; a v4 table
// would need one more index, on processed_at, to find a day at all.
func (b *bench) deleteDay(ctx context.Context, day int) (rows int64, txs int, slowest time.Duration, err error) {
	var lo, hi string
	d := b.dataStart.AddDate(0, 0, day).Format(time.DateOnly)
	if err := b.ctl.QueryRowContext(ctx, `SELECT processed_event_bound($1::date)::text, processed_event_bound($1::date + 1)::text`,
		d).Scan(&lo, &hi); err != nil {
		return 0, 0, 0, fmt.Errorf("day bounds: %w", err)
	}
	q := `
WITH batch AS (
    SELECT event_id, consumer_group FROM ` + plainV7.table() + `
    WHERE (event_id, consumer_group) > ($1::uuid, $2::text) AND event_id < $3::uuid
    ORDER BY event_id, consumer_group
    LIMIT $4
), gone AS (
    DELETE FROM ` + plainV7.table() + ` p USING batch
    WHERE p.event_id = batch.event_id AND p.consumer_group = batch.consumer_group
    RETURNING p.event_id, p.consumer_group
)
SELECT (SELECT count(*) FROM gone),
       coalesce((SELECT event_id::text FROM gone ORDER BY event_id DESC, consumer_group DESC LIMIT 1), ''),
       coalesce((SELECT consumer_group FROM gone ORDER BY event_id DESC, consumer_group DESC LIMIT 1), '')`
	conn, err := b.ctl.Connx(ctx)
	if err != nil {
		return 0, 0, 0, err
	}
	defer conn.Close()
	// Below the day's smallest key: its lower bound with an empty group.
	lastID, lastGroup := lo, ""
	for {
		t0 := time.Now()
		var n int64
		var id, grp string
		if err := conn.QueryRowxContext(ctx, q, lastID, lastGroup, hi, b.cfg.DeleteBatch).Scan(&n, &id, &grp); err != nil {
			return rows, txs, slowest, fmt.Errorf("delete batch: %w", err)
		}
		if n == 0 {
			break
		}
		slowest = max(slowest, time.Since(t0))
		txs++
		rows += n
		lastID, lastGroup = id, grp
	}
	// Publish this session's statistics (n_dead_tup) now, not in 10s.
	if _, err := conn.ExecContext(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		return rows, txs, slowest, fmt.Errorf("flush statistics: %w", err)
	}
	return rows, txs, slowest, nil
}
