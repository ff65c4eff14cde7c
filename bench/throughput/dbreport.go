package main

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// parseCounts reads a comma-separated list of positive counts.
func parseCounts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q: want positive counts, comma-separated", s)
		}
		out = append(out, n)
	}
	return out, nil
}

func formatCores(cores []float64) string {
	parts := make([]string, len(cores))
	for i, c := range cores {
		parts[i] = fmt.Sprintf("%.2f", c)
	}
	return strings.Join(parts, ", ")
}

// perEvent divides a scenario's figure by its events (all the messages
// produced, duplicates included, as events/s counts them).
func perEvent(r result, v int64) float64 { return float64(v) / float64(r.produced) }

// walRate is the WAL the scenario wrote per second of processing, in
// MB/s: its bytes per event at its events per second.
func walRate(r result) float64 { return perEvent(r, r.db.wal) * r.eventsPerS / 1e6 }

func describeDB(r result) string {
	d := r.db
	s := fmt.Sprintf("WAL %.0f B/event (full-page images %.0f), %.2f records/event, %.3f write transactions/event, %.1f MB/s; PostgreSQL CPU %.3f ms/event (%.2f cores over its %s window, %d checkpoints in it)",
		perEvent(r, d.wal), perEvent(r, d.fpiBytes), perEvent(r, d.records), perEvent(r, d.commits), walRate(r),
		ms(d.cpu)/float64(r.produced), d.cpu.Seconds()/d.window.Seconds(), d.window.Round(100*time.Millisecond), d.checkpoints)
	if d.vacuum > 0 {
		s += fmt.Sprintf("; VACUUM afterwards %.0f B/event (full-page images %.0f)", perEvent(r, d.vacuum), perEvent(r, d.vacuumFPI))
	}
	return s
}

