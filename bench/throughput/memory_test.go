package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestReadStatus(t *testing.T) {
	s, err := readStatus(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if s.rss <= 0 || s.anon <= 0 || s.file <= 0 || s.anon+s.file > s.rss+1<<20 {
		t.Errorf("VmRSS %d, RssAnon %d, RssFile %d: want positive parts that add up to about the whole", s.rss, s.anon, s.file)
	}
}

// The provider's requests in flight: the most at once, and the mean from
// their summed time.
func TestInFlight(t *testing.T) {
	release := make(chan struct{})
	f := &inFlight{next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/charges" {
			<-release
		}
	})}
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			f.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/v1/charges", nil))
		})
	}
	for f.now.Load() < 5 {
		time.Sleep(time.Millisecond)
	}
	f.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/_stats", nil)) // not a charge
	time.Sleep(20 * time.Millisecond)
	close(release)
	wg.Wait()
	if got := f.max.Load(); got != 5 {
		t.Errorf("most in flight = %d, want 5", got)
	}
	if f.now.Load() != 0 || f.busy.Load() < int64(5*20*time.Millisecond) {
		t.Errorf("now %d, busy %s: want 0 and at least 5 × 20ms", f.now.Load(), time.Duration(f.busy.Load()))
	}
}

func TestComplaints(t *testing.T) {
	path := filepath.Join(t.TempDir(), "serve.log")
	log := `{"level":"WARN","msg":"outbox relay failed; trying again"}
{"level":"WARN","msg":"retrying messages"}
{"level":"WARN","msg":"outbox relay failed; trying again"}
not json
`
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	got := complaints(path)
	if want := `3 warnings or errors: 2× "outbox relay failed; trying again", 1× "retrying messages"`; got != want {
		t.Errorf("complaints = %q, want %q", got, want)
	}
}

func TestDescribe(t *testing.T) {
	s := memSample{at: 3 * time.Second, rss: 60 << 20, anon: 50 << 20, file: 10 << 20, runtime: map[string]float64{
		"go_memstats_heap_inuse_bytes": 30 << 20, "go_memstats_heap_idle_bytes": 10 << 20, "go_memstats_heap_released_bytes": 4 << 20,
		"go_memstats_stack_inuse_bytes": 5 << 20, "go_goroutines": 1200,
	}}
	out := describe(s)
	for _, want := range []string{"VmRSS 60.0 MiB", "RssFile 10.0 MiB", "in use 30.0 MiB", "1200 goroutines", "= 41.0 MiB"} {
		if !strings.Contains(out, want) {
			t.Errorf("describe lacks %q:\n%s", want, out)
		}
	}
}
