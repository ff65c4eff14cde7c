package main

import (
	"math"
	"slices"
	"testing"
	"time"

	"example.com/billing/internal/metrics"
)

func TestParseProcStat(t *testing.T) {
	for _, tc := range []struct {
		name    string
		line    string
		want    procTimes
		wantErr bool
	}{
		{name: "OK", line: "2421 (postgres) S 2420 2420 2420 0 -1 4194560 1433 0 0 0 37 12 5 3 20 0 1 0 1203 233639936 14089\n",
			want: procTimes{ppid: 2420, utime: 37, stime: 12, cutime: 5, cstime: 3}},
		{name: "OKNameWithSpacesAndParens", line: "77 (postgres: 15/main: postgres db (x) idle) S 1 77 77 0 -1 0 0 0 0 0 100 200 300 400 20 0 1 0",
			want: procTimes{ppid: 1, utime: 100, stime: 200, cutime: 300, cstime: 400}},
		{name: "ErrNoName", line: "77 postgres S 1", wantErr: true},
		{name: "ErrShort", line: "77 (postgres) S 1 77 77 0 -1 0 0 0 0 0 100 200", wantErr: true},
		{name: "ErrNotANumber", line: "77 (postgres) S 1 77 77 0 -1 0 0 0 0 0 x 200 300 400 20", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseProcStat(tc.line)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("parseProcStat = %+v, %v; want %+v (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestParseLSN(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    lsn
		wantErr bool
	}{
		{in: "0/1540C10", want: 0x1540C10},
		{in: "16/B374D848", want: 0x16<<32 | 0xB374D848},
		{in: "FFFFFFFF/FFFFFFFF", want: math.MaxUint64},
		{in: "0/0", want: 0},
		{in: "1540C10", wantErr: true},
		{in: "1/G", wantErr: true},
		{in: "100000000/0", wantErr: true}, // the high part is 32 bits
	} {
		got, err := parseLSN(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("parseLSN(%q) = %v, %v; want %v (error %v)", tc.in, got, err, tc.want, tc.wantErr)
		}
		if err == nil && got.String() != tc.in {
			t.Errorf("parseLSN(%q).String() = %q", tc.in, got.String())
		}
	}
	// The WAL between two positions crosses the 4 GiB boundary of the low
	// part as one number.
	a, _ := parseLSN("0/FFFFFF00")
	b, _ := parseLSN("1/100")
	if d := int64(b - a); d != 0x200 {
		t.Errorf("1/100 − 0/FFFFFF00 = %d bytes, want 512", d)
	}
}

func TestParseRelPath(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    relPath
		wantErr bool
	}{
		{in: "1663/16384/16390", want: relPath{spc: 1663, db: 16384, node: 16390}},
		{in: "1664/0/1262", want: relPath{spc: 1664, node: 1262}},
		{in: "1663/16384", wantErr: true},
		{in: "1663/x/1", wantErr: true},
	} {
		got, err := parseRelPath(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("parseRelPath(%q) = %+v, %v; want %+v (error %v)", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestParseCounts(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []int
		wantErr bool
	}{
		{in: "1,2,3", want: []int{1, 2, 3}},
		{in: " 2 ", want: []int{2}},
		{in: "0", wantErr: true},
		{in: "1,,2", wantErr: true},
	} {
		got, err := parseCounts(tc.in)
		if (err != nil) != tc.wantErr || !slices.Equal(got, tc.want) {
			t.Errorf("parseCounts(%q) = %v, %v; want %v (error %v)", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

// A provider-bound run: nothing for 0.1 s, then 4 in flight (the limit)
// answered at 4/s for a second, then a tail of 2 until 1.5 s.
func TestSplitPhases(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	samples := []sample{
		{at: 0},
		{at: ms(100), received: 4, inFlight: 4},
		{at: ms(600), received: 6, inFlight: 4},
		{at: ms(1100), received: 8, inFlight: 4},
		{at: ms(1300), received: 8, inFlight: 2},
		{at: ms(1500), received: 8, inFlight: 0},
		{at: ms(1600), received: 8, inFlight: 0},
	}
	p := splitPhases(samples, 4)
	if p.first != ms(100) || p.full != ms(100) || p.lastFull != ms(1100) || p.lastAnswer != ms(1300) {
		t.Errorf("phases %v %v %v %v, want 100ms 100ms 1.1s 1.3s", p.first, p.full, p.lastFull, p.lastAnswer)
	}
	if p.held != 4 {
		t.Errorf("held %v in flight, want 4", p.held)
	}
	// 20 % of 8 answered (1.6, so 2) first at 0.6 s, 80 % (6.4, so 6) at 1.3 s.
	if want := 4 / 0.7; math.Abs(p.mid-want) > 1e-9 {
		t.Errorf("mid %v requests/s, want %v", p.mid, want)
	}
	if want := 14.0 / 4; p.meanBusy != want { // 4, 4, 4, 2 from the first request to the last answer
		t.Errorf("meanBusy %v, want %v", p.meanBusy, want)
	}
	if q := splitPhases(samples, 5); q.full != -1 || !math.IsNaN(q.held) {
		t.Errorf("a limit never reached: full %v, held %v; want -1, NaN", q.full, q.held)
	}
	if q := splitPhases(nil, 4); q.first != -1 || !math.IsNaN(q.mid) {
		t.Errorf("no samples: %+v", q)
	}
}

func TestWaves(t *testing.T) {
	for _, tc := range []struct {
		n, limit int64
		latency  time.Duration
		want     time.Duration
	}{
		{n: 7200, limit: 1024, latency: 2 * time.Second, want: 16 * time.Second},  // 8,000 events, 10 % duplicates
		{n: 27000, limit: 1024, latency: 2 * time.Second, want: 54 * time.Second}, // 30,000
		{n: 1024, limit: 1024, latency: time.Second, want: time.Second},
		{n: 1025, limit: 1024, latency: time.Second, want: 2 * time.Second},
		{n: 0, limit: 1024, latency: time.Second, want: 0},
		{n: 10, limit: 0, latency: time.Second, want: 0},
	} {
		if got := waves(tc.n, tc.limit, tc.latency); got != tc.want {
			t.Errorf("waves(%d, %d, %s) = %s, want %s", tc.n, tc.limit, tc.latency, got, tc.want)
		}
	}
}

func TestMergeSnapshots(t *testing.T) {
	h := func(count float64, cum ...float64) metrics.Histogram {
		out := metrics.Histogram{Count: count, Sum: count}
		for i, c := range cum {
			out.Buckets = append(out.Buckets, metrics.Bucket{Upper: float64(i + 1), Cumulative: c})
		}
		return out
	}
	got := mergeSnapshots([]metrics.Snapshot{
		{Values: map[string]float64{"a": 1}, Histograms: map[string]metrics.Histogram{"h": h(3, 1, 2, 3)}},
		{Values: map[string]float64{"a": 2, "b": 5}, Histograms: map[string]metrics.Histogram{"h": h(4, 2, 2, 4)}},
	})
	if got.Values["a"] != 3 || got.Values["b"] != 5 {
		t.Errorf("values %v, want a 3, b 5", got.Values)
	}
	want := h(7, 3, 4, 7)
	m := got.Histograms["h"]
	if m.Count != want.Count || m.Sum != want.Sum || !slices.Equal(m.Buckets, want.Buckets) {
		t.Errorf("histogram %+v, want %+v", m, want)
	}
}

func TestWALRecordStart(t *testing.T) {
	for _, tc := range []struct {
		at, want lsn
	}{
		{at: 0x60DE018, want: 0x60DE000}, // right after a page header
		{at: 0x6000028, want: 0x6000000}, // right after a segment's long header
		{at: 0x6000018, want: 0x6000018}, // 24 bytes into a segment is inside its long header
		{at: 0x60DE020, want: 0x60DE020}, // a record ended past the header
		{at: 0x60DE000, want: 0x60DE000},
	} {
		if got := walRecordStart(tc.at); got != tc.want {
			t.Errorf("walRecordStart(%s) = %s, want %s", tc.at, got, tc.want)
		}
	}
}
