package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"example.com/billing/internal/server"
)

func TestReadyz(t *testing.T) {
	t.Parallel()
	schema := func(problem string, err error) func(context.Context) (string, error) {
		return func(context.Context) (string, error) { return problem, err }
	}
	const behind = "the database schema is at version 2; this release runs on schemas 3 and newer (it embeds 3): run billing migrate of this release first"
	tests := []struct {
		name        string
		schema      func(context.Context) (string, error)
		consumer    bool
		readOnly    error
		wantStatus  int
		wantMissing []string
	}{
		{"OK_Ready", schema("", nil), true, nil, http.StatusOK, nil},
		{"ErrDatabaseTakesNoWrites", schema("", nil), true, errors.New("in recovery"), http.StatusServiceUnavailable,
			[]string{"database writes: in recovery"}},
		{"ErrDatabaseDown", schema("", errors.New("connection refused")), true, nil, http.StatusServiceUnavailable, []string{"database"}},
		{"ErrSchemaThisReleaseDoesNotRunOn", schema(behind, nil), true, nil, http.StatusServiceUnavailable,
			[]string{"database schema: " + behind}},
		{"ErrNoSession", schema("", nil), false, nil, http.StatusServiceUnavailable, []string{"consumer group session"}},
		{"ErrEverything", schema("", errors.New("timeout")), false, nil, http.StatusServiceUnavailable, []string{"database", "consumer group session"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := server.NewHandler(server.Readiness{
				Schema:   tt.schema,
				Writable: func(context.Context) error { return tt.readOnly },
				Consumer: func() bool { return tt.consumer },
			}, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			if rec.Code != tt.wantStatus {
				t.Errorf("status %d, want %d", rec.Code, tt.wantStatus)
			}
			var body struct {
				Status  string   `json:"status"`
				Missing []string `json:"missing"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %q is not JSON: %v", rec.Body.String(), err)
			}
			if !slices.Equal(body.Missing, tt.wantMissing) {
				t.Errorf("missing = %q, want %q", body.Missing, tt.wantMissing)
			}
		})
	}
}

// A database whose packets are dropped does not answer, and a query waits
// for it past its context: /readyz still answers 503 within its timeout,
// saying so, and probes meanwhile wait for the one check in progress
// instead of each taking a connection for another stuck query.
func TestReadyz_AnswersWhileTheDatabaseHangs(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	// Whatever /readyz does, the database answers after 5s.
	timer := time.AfterFunc(5*time.Second, unblock)
	defer timer.Stop()
	var calls atomic.Int32
	h := server.NewHandler(server.Readiness{
		Schema: func(context.Context) (string, error) {
			calls.Add(1)
			<-release // as lib/pq does on a dead connection: ctx or not
			return "", nil
		},
		Writable: func(context.Context) error { return nil },
		Consumer: func() bool { return true },
	}, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))

	probe := func() (int, string, time.Duration) {
		started := time.Now()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code, rec.Body.String(), time.Since(started)
	}
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			code, body, took := probe()
			if code != http.StatusServiceUnavailable || !strings.Contains(body, "database: no answer within 2s") {
				t.Errorf("/readyz while the database hangs: %d %s, want 503 naming the database", code, body)
			}
			if took > 3*time.Second {
				t.Errorf("/readyz took %s while the database hangs, want about 2s", took)
			}
		})
	}
	wg.Wait()
	if n := calls.Load(); n != 1 {
		t.Errorf("%d database checks ran for three probes of one stuck check, want 1", n)
	}
	unblock()
	if code, body, _ := probe(); code != http.StatusOK {
		t.Errorf("/readyz once the database answers: %d %s, want 200", code, body)
	}
}

// A Kafka permission the principal lacks makes the service unready, named,
// also while everything else is in place.
func TestReadyz_MissingACLsAreNamed(t *testing.T) {
	t.Parallel()
	h := server.NewHandler(server.Readiness{
		Schema:      func(context.Context) (string, error) { return "", nil },
		Writable:    func(context.Context) error { return nil },
		Consumer:    func() bool { return true },
		MissingACLs: func() []string { return []string{"Write on Topic orders.confirmed.dlq"} },
	}, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	var body struct {
		Missing []string `json:"missing"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("body %q is not JSON: %v", rec.Body.String(), err)
	}
	if want := []string{"kafka ACL: Write on Topic orders.confirmed.dlq"}; rec.Code != http.StatusServiceUnavailable || !slices.Equal(body.Missing, want) {
		t.Fatalf("/readyz = %d %q, want 503 %q", rec.Code, body.Missing, want)
	}
}

// Profiles are served by the debug handler only: the operational router,
// whose port is scraped from outside, has no /debug/pprof/.
func TestDebugHandler_ServesProfilesTheOperationalRouterDoesNot(t *testing.T) {
	t.Parallel()
	debug := server.NewDebugHandler()
	ops := server.NewHandler(server.Readiness{
		Schema:   func(context.Context) (string, error) { return "", nil },
		Writable: func(context.Context) error { return nil },
		Consumer: func() bool { return true },
	}, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	get := func(h http.Handler, path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec
	}
	for _, path := range []string{"/debug/pprof/heap", "/debug/pprof/allocs", "/debug/pprof/goroutine"} {
		rec := get(debug, path)
		// A protobuf profile, gzip-compressed: what go tool pprof reads.
		if body := rec.Body.Bytes(); rec.Code != http.StatusOK || len(body) < 2 || body[0] != 0x1f || body[1] != 0x8b {
			t.Errorf("debug handler %s: %d, %d bytes; want 200 and a gzip-compressed profile", path, rec.Code, len(body))
		}
		if rec := get(ops, path); rec.Code != http.StatusNotFound {
			t.Errorf("operational router %s: %d, want 404", path, rec.Code)
		}
	}
	if rec := get(debug, "/debug/pprof/"); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "heap") {
		t.Errorf("debug handler index: %d, want 200 listing the profiles", rec.Code)
	}
}
