package main

import (
	"strings"
	"testing"
	"time"
)

func TestParseLatencies(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []time.Duration
		wantErr bool
	}{
		{in: "0,50,200", want: []time.Duration{0, 50 * time.Millisecond, 200 * time.Millisecond}},
		{in: " 1000 ", want: []time.Duration{time.Second}},
		{in: "0,,5", wantErr: true},
		{in: "-1", wantErr: true},
		{in: "1s", wantErr: true},
	} {
		got, err := parseLatencies(tc.in)
		if (err != nil) != tc.wantErr || (err == nil && !equal(got, tc.want)) {
			t.Errorf("parseLatencies(%q) = %v, %v; want %v (error %v)", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func equal(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestCapped(t *testing.T) {
	events := capped(30000, 100, 2000)
	for _, tc := range []struct {
		latency time.Duration
		want    int
	}{
		{0, 30000},                      // no latency: the full count
		{50 * time.Millisecond, 30000},  // 100/0.05 × 30 s = 60,000, capped at n
		{500 * time.Millisecond, 6000},  // 200 events/s × 30 s
		{1000 * time.Millisecond, 3000}, // 100 events/s × 30 s
		{10 * time.Second, 2000},        // the floor
	} {
		if got := events(tc.latency); got != tc.want {
			t.Errorf("capped(30000, 100, 2000)(%s) = %d, want %d", tc.latency, got, tc.want)
		}
	}
}

// The chart puts a higher rate higher (smaller y) and draws every design.
func TestSweepSVG(t *testing.T) {
	designs := []design{{label: "billing"}, {label: "seed design"}}
	lat := []time.Duration{0, time.Second}
	series := [][]point{{{0, 3000}, {time.Second, 1000}}, {{0, 500}, {time.Second, 3}}}
	svg := sweepSVG(designs, lat, series, 3, 3000)
	for _, want := range []string{"<svg", "billing", "seed design", "1000 ms", ">1<", ">10000<", "</svg>"} {
		if !strings.Contains(svg, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	if n := strings.Count(svg, "<polyline"); n != 2 {
		t.Errorf("%d lines drawn, want 2", n)
	}
}
