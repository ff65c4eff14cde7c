package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"example.com/billing/internal/metrics"
)

// memSample is the service's memory at one moment: the kernel's view
// (/proc/<pid>/status) and, when it serves profiles, the Go runtime's
// (go_memstats_* of /metrics).
type memSample struct {
	at              time.Duration // since the measurement started
	rss, anon, file int64         // VmRSS, RssAnon, RssFile, bytes
	runtime         map[string]float64
}

// watcher samples the service's resident set while a scenario runs and,
// with -profile, saves heap profiles (GET /debug/pprof/heap on
// DEBUG_PPROF_ADDR): one at the highest resident set seen, one every
// `every`, and one at the end. A heap profile holds both inuse_space (what
// the last GC found live) and alloc_space (everything allocated since the
// start): go tool pprof -sample_index=alloc_space.
type watcher struct {
	pid         int
	metricsAddr string // HTTP_ADDR, for the runtime's memory statistics
	pprofAddr   string // DEBUG_PPROF_ADDR; "" when not profiling
	dir, prefix string // where profiles go, and their file name prefix
	every       time.Duration

	start time.Time
	stop  chan struct{}
	done  chan struct{}

	mu         sync.Mutex
	peak       memSample // at the highest VmRSS seen, with the runtime's view when profiling
	maxAnon    int64     // the highest RssAnon seen: the memory the process owns, not the binary's pages
	profile    []byte    // the heap profile taken at peak
	goroutines []byte    // and the goroutine profile
	saved      []string  // files written
	err        error     // the first failure to profile
}

// sampleEvery is how often the resident set is read; a profile at a new
// peak is taken at most once per peakProfileGap, since taking one costs
// the service CPU and some memory of its own.
const (
	sampleEvery    = 100 * time.Millisecond
	peakProfileGap = time.Second
)

func startWatcher(pid int, metricsAddr, pprofAddr, dir, prefix string, every time.Duration) *watcher {
	w := &watcher{pid: pid, metricsAddr: metricsAddr, pprofAddr: pprofAddr, dir: dir, prefix: prefix, every: every,
		start: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

func (w *watcher) run() {
	defer close(w.done)
	tick := time.NewTicker(sampleEvery)
	defer tick.Stop()
	var periodic <-chan time.Time
	if w.pprofAddr != "" && w.every > 0 {
		t := time.NewTicker(w.every)
		defer t.Stop()
		periodic = t.C
	}
	var lastProfile time.Time
	var lastProfiled int64 // VmRSS when the last peak profile was taken
	for {
		select {
		case <-w.stop:
			return
		case <-periodic:
			w.note(w.save(fmt.Sprintf("t%03.0fs", time.Since(w.start).Seconds())))
		case <-tick.C:
			s, err := readStatus(w.pid)
			if err != nil {
				continue // the process is ending
			}
			s.at = time.Since(w.start)
			w.mu.Lock()
			w.maxAnon = max(w.maxAnon, s.anon)
			higher := s.rss > w.peak.rss
			if higher {
				s.runtime = w.peak.runtime // until a new profile comes with its own
				w.peak = s
			}
			w.mu.Unlock()
			// A profile at each new high, at most once per gap unless the
			// resident set grew by a tenth since the last one (a start-up
			// peak comes within the first second): the last one taken is
			// the one at (or nearest before) the peak.
			if higher && w.pprofAddr != "" && (time.Since(lastProfile) >= peakProfileGap || s.rss > lastProfiled+lastProfiled/10) {
				lastProfile, lastProfiled = time.Now(), s.rss
				w.note(w.takePeak(s))
			}
		}
	}
}

// takePeak fetches a heap profile, a goroutine profile (their stacks are
// the rest of the memory) and the runtime's statistics for the high s.
func (w *watcher) takePeak(s memSample) error {
	prof, err := fetch("http://" + w.pprofAddr + "/debug/pprof/heap")
	if err != nil {
		return err
	}
	goroutines, err := fetch("http://" + w.pprofAddr + "/debug/pprof/goroutine")
	if err != nil {
		return err
	}
	rt, err := runtimeStats(w.metricsAddr)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if s.rss >= w.peak.rss || w.profile == nil { // not overtaken while fetching
		s.runtime = rt
		w.peak, w.profile, w.goroutines = s, prof, goroutines
	}
	return nil
}

// save writes a heap profile taken now as <prefix>-<name>.pb.gz.
func (w *watcher) save(name string) error {
	prof, err := fetch("http://" + w.pprofAddr + "/debug/pprof/heap")
	if err != nil {
		return err
	}
	return w.write(name+".pb.gz", prof)
}

func (w *watcher) write(name string, b []byte) error {
	path := filepath.Join(w.dir, w.prefix+"-"+name)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return err
	}
	w.mu.Lock()
	w.saved = append(w.saved, path)
	w.mu.Unlock()
	return nil
}

func (w *watcher) note(err error) {
	if err == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
	}
}

