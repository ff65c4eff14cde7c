package main

import (
	"maps"
	"slices"

	"example.com/billing/internal/metrics"
)

// mergeSnapshots adds up the /metrics of several replicas of one binary:
// counters by series, histograms bucket by bucket (the replicas share
// their bucket bounds, so the cumulative counts add exactly).
func mergeSnapshots(snaps []metrics.Snapshot) metrics.Snapshot {
	out := metrics.Snapshot{Values: map[string]float64{}, Histograms: map[string]metrics.Histogram{}}
	for _, s := range snaps {
		for k, v := range s.Values {
			out.Values[k] += v
		}
		for k, h := range s.Histograms {
			out.Histograms[k] = addHistograms(out.Histograms[k], h)
		}
	}
	return out
}

func addHistograms(a, b metrics.Histogram) metrics.Histogram {
	byUpper := map[float64]float64{}
	for _, bk := range a.Buckets {
		byUpper[bk.Upper] += bk.Cumulative
	}
	for _, bk := range b.Buckets {
		byUpper[bk.Upper] += bk.Cumulative
	}
	out := metrics.Histogram{Count: a.Count + b.Count, Sum: a.Sum + b.Sum}
	for _, u := range slices.Sorted(maps.Keys(byUpper)) {
		out.Buckets = append(out.Buckets, metrics.Bucket{Upper: u, Cumulative: byUpper[u]})
	}
	return out
}
