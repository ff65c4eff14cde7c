package main

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A sweep runs billing, an earlier billing binary (the baseline, optional)
// and the seed design at each provider latency, so that events/s can be
// read against latency side by side, from one run on one machine.

// design is one line of the sweep: a binary and its configuration.
type design struct {
	label  string // "billing", "billing 3f706e0", "seed design"
	binary string
	env    []string
	// events sizes a scenario at a latency so that it lasts tens of
	// seconds, not hours, for a design whose throughput falls with latency.
	events func(latency time.Duration) int
}

// parseLatencies reads -latencies: milliseconds, comma-separated.
func parseLatencies(s string) ([]time.Duration, error) {
	var out []time.Duration
	for f := range strings.SplitSeq(s, ",") {
		ms, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || ms < 0 {
			return nil, fmt.Errorf("-latencies %q: want milliseconds, comma-separated", s)
		}
		out = append(out, time.Duration(ms)*time.Millisecond)
	}
	return out, nil
}

// scenarioName names a design's scenario at a latency.
func scenarioName(label string, latency time.Duration) string {
	return fmt.Sprintf("%s, provider %d ms", label, latency.Milliseconds())
}

// capped is a design's event count: n, or fewer when the design handles
// about perSecondAtOneSecond/latency events per second, so that the
// scenario takes about 30 s.
func capped(n int, perSecondAtOneSecond float64, floor int) func(time.Duration) int {
	return func(l time.Duration) int {
		if l == 0 {
			return n
		}
		return min(n, max(floor, int(30*perSecondAtOneSecond/l.Seconds())))
	}
}

// point is one design's events/s at one latency.
type point struct {
	latency time.Duration
	perS    float64
}

// printSweep prints, by latency and design: events/s with each design's
// ratio to the first, then the service's CPU per event, its peak RSS and
// the provider requests in flight, the columns that say what bounds each
// design.
func printSweep(designs []design, latencies []time.Duration, results []result, brokerName string) {
	byName := map[string]result{}
	for _, r := range results {
		if r.broker == brokerName {
			byName[r.name] = r
		}
	}
	header := func(title string, ratios bool) {
		fmt.Printf("\n%s on %s\n\n| provider latency |", title, brokerName)
		for _, d := range designs {
			fmt.Printf(" %s |", d.label)
		}
		n := len(designs)
		if ratios {
			for _, d := range designs[1:] {
				fmt.Printf(" %s / %s |", designs[0].label, d.label)
			}
			n += len(designs) - 1
		}
		fmt.Println()
		fmt.Print("| --- |" + strings.Repeat(" ---: |", n) + "\n")
	}
	table := func(title string, cell func(r result) string) {
		header(title, false)
		for _, l := range latencies {
			fmt.Printf("| %d ms |", l.Milliseconds())
			for _, d := range designs {
				r, ok := byName[scenarioName(d.label, l)]
				if !ok {
					fmt.Print(" – |")
					continue
				}
				fmt.Printf(" %s |", cell(r))
			}
			fmt.Println()
		}
	}

	header("provider latency sweep (events/s)", true)
	for _, l := range latencies {
		first, okFirst := byName[scenarioName(designs[0].label, l)]
		fmt.Printf("| %d ms |", l.Milliseconds())
		for _, d := range designs {
			if r, ok := byName[scenarioName(d.label, l)]; ok {
				fmt.Printf(" %.0f |", r.eventsPerS)
			} else {
				fmt.Print(" – |")
			}
		}
		for _, d := range designs[1:] {
			if r, ok := byName[scenarioName(d.label, l)]; ok && okFirst {
				fmt.Printf(" %.1f× |", first.eventsPerS/r.eventsPerS)
			} else {
				fmt.Print(" – |")
			}
		}
		fmt.Println()
	}
	table("the service's CPU per event (and cores it kept busy)", func(r result) string {
		return fmt.Sprintf("%.3f ms (%.2f)", ms(r.cpuPerEvent), r.serviceCores)
	})
	table("peak RSS of billing serve (anonymous: without the binary's own pages)", func(r result) string {
		return fmt.Sprintf("%.1f MiB (%.1f)", float64(r.peakRSS)/(1<<20), float64(r.peakAnon)/(1<<20))
	})
	table("provider requests in flight: most at once / mean", func(r result) string {
		return fmt.Sprintf("%d / %.0f", r.maxInFlight, r.meanInFlight)
	})
	table("waiting for a database connection, per event (machine CPU busy)", func(r result) string {
		return fmt.Sprintf("%s (%.0f%%)", secs(r.poolWait), 100*r.machineBusy)
	})
	if !slices.ContainsFunc(results, func(r result) bool { return r.broker == brokerName && r.db.measured }) {
		return
	}
	table("WAL per event, bytes (of which full-page images)", func(r result) string {
		if !r.db.measured {
			return "–"
		}
		return fmt.Sprintf("%.0f (%.0f)", perEvent(r, r.db.wal), perEvent(r, r.db.fpiBytes))
	})
	table("PostgreSQL's CPU per event (and cores it kept busy)", func(r result) string {
		if !r.db.measured {
			return "–"
		}
		return fmt.Sprintf("%.3f ms (%.2f)", ms(r.db.cpu)/float64(r.produced), r.pgCores)
	})
	table("provider requests in flight at the limit, mean share (from when they first reach it to the last time)", func(r result) string {
		if math.IsNaN(r.phases.held) {
			return "–"
		}
		return fmt.Sprintf("%.1f%%", 100*r.phases.held/float64(r.maxConcurrency*max(r.replicas, 1)))
	})
}

