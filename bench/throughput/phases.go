package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"time"
)

// phases splits a run by the provider's requests in flight, to say where
// a provider-bound run's time goes: the ramp (until the requests in flight
// first reach the limit), the steady state (at the limit) and the tail
// (below it again, until the last answer), then the offset commits.
type phases struct {
	first      time.Duration // the first request arrived
	full       time.Duration // the requests in flight first reached fullShare of the limit; -1: never
	lastFull   time.Duration // the last sample at fullShare of the limit or more
	lastAnswer time.Duration // the last sample with a request in flight
	// held is the mean of the requests in flight from full to lastFull:
	// what the service kept at the provider while it had the work to (a
	// rate there would depend on where the waves of answers fall); mid
	// the requests answered per second between 20 % and 80 % of all of
	// them answered, which needs no limit and suits a run without waves
	// (0 ms).
	held, mid float64
	// meanBusy is the mean of the requests in flight between first and
	// lastAnswer.
	meanBusy float64
}

// fullShare is what counts as "at the limit": the requests in flight of
// one sample jitter by a few as answers and new requests cross.
const fullShare = 0.95

// splitPhases reads samples (in time order) against limit, the requests
// the service may have in flight.
func splitPhases(samples []sample, limit int64) phases {
	p := phases{first: -1, full: -1, lastFull: -1, lastAnswer: -1, held: math.NaN(), mid: math.NaN(), meanBusy: math.NaN()}
	if len(samples) == 0 {
		return p
	}
	answered := func(s sample) int64 { return s.received - s.inFlight }
	total := answered(samples[len(samples)-1])
	var fullAt, lastFullAt, at20, at80 = -1, -1, -1, -1
	var busy float64
	var busyN int
	for i, s := range samples {
		if s.received > 0 && p.first < 0 {
			p.first = s.at
		}
		if s.inFlight > 0 {
			p.lastAnswer = s.at
		}
		if p.first >= 0 && (s.inFlight > 0 || answered(s) < total) {
			busy += float64(s.inFlight)
			busyN++
		}
		if limit > 0 && float64(s.inFlight) >= fullShare*float64(limit) {
			if fullAt < 0 {
				fullAt = i
			}
			lastFullAt = i
		}
		if at20 < 0 && total > 0 && answered(s) >= total/5 {
			at20 = i
		}
		if at80 < 0 && total > 0 && answered(s) >= total*4/5 {
			at80 = i
		}
	}
	if busyN > 0 {
		p.meanBusy = busy / float64(busyN)
	}
	rate := func(i, j int) float64 {
		if i < 0 || j <= i {
			return math.NaN()
		}
		return float64(answered(samples[j])-answered(samples[i])) / (samples[j].at - samples[i].at).Seconds()
	}
	if fullAt >= 0 {
		p.full, p.lastFull = samples[fullAt].at, samples[lastFullAt].at
		var sum float64
		for _, s := range samples[fullAt : lastFullAt+1] {
			sum += float64(s.inFlight)
		}
		p.held = sum / float64(lastFullAt-fullAt+1)
	}
	p.mid = rate(at20, at80)
	return p
}

// waves is the shortest time a service that sends at most limit requests
// at once needs for n requests that each take latency: they go in
// ceil(n/limit) waves, however they are spread, and the last wave takes
// a whole latency even when it carries few.
func waves(n, limit int64, latency time.Duration) time.Duration {
	if limit <= 0 || n <= 0 {
		return 0
	}
	return time.Duration((n+limit-1)/limit) * latency
}

// writeTimeline writes samples as dir/name.csv: seconds since the window
// started, requests received so far, requests in flight.
func writeTimeline(dir, name string, samples []sample) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	var b bytes.Buffer
	b.WriteString("seconds,received,in_flight\n")
	for _, s := range samples {
		fmt.Fprintf(&b, "%.3f,%d,%d\n", s.at.Seconds(), s.received, s.inFlight)
	}
	path := filepath.Join(dir, name+".csv")
	return path, os.WriteFile(path, b.Bytes(), 0o644)
}