// describePhases says where a run's time went at the provider.
func describePhases(r result) string {
	p := r.phases
	limit := int64(r.maxConcurrency * max(r.replicas, 1))
	secs := func(d time.Duration) string {
		if d < 0 {
			return "never"
		}
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
	s := fmt.Sprintf("first request %s after ready; ", secs(p.first))
	if p.full >= 0 {
		s += fmt.Sprintf("≥ %.0f%% of %d in flight from %s to %s (mean %.0f, %.1f%% of the limit); ", 100*fullShare, limit, secs(p.full), secs(p.lastFull),
			p.held, 100*p.held/float64(limit))
	} else {
		s += fmt.Sprintf("never %.0f%% of %d in flight; ", 100*fullShare, limit)
	}
	s += fmt.Sprintf("last answer %s, caught up %s; 20–80 %% of the requests at %.0f/s", secs(p.lastAnswer), secs(r.elapsed), p.mid)
	if w := waves(r.requests, limit, r.latency); w > 0 {
		s += fmt.Sprintf("; %d requests need %d waves of %s at least: %s, %.0f events/s at most", r.requests, w/r.latency, r.latency, secs(w),
			float64(r.produced)/w.Seconds())
	}
	return s
}

// midEvents is a scenario's events/s without its start and its end: the
// rate between 20 % and 80 % of the provider's requests answered, scaled
// to events (duplicates need no request). At a latency the answers come in
// waves, so it is good to about a wave in the twenty-odd between.
func midEvents(r result) float64 {
	return r.phases.mid * float64(r.produced) / math.Max(1, float64(r.requests))
}

// pgCoresOf is the cores PostgreSQL kept busy while the scenario ran: over
// the throughput window, or, for pgbench, over its database window.
func pgCoresOf(r result) float64 {
	if r.broker == "pgbench" {
		return r.db.cpu.Seconds() / r.db.window.Seconds()
	}
	return r.pgCores
}

// printDBCost prints what each scenario cost PostgreSQL, and for the 0 ms
// scenarios where the WAL went: by record type side by side, and by
// relation for each design.
func printDBCost(results []result) {
	var measured []result
	for _, r := range results {
		if r.db.measured {
			measured = append(measured, r)
		}
	}
	if len(measured) == 0 {
		return
	}
	fmt.Println()
	fmt.Println("Database cost per event (the benchmark's own PostgreSQL cluster; window: from before serve starts to every offset committed and every outcome relayed, after a CHECKPOINT)")
	fmt.Println()
	fmt.Println("| scenario | broker | events | events/s | WAL bytes/event | of which full-page images | WAL records/event | write transactions/event | PostgreSQL CPU/event | PostgreSQL cores | service CPU/event | WAL MB/s | checkpoints in window | VACUUM afterwards, bytes/event |")
	fmt.Println("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, r := range measured {
		vac := "–"
		if r.db.vacuum > 0 {
			vac = fmt.Sprintf("%.0f (FPI %.0f)", perEvent(r, r.db.vacuum), perEvent(r, r.db.vacuumFPI))
		}
		fmt.Printf("| %s | %s | %d | %.0f | %.0f | %.0f | %.2f | %.3f | %.3f ms | %.2f | %.3f ms | %.2f | %d | %s |\n",
			r.name, r.broker, r.produced, r.eventsPerS, perEvent(r, r.db.wal), perEvent(r, r.db.fpiBytes), perEvent(r, r.db.records),
			perEvent(r, r.db.commits), ms(r.db.cpu)/float64(r.produced), pgCoresOf(r), ms(r.cpuPerEvent),
			walRate(r), r.db.checkpoints, vac)
	}
	var zero []result
	for _, r := range measured {
		if r.latency == 0 && r.db.byRelation != nil && r.replicas <= 1 {
			zero = append(zero, r)
		}
	}
	if len(zero) == 0 {
		return
	}
	printByType(zero)
	for _, r := range zero {
		printByRelation(r)
	}
}

// printByType prints pg_get_wal_stats of the 0 ms scenarios side by side:
// per event, the records, their bytes and the full-page images' bytes.
func printByType(rs []result) {
	fmt.Println()
	fmt.Println("WAL by record type at 0 ms, per event (pg_get_wal_stats; bytes without full-page images, which are apart)")
	fmt.Println()
	fmt.Print("| record type |")
	for _, r := range rs {
		fmt.Printf(" %s (%s): records | bytes | FPI bytes |", strings.TrimSuffix(r.name, ", provider 0 ms"), r.broker)
	}
	fmt.Println()
	fmt.Print("| --- |")
	for range rs {
		fmt.Print(" ---: | ---: | ---: |")
	}
	fmt.Println()
	var kinds []string
	for _, r := range rs {
		for _, g := range r.db.byType {
			if !slices.Contains(kinds, g.kind) {
				kinds = append(kinds, g.kind)
			}
		}
	}
	for _, k := range kinds {
		fmt.Printf("| %s |", k)
		for _, r := range rs {
			i := slices.IndexFunc(r.db.byType, func(g walGroup) bool { return g.kind == k })
			if i < 0 {
				fmt.Print(" | | |")
				continue
			}
			g := r.db.byType[i]
			fmt.Printf(" %.3f | %.1f | %.1f |", perEvent(r, g.count), perEvent(r, g.bytes), perEvent(r, g.fpi))
		}
		fmt.Println()
	}
	fmt.Print("| **records** |")
	for _, r := range rs {
		fmt.Printf(" %.2f | %.1f | %.1f |", perEvent(r, r.db.records), perEvent(r, r.db.recordBytes), perEvent(r, r.db.fpiBytes))
	}
	fmt.Println()
	fmt.Print("| page headers, alignment (LSN difference − records) |")
	for _, r := range rs {
		fmt.Printf(" | %.1f | |", perEvent(r, r.db.wal-r.db.recordBytes-r.db.fpiBytes))
	}
	fmt.Println()
	fmt.Print("| **WAL (LSN difference)** |")
	for _, r := range rs {
		fmt.Printf(" | **%.1f** | |", perEvent(r, r.db.wal))
	}
	fmt.Println()
}

// printByRelation prints one 0 ms scenario's records by the relation of
// their first block: what one event writes, record by record.
func printByRelation(r result) {
	fmt.Println()
	fmt.Printf("WAL by relation and record type, %s on %s, per event (%d events; pg_get_wal_records_info, each record by its first block reference)\n\n", r.name, r.broker, r.produced)
	fmt.Println("| relation | record type | records/event | bytes/event | FPI bytes/event | bytes/record |")
	fmt.Println("| --- | --- | ---: | ---: | ---: | ---: |")
	var total, fpi int64
	for _, g := range r.db.byRelation {
		total += g.bytes
		fpi += g.fpi
		if perEvent(r, g.bytes+g.fpi) < 0.05 {
			continue // the server's own housekeeping, a few records in the window
		}
		fmt.Printf("| %s | %s | %.3f | %.1f | %.1f | %.0f |\n", g.relation, g.kind, perEvent(r, g.count), perEvent(r, g.bytes), perEvent(r, g.fpi),
			float64(g.bytes)/math.Max(1, float64(g.count)))
	}
	fmt.Printf("| **all (rows under 0.05 B/event left out)** | | | **%.1f** | **%.1f** | |\n", perEvent(r, total), perEvent(r, fpi))
}

// printScaleOut compares billing's scenarios by replica count at each
// latency and broker: the live ones, which only -replicas makes.
func printScaleOut(results []result) {
	type key struct {
		broker  string
		latency time.Duration
	}
	groups := map[key][]result{}
	var keys []key
	for _, r := range results {
		if !r.live { // a scale-out comparison runs live, one replica too
			continue
		}
		k := key{r.broker, r.latency}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], r)
	}
	printed := false
	for _, k := range keys {
		g := groups[k]
		if len(g) < 2 {
			continue
		}
		if !printed {
			fmt.Println()
			fmt.Println("Scale-out: replicas of serve in one consumer group, one database")
			fmt.Println()
			fmt.Printf("| broker | provider latency | replicas | events | events/s | × one replica | events/s from 20 to 80 %% of the requests | service cores, each | service CPU/event | PostgreSQL cores | PostgreSQL CPU/event | WAL bytes/event | WAL MB/s | the benchmark's process (kfake, provider, producer), cores | machine CPU busy (of %d cores) | provider requests in flight, mean (limit) | DB connection wait per event |\n", numCPU())
			fmt.Println("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
			printed = true
		}
		base := g[0].eventsPerS
		for _, r := range g {
			pgCPU, walB := math.NaN(), math.NaN()
			if r.db.measured {
				pgCPU = ms(r.db.cpu) / float64(r.produced)
				walB = perEvent(r, r.db.wal)
			}
			mid := midEvents(r)
			fmt.Printf("| %s | %d ms | %d | %d | %.0f | %.2f | %.0f | %s | %.3f ms | %.2f | %.3f ms | %.0f | %.2f | %.2f | %.0f%% | %.0f (%d) | %s |\n",
				r.broker, r.latency.Milliseconds(), max(r.replicas, 1), r.produced, r.eventsPerS, r.eventsPerS/base, mid,
				formatCores(r.replicaCores), ms(r.cpuPerEvent), r.pgCores, pgCPU, walB, walRate(r), r.benchCores, 100*r.machineBusy,
				r.meanInFlight, r.maxConcurrency*max(r.replicas, 1), secs(r.poolWait))
		}
	}
}
