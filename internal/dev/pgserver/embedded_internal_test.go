package pgserver

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// jar reads a test jar of testdata (written by testdata/make-jars.sh).
func jar(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// repository serves jar at every path and counts the requests.
func repository(t *testing.T, jar []byte) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		_, _ = w.Write(jar)
	}))
	t.Cleanup(srv.Close)
	return srv, &requests
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func TestFetch(t *testing.T) {
	t.Run("OK_OneFetchForConcurrentCallersThenTheCache", func(t *testing.T) {
		jar := jar(t, "installation.jar")
		srv, requests := repository(t, jar)
		a := artifact{repository: srv.URL, version: "15.19.0", platform: "linux-amd64", sha256: digest(jar)}
		cache := t.TempDir()
		// Test binaries of several packages ask at once; each call opens
		// the lock file anew, as another process would.
		var wg sync.WaitGroup
		results := make([]Binaries, 4)
		errs := make([]error, 4)
		for i := range results {
			wg.Go(func() { results[i], errs[i] = fetch(t.Context(), a, cache) })
		}
		wg.Wait()
		fetched := 0
		for i, b := range results {
			if errs[i] != nil {
				t.Fatalf("fetch %d: %v", i, errs[i])
			}
			if b.Fetched > 0 {
				fetched++
			}
			if want := filepath.Join(cache, "postgres-15.19.0-linux-amd64", "bin"); b.Dir != want || !b.Embedded || b.Version != "15.19.0" {
				t.Errorf("fetch %d: %+v, want Dir %s, embedded, 15.19.0", i, b, want)
			}
		}
		if n := requests.Load(); n != 1 || fetched != 1 {
			t.Errorf("%d downloads, %d callers say they fetched: want one of each", n, fetched)
		}
		home := results[0].Home
		if fi, err := os.Stat(filepath.Join(home, "bin", "postgres")); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("bin/postgres: %v, %v; want mode 0755", fi, err)
		}
		if l, err := os.Readlink(filepath.Join(home, "lib", "libpq.so")); err != nil || l != "libpq.so.5.15" {
			t.Errorf("lib/libpq.so -> %q, %v", l, err)
		}
		left, _ := filepath.Glob(filepath.Join(cache, "*"))
		if len(left) != 2 {
			t.Errorf("cache holds %v, want the installation and its lock file", left)
		}
		b, err := fetch(t.Context(), a, cache)
		if err != nil || b.Fetched != 0 || requests.Load() != 1 {
			t.Errorf("second fetch: %+v, %v, %d downloads: want the cache", b, err, requests.Load())
		}
	})

	refused := []struct {
		name, jar string
		sha256    func(jar []byte) string
		message   string
	}{
		{"ErrDigestDiffers", "installation.jar", func([]byte) string { return strings.Repeat("0", 64) }, "SHA-256"},
		{"ErrPathLeavesTheArchive", "path-leaves.jar", digest, "leaves the archive"},
		{"ErrLinkLeavesTheArchive", "link-leaves.jar", digest, "leaves the archive"},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			jar := jar(t, tt.jar)
			srv, _ := repository(t, jar)
			cache := t.TempDir()
			_, err := fetch(t.Context(), artifact{repository: srv.URL, version: "15.19.0", platform: "linux-amd64", sha256: tt.sha256(jar)}, cache)
			if err == nil || !strings.Contains(err.Error(), tt.message) {
				t.Fatalf("fetch: %v, want an error saying %q", err, tt.message)
			}
			left, _ := filepath.Glob(filepath.Join(cache, "postgres-*"))
			if len(left) != 1 || !strings.HasSuffix(left[0], ".lock") {
				t.Errorf("cache holds %v after a refused fetch, want only the lock file", left)
			}
			if _, err := os.Stat(filepath.Join(cache, "evil")); err == nil {
				t.Error("the archive wrote outside the cache")
			}
		})
	}
}