// finish stops sampling and, when profiling, writes the profile taken at
// the peak (with a text file of the memory then) and one taken now. It
// returns the sample at the highest VmRSS, the highest RssAnon sampled,
// and the files written.
func (w *watcher) finish() (peak memSample, maxAnon int64, saved []string, err error) {
	close(w.stop)
	<-w.done
	if w.pprofAddr != "" {
		w.note(w.save("end"))
		w.mu.Lock()
		peak, prof, goroutines := w.peak, w.profile, w.goroutines
		w.mu.Unlock()
		if prof != nil {
			w.note(w.write("peak.pb.gz", prof))
			w.note(w.write("peak-goroutine.pb.gz", goroutines))
			w.note(w.write("peak.txt", []byte(describe(peak))))
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.peak, w.maxAnon, w.saved, w.err
}

// readStatus reads the resident set of pid from /proc/<pid>/status.
func readStatus(pid int) (memSample, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memSample{}, err
	}
	defer f.Close()
	var s memSample
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *int64
		switch name {
		case "VmRSS":
			dst = &s.rss
		case "RssAnon":
			dst = &s.anon
		case "RssFile":
			dst = &s.file
		default:
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return s, fmt.Errorf("%s: %w", name, err)
		}
		*dst = kb << 10
	}
	if s.rss == 0 {
		return s, errors.New("no VmRSS")
	}
	return s, sc.Err()
}

// runtimeStats are the Go runtime's memory statistics and goroutine count
// from /metrics (client_golang's Go collector).
func runtimeStats(addr string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	snap, err := metrics.Scrape(ctx, "http://"+addr+"/metrics")
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for k, v := range snap.Values {
		if strings.HasPrefix(k, "go_memstats_") || k == "go_goroutines" || k == "go_threads" {
			out[k] = v
		}
	}
	return out, nil
}

func fetch(url string) ([]byte, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return io.ReadAll(resp.Body)
}

// mib formats bytes in MiB.
func mib(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }

// describe says what the resident set was made of at s: the kernel's
// anonymous and file-backed pages, and the Go runtime's heap (in use, free
// but not returned to the OS), stacks and bookkeeping.
func describe(s memSample) string {
	var b strings.Builder
	fmt.Fprintf(&b, "at %.1fs: VmRSS %s (RssAnon %s, RssFile %s: the binary's pages)\n",
		s.at.Seconds(), mib(float64(s.rss)), mib(float64(s.anon)), mib(float64(s.file)))
	m := s.runtime
	if m == nil {
		return b.String()
	}
	g := func(name string) float64 { return m["go_memstats_"+name] }
	fmt.Fprintf(&b, "Go runtime: Sys %s = heap %s (in use %s, of which objects %s; idle %s, of which released to the OS %s)\n",
		mib(g("sys_bytes")), mib(g("heap_sys_bytes")), mib(g("heap_inuse_bytes")), mib(g("heap_alloc_bytes")),
		mib(g("heap_idle_bytes")), mib(g("heap_released_bytes")))
	fmt.Fprintf(&b, "  + stacks %s (in use %s, %.0f goroutines, %.0f threads) + mspan %s + mcache %s + GC metadata %s + profiling buckets %s + other %s\n",
		mib(g("stack_sys_bytes")), mib(g("stack_inuse_bytes")), m["go_goroutines"], m["go_threads"],
		mib(g("mspan_sys_bytes")), mib(g("mcache_sys_bytes")), mib(g("gc_sys_bytes")), mib(g("buck_hash_sys_bytes")), mib(g("other_sys_bytes")))
	fmt.Fprintf(&b, "  resident estimate: heap in use + idle not released + stacks + metadata = %s; next GC at %s of heap objects\n",
		mib(g("heap_inuse_bytes")+g("heap_idle_bytes")-g("heap_released_bytes")+g("stack_inuse_bytes")+
			g("mspan_inuse_bytes")+g("mcache_inuse_bytes")+g("gc_sys_bytes")+g("buck_hash_sys_bytes")+g("other_sys_bytes")),
		mib(g("next_gc_bytes")))
	return b.String()
}

// slug makes a scenario's name a file name.
func slug(s string) string {
	return strings.Trim(regexp.MustCompile(`[^a-zA-Z0-9.]+`).ReplaceAllString(s, "-"), "-")
}
