package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"example.com/billing/internal/dedup"
	"example.com/billing/internal/postgres"
	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
)

// sample is one insert transaction: when it started, relative to the start
// of the run, how long it took from BEGIN to COMMIT and how many rows it
// inserted.
type sample struct {
	At, Took time.Duration
	Rows     int
}

// insertLoad runs cfg.Workers workers that insert new events the way the
// consumer does, dedup.Store.Claim inside postgres.InTx, cfg.Batch fresh ids
// of kind keys a transaction, until stop is closed. It returns every
// transaction.
func (b *bench) insertLoad(ctx context.Context, db *sqlx.DB, keys string, t0 time.Time, stop <-chan struct{}) ([]sample, error) {
	newID := uuid.NewV7
	if keys == "v4" {
		newID = uuid.NewV4
	}
	store := dedup.NewStore(group)
	var wg sync.WaitGroup
	results := make([][]sample, b.cfg.Workers)
	errs := make([]error, b.cfg.Workers)
	for w := range b.cfg.Workers {
		wg.Go(func() {
			entries := make([]dedup.Entry, b.cfg.Batch)
			for {
				select {
				case <-stop:
					return
				case <-ctx.Done():
					errs[w] = ctx.Err()
					return
				default:
				}
				for i := range entries {
					id, err := newID()
					if err != nil {
						errs[w] = err
						return
					}
					entries[i] = dedup.Entry{ID: id, Fingerprint: sha256.Sum256(id.Bytes())}
				}
				start := time.Now()
				first := 0
				err := postgres.InTx(ctx, db, func(tx *sqlx.Tx) error {
					verdicts, err := store.Claim(ctx, tx, entries)
					for _, v := range verdicts {
						if v == dedup.First {
							first++
						}
					}
					return err
				})
				if err != nil {
					errs[w] = err
					return
				}
				results[w] = append(results[w], sample{At: start.Sub(t0), Took: time.Since(start), Rows: first})
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("insert: %w", err)
	}
	return slices.Concat(results...), nil
}

// summarize gives the latencies of the samples that started in [from, to).
func summarize(all []sample, from, to time.Duration) latencies {
	var took []time.Duration
	rows := 0
	for _, s := range all {
		if s.At >= from && s.At < to {
			took = append(took, s.Took)
			rows += s.Rows
		}
	}
	l := latencies{N: len(took)}
	if len(took) == 0 {
		return l
	}
	slices.Sort(took)
	pct := func(p float64) time.Duration { return took[max(0, int(math.Ceil(p*float64(len(took))))-1)] }
	l.P50, l.P99, l.Max = pct(0.50), pct(0.99), took[len(took)-1]
	if to > from && to < math.MaxInt64 {
		l.RowsPerSec = float64(rows) / (to - from).Seconds()
	}
	return l
}

// inserts measures the steady-state insert rate into v's table for
// cfg.Duration, starting right after a checkpoint: as in production, where
// one comes every checkpoint_timeout or max_wal_size, the first change to
// each page after it writes the whole page to the WAL.
func (b *bench) inserts(ctx context.Context, v variant, sc string, round int) (InsertResult, error) {
	ir := InsertResult{Variant: v, SyncCommit: sc, Round: round, RowsBefore: b.rows[v.Schema]}
	db, err := b.pool(ctx, v, sc)
	if err != nil {
		return ir, err
	}
	defer db.Close()
	before, err := b.sizes(ctx, v, false)
	if err != nil {
		return ir, err
	}
	if err := b.checkpoint(ctx); err != nil {
		return ir, err
	}
	c0, err := b.counters(ctx, v.Schema)
	if err != nil {
		return ir, err
	}
	ww, err := b.beginWAL(ctx)
	if err != nil {
		return ir, err
	}
	defer ww.close()

	stop := make(chan struct{})
	t0 := time.Now()
	timer := time.AfterFunc(b.cfg.Duration, func() { close(stop) })
	defer timer.Stop()
	samples, err := b.insertLoad(ctx, db, v.Keys, t0, stop)
	if err != nil {
		return ir, fmt.Errorf("%s: %w", v.Name, err)
	}
	ir.Elapsed = time.Since(t0)
	if ir.WAL, err = ww.stop(ctx); err != nil {
		return ir, err
	}
	closePool(db)
	ir.WAL = ww.readBack(ctx, ir.WAL)
	c1, err := b.counters(ctx, v.Schema)
	if err != nil {
		return ir, err
	}
	after, err := b.sizes(ctx, v, false)
	if err != nil {
		return ir, err
	}
	ir.samples = samples
	ir.Tx = summarize(samples, 0, math.MaxInt64)
	for _, s := range samples {
		ir.Rows += int64(s.Rows)
	}
	b.rows[v.Schema] += ir.Rows
	ir.RowsPerSec = float64(ir.Rows) / ir.Elapsed.Seconds()
	ir.Tx.RowsPerSec = ir.RowsPerSec
	ir.IdxRead, ir.IdxHit, ir.HeapRead = c1.IdxRead-c0.IdxRead, c1.IdxHit-c0.IdxHit, c1.HeapRead-c0.HeapRead
	ir.PKeyGrowth = after.PKey - before.PKey
	ir.Load = loadavg()
	b.log.Info("inserts", "table", v.Name, "synchronous_commit", sc, "round", round+1, "rows", ir.Rows,
		"rows/s", int(ir.RowsPerSec), "p99", ir.Tx.P99, "wal/row", walPerRow(ir.WAL, ir.Rows),
		"checkpoints by others", ir.WAL.Checkpoints, "loadavg", ir.Load)
	return ir, nil
}

// insertSummary pools the rounds of one table and setting.
type insertSummary struct {
	v               variant
	sc              string
	rowsBefore      int64
	rates           []float64
	rows            int64
	tx              latencies
	wal             WAL
	idxRead, idxHit int64
	pkeyGrowth      int64
	loads           []string
}

func summarizeInserts(all []InsertResult) []*insertSummary {
	var out []*insertSummary
	byKey := map[string]*insertSummary{}
	for _, ir := range all {
		k := ir.Variant.Schema + "/" + ir.SyncCommit
		s, ok := byKey[k]
		if !ok {
			s = &insertSummary{v: ir.Variant, sc: ir.SyncCommit, rowsBefore: ir.RowsBefore}
			byKey[k] = s
			out = append(out, s)
		}
		s.rates = append(s.rates, ir.RowsPerSec)
		s.rows += ir.Rows
		s.wal = s.wal.add(ir.WAL)
		s.idxRead += ir.IdxRead
		s.idxHit += ir.IdxHit
		s.pkeyGrowth += ir.PKeyGrowth
		s.loads = append(s.loads, strings.Fields(ir.Load)[0])
	}
	for _, s := range out {
		var samples []sample
		for _, ir := range all {
			if ir.Variant.Schema == s.v.Schema && ir.SyncCommit == s.sc {
				samples = append(samples, ir.samples...)
			}
		}
		s.tx = summarize(samples, 0, math.MaxInt64)
	}
	return out
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
