package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

func report(w io.Writer, r Results) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	m := r.Machine
	p("## Dedup store (`make bench-dedup`)\n\n")
	p("Run %s, wall time %s: %d rows a table over %d days; inserts by %d workers, %d rows a transaction, %d round(s) of %s per table and setting; DELETE batches of %d.\n\n",
		r.Started.Format(time.RFC3339), r.Wall.Round(time.Second), r.Config.Rows, days, r.Config.Workers, r.Config.Batch,
		r.Config.Rounds, r.Config.Duration, r.Config.DeleteBatch)
	p("Machine: %d CPUs, %s RAM; load average %s at start, %s at end. %s.\n\n", m.CPUs, m.MemTotal, m.LoadStart, m.LoadEnd, m.Server)
	var set []string
	for _, k := range slices.Sorted(maps.Keys(m.Settings)) {
		set = append(set, k+"="+m.Settings[k])
	}
	p("Settings: %s.\n\n", strings.Join(set, ", "))

	p("### Tables after the bulk load\n\n")
	p("| table | rows | load time | rows/s | VACUUM ANALYZE | heap | PK index | pg_indexes_size | total | PK leaf density | PK levels |\n")
	p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, l := range r.Loads {
		s := l.Sizes
		p("| %s | %d | %s | %.0f | %s | %s | %s | %s | %s | %s | %s |\n", l.Variant.Name, l.Rows,
			l.Took.Round(100*time.Millisecond), float64(l.Rows)/l.Took.Seconds(), l.Vacuum.Round(100*time.Millisecond),
			mb(s.Heap), mb(s.PKey), mb(s.Indexes), mb(s.Total), pct(s.LeafDensity, m.HasStat), levels(s.Levels, m.HasStat))
	}

	p("\n### Steady-state inserts (each round %s from a CHECKPOINT; rates: median of the rounds, min–max)\n\n", r.Config.Duration)
	p("| table | synchronous_commit | rows in table | rows/s | tx p50 | tx p99 | tx max | WAL bytes/row | of which full-page images | index blocks read from outside shared_buffers /1k rows | index buffer hits/row | PK growth bytes/row | others' checkpoints | load average (1 min) |\n")
	p("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range summarizeInserts(r.Inserts) {
		p("| %s | %s | %d | %.0f (%.0f–%.0f) | %s | %s | %s | %s | %s | %s | %s | %s | %d | %s |\n", s.v.Name, s.sc, s.rowsBefore,
			median(s.rates), slices.Min(s.rates), slices.Max(s.rates), msStr(s.tx.P50), msStr(s.tx.P99), msStr(s.tx.Max),
			walPerRow(s.wal, s.rows), fpiPerRow(s.wal, s.rows), per1k(s.idxRead, s.rows), perRow(s.idxHit, s.rows),
			perRow(s.pkeyGrowth, s.rows), s.wal.Checkpoints, strings.Join(s.loads, ", "))
	}

	p("\n### Removing the oldest day, nothing else writing\n\n")
	p("| table | method | rows removed | time | transactions (slowest) | WAL | table+indexes before → after | PK index before → after | n_dead_tup after | VACUUM | after VACUUM: table+indexes (PK; free PK pages) |\n")
	p("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var notes []string
	for _, x := range r.Removals {
		if x.UnderLoad {
			continue
		}
		vac, avs := "not needed", "—"
		if x.AfterVacuum != nil {
			vac = x.Vacuum.Round(100*time.Millisecond).String() + ", WAL " + walStr(*x.VacuumWAL)
			avs = fmt.Sprintf("%s (%s; %d)", mb(x.AfterVacuum.Total), mb(x.AfterVacuum.PKey), x.AfterVacuum.FreePages)
		}
		p("| %s | %s | %d | %s | %d (%s) | %s | %s → %s | %s → %s | %d | %s | %s |\n", x.Variant.Name, x.Method, x.Rows,
			x.Took.Round(time.Millisecond), x.Batches, x.Slowest.Round(time.Millisecond), walStr(x.WAL),
			mb(x.Before.Total), mb(x.After.Total), mb(x.Before.PKey), mb(x.After.PKey), x.DeadTuples, vac, avs)
		if x.AfterVacuum != nil && m.HasStat {
			notes = append(notes, fmt.Sprintf("\npgstattuple of the unpartitioned table after the DELETE: %.1f%% dead tuples, %.1f%% free space; after the VACUUM: %.1f%% free space. Its PK's leaf density: %.1f%% before, %.1f%% after the DELETE, %.1f%% after the VACUUM.\n",
				x.DeadPct, x.FreePct, x.FreePctVacuum, x.Before.LeafDensity, x.After.LeafDensity, x.AfterVacuum.LeafDensity))
		}
	}
	for _, n := range notes {
		p("%s", n)
	}

	p("\n### Removing the next day while %d workers insert into the same table (synchronous_commit=on)\n\n", r.Config.Workers)
	p("| table | method | rows removed | time | before: tx | p50 | p99 | max | rows/s | during: tx | p50 | p99 | max | rows/s |\n")
	p("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, x := range r.Removals {
		if !x.UnderLoad {
			continue
		}
		a, d := x.InsBefore, x.InsDuring
		p("| %s | %s | %d | %s | %d | %s | %s | %s | %.0f | %d | %s | %s | %s | %.0f |\n", x.Variant.Name, x.Method, x.Rows,
			x.Took.Round(time.Millisecond), a.N, msStr(a.P50), msStr(a.P99), msStr(a.Max), a.RowsPerSec,
			d.N, msStr(d.P50), msStr(d.P99), msStr(d.Max), d.RowsPerSec)
	}
}

func walStr(w WAL) string {
	if w.Ours < 0 {
		return mb(w.Cluster) + " (whole cluster)"
	}
	return mb(w.Ours)
}

func walPerRow(w WAL, rows int64) string {
	if w.Ours < 0 {
		return perRow(w.Cluster, rows) + " (whole cluster)"
	}
	return perRow(w.Ours, rows)
}

func fpiPerRow(w WAL, rows int64) string {
	if w.Ours < 0 {
		return "—"
	}
	return perRow(w.OursFPI, rows)
}

func mb(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/(1<<20)) }

func msStr(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/1e6) }

func perRow(n, rows int64) string {
	if rows == 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f", float64(n)/float64(rows))
}

func per1k(n, rows int64) string {
	if rows == 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f", 1000*float64(n)/float64(rows))
}

func pct(v float64, ok bool) string {
	if !ok {
		return "—"
	}
	return fmt.Sprintf("%.1f%%", v)
}

func levels(n int, ok bool) string {
	if !ok {
		return "—"
	}
	return strconv.Itoa(n)
}
