package main

import (
	"fmt"
	"math"
	"slices"

	"example.com/billing/internal/metrics"
)

func printTable(results []result, pgTPS float64) {
	fmt.Println()
	fmt.Println("| scenario | broker | events | events/s | occurredAt→commit p50 / p99 | take→commit p50 / p99 | events per tx | CPU per event | broker CPU per event | peak RSS (anonymous) | orders charged twice | provider requests: total, most in 1 s, 429s | provider requests in flight: most / mean (of PAYMENT_MAX_CONCURRENCY) | service CPU, cores | machine CPU busy | DB connection wait per event | load average |")
	fmt.Println("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, r := range results {
		brokerCPU := "in process"
		if r.brokerCPU > 0 {
			brokerCPU = fmt.Sprintf("%.3f ms", ms(r.brokerCPU))
		}
		fmt.Printf("| %s | %s | %d | %.0f | %s / %s | %s / %s | %.1f | %.3f ms | %s | %.1f MiB (%.1f) | %d | %d, %d, %d | %d / %.0f (%d) | %.2f | %.0f%% | %s | %s→%s |\n",
			r.name, r.broker, r.produced, r.eventsPerS, secs(r.p50), secs(r.p99), secs(r.proc50), secs(r.proc99),
			r.txEvents, ms(r.cpuPerEvent), brokerCPU, float64(r.peakRSS)/(1<<20), float64(r.peakAnon)/(1<<20), r.doubleOrder,
			r.requests, r.peakPerSecond, r.rateLimited, r.maxInFlight, r.meanInFlight, r.maxConcurrency,
			r.serviceCores, 100*r.machineBusy, secs(r.poolWait), r.load0, r.load1)
	}
	type key struct{ name, broker string }
	byKey := map[key]result{}
	var brokers []string
	for _, r := range results {
		byKey[key{r.name, r.broker}] = r
		if !slices.Contains(brokers, r.broker) {
			brokers = append(brokers, r.broker)
		}
	}
	fmt.Println()
	for _, b := range brokers {
		for _, lat := range []string{"0 ms", "50 ms"} {
			bill, okB := byKey[key{"billing, provider " + lat, b}]
			seed, okS := byKey[key{"seed design, provider " + lat, b}]
			if okB && okS {
				fmt.Printf("%s, provider %s: billing / seed design = %.1f×\n", b, lat, bill.eventsPerS/seed.eventsPerS)
			}
		}
		if bill, ok := byKey[key{"billing, provider 0 ms", b}]; ok && pgTPS > 0 {
			fmt.Printf("%s: billing at 0 ms reaches %.0f%% of pgbench (billing's per-event SQL, 16 clients: %.0f tx/s)\n", b, 100*bill.eventsPerS/pgTPS, pgTPS)
		}
	}
	if len(brokers) == 2 {
		// Side by side: what the second broker (Apache Kafka) costs or
		// gives compared with the first (the embedded one).
		a, z := brokers[0], brokers[1]
		fmt.Println()
		fmt.Printf("| scenario | events/s %s | events/s %s | %s / %s | take→commit p99 %s / %s | CPU per event %s / %s | peak RSS %s / %s |\n", a, z, z, a, a, z, a, z, a, z)
		fmt.Println("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
		var names []string
		for _, r := range results {
			if !slices.Contains(names, r.name) {
				names = append(names, r.name)
			}
		}
		for _, name := range names {
			x, okX := byKey[key{name, a}]
			y, okY := byKey[key{name, z}]
			if !okX || !okY {
				continue
			}
			fmt.Printf("| %s | %.0f | %.0f | %.2f | %s / %s | %.3f / %.3f ms | %.1f / %.1f MiB |\n", name, x.eventsPerS, y.eventsPerS, y.eventsPerS/x.eventsPerS,
				secs(x.proc99), secs(y.proc99), ms(x.cpuPerEvent), ms(y.cpuPerEvent), float64(x.peakRSS)/(1<<20), float64(y.peakRSS)/(1<<20))
		}
	}
}

func secs(s float64) string {
	switch {
	case math.IsNaN(s):
		return "–"
	case s < 0.01:
		return fmt.Sprintf("%.2f ms", s*1000)
	case s < 1:
		return fmt.Sprintf("%.0f ms", s*1000)
	default:
		return fmt.Sprintf("%.2f s", s)
	}
}

// mean is a histogram's sum divided by its count: NaN when empty.
func mean(h metrics.Histogram) float64 { return h.Sum / h.Count }