// writeSweepSVG draws events/s (log scale) against provider latency, one
// line per design, as a standalone SVG file.
func writeSweepSVG(path string, designs []design, latencies []time.Duration, results []result, brokerName string) error {
	series := make([][]point, len(designs))
	lo, hi := math.Inf(1), 0.0
	for i, d := range designs {
		for _, l := range latencies {
			j := slices.IndexFunc(results, func(r result) bool { return r.broker == brokerName && r.name == scenarioName(d.label, l) })
			if j < 0 || results[j].eventsPerS <= 0 {
				continue
			}
			v := results[j].eventsPerS
			series[i] = append(series[i], point{l, v})
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	if hi == 0 {
		return fmt.Errorf("no results to draw")
	}
	return os.WriteFile(path, []byte(sweepSVG(designs, latencies, series, lo, hi)), 0o644)
}

// sweepSVG renders the chart: latencies evenly spaced on x (they span
// orders of magnitude, and 0 has no logarithm), events/s on a log10 y axis
// between the decades around lo and hi.
func sweepSVG(designs []design, latencies []time.Duration, series [][]point, lo, hi float64) string {
	const w, h, left, right, top, bottom = 640.0, 400.0, 70.0, 170.0, 30.0, 50.0
	dLo, dHi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if dHi == dLo {
		dHi++
	}
	x := func(l time.Duration) float64 {
		i := slices.Index(latencies, l)
		if len(latencies) == 1 {
			return left
		}
		return left + float64(i)*(w-left-right)/float64(len(latencies)-1)
	}
	y := func(v float64) float64 {
		return top + (dHi-math.Log10(v))*(h-top-bottom)/(dHi-dLo)
	}
	colors := []string{"#1f77b4", "#d62728", "#7f7f7f", "#2ca02c"}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="18" font-size="14">events/s against provider latency (log scale)</text>`+"\n", left)
	for d := dLo; d <= dHi; d++ {
		v := math.Pow(10, d)
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n",
			left, w-right, y(v), y(v), left-6, y(v)+4, strconv.FormatFloat(v, 'f', -1, 64))
	}
	for _, l := range latencies {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%d ms</text>`+"\n", x(l), h-bottom+18, l.Milliseconds())
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">provider latency</text>`+"\n", left+(w-left-right)/2, h-10)
	for i, d := range designs {
		c := colors[i%len(colors)]
		var pts []string
		for _, p := range series[i] {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p.latency), y(p.perS)))
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", x(p.latency), y(p.perS), c)
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", c, strings.Join(pts, " "))
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="%s" stroke-width="2"/><text x="%.0f" y="%.0f">%s</text>`+"\n",
			w-right+10, w-right+30, top+20*float64(i)+10, top+20*float64(i)+10, c, w-right+36, top+20*float64(i)+14, d.label)
	}
	b.WriteString("</svg>\n")
	return b.String()
}
