// Package server serves billing's operational HTTP endpoints: liveness,
// readiness and Prometheus metrics.
package server

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Readiness is what /readyz checks.
type Readiness struct {
	// Schema reads the database's schema and says why this release does
	// not run on it ("" when it does): an answer also says that the
	// database is reachable.
	Schema func(ctx context.Context) (problem string, err error)
	// Writable says why the database takes no writes (in recovery,
	// read-only), nil when it does (postgres.CheckWritable).
	Writable func(ctx context.Context) error
	// Consumer reports whether the consumer holds a group session.
	Consumer func() bool
	// MissingACLs, when set, lists the Kafka permissions the service's
	// principal lacks (e.g. "Write on Topic orders.confirmed.dlq"): with
	// one missing, something it must do fails, now or at first use.
	MissingACLs func() []string
}

// pingTimeout keeps /readyz answering quickly while the database hangs.
const pingTimeout = 2 * time.Second

// NewHandler returns the router of /healthz, /readyz and /metrics.
func NewHandler(ready Readiness, gatherer prometheus.Gatherer, log *slog.Logger) http.Handler {
	r := chi.NewRouter()
	r.Use(middleware.Recoverer)
	r.Get("/healthz", handleHealthz)
	r.Get("/readyz", handleReadyz(ready, log))
	r.Method(http.MethodGet, "/metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	return r
}

// NewDebugHandler returns Go's runtime profiles (net/http/pprof) under
// /debug/pprof/: the index, heap, allocs, goroutine, CPU profile and
// execution trace. serve puts it on a listener of its own
// (DEBUG_PPROF_ADDR), off by default; NewHandler never serves it.
func NewDebugHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index) // the named profiles: heap, allocs, goroutine, ...
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// handleHealthz answers 200 while the process is alive: a liveness probe
// must not fail because a dependency is down, or Kubernetes would restart
// a healthy process that is waiting out an outage.
func handleHealthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok"})
}

// handleReadyz answers 200 only when the database answers with a schema
// migrated to this binary's version (or later) and takes writes, the
// consumer holds a group session and no Kafka permission is missing, else
// 503 naming what is missing. The schema is checked on
// every probe because it can change underneath a running process (a
// restored backup, a migration rolled back): events would then fail one by
// one while the process looked healthy.
//
// It answers within pingTimeout whatever the database does. A query on a
// connection whose packets are dropped (a network partition, a failover
// behind a dead address) does not end when its context does: lib/pq waits
// for the server's answer until the connection itself fails, which took
// minutes before postgres.Open set TCP timeouts and still takes seconds. The
// check runs on its own, the probe stops waiting for it at pingTimeout and
// says so, and the next probe joins the check still running rather than
// taking another connection for another stuck query.
func handleReadyz(ready Readiness, log *slog.Logger) http.HandlerFunc {
	var db databaseCheck
	return func(w http.ResponseWriter, r *http.Request) {
		missing := []string{}
		ctx, cancel := context.WithTimeout(r.Context(), pingTimeout)
		defer cancel()
		if m, ok := db.await(ctx, func(ctx context.Context) []string { return checkDatabase(ctx, ready, log) }); ok {
			missing = append(missing, m...)
		} else {
			missing = append(missing, fmt.Sprintf("database: no answer within %s", pingTimeout))
		}
		if !ready.Consumer() {
			missing = append(missing, "consumer group session")
		}
		if ready.MissingACLs != nil {
			for _, acl := range ready.MissingACLs() {
				missing = append(missing, "kafka ACL: "+acl)
			}
		}
		if len(missing) > 0 {
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "not ready", "missing": missing})
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"status": "ready"})
	}
}

// checkDatabase returns what the database lacks for billing: nothing, or
// why it is unreachable, behind in schema or refusing writes.
func checkDatabase(ctx context.Context, ready Readiness, log *slog.Logger) []string {
	switch problem, err := ready.Schema(ctx); {
	case err != nil:
		log.Debug("readiness: database unreachable", "err", err)
		return []string{"database"}
	case problem != "":
		return []string{"database schema: " + problem}
	}
	if err := ready.Writable(ctx); err != nil {
		return []string{"database writes: " + err.Error()}
	}
	return nil
}

// databaseCheck runs one database check at a time for the probes.
type databaseCheck struct {
	mu      sync.Mutex
	running *checkRun
}

type checkRun struct {
	done    chan struct{}
	missing []string // valid once done is closed
}

// await returns the result of the check in progress, or of one it starts,
// and false when ctx ends first. The check has a pingTimeout of its own,
// apart from any probe's.
func (c *databaseCheck) await(ctx context.Context, check func(context.Context) []string) ([]string, bool) {
	c.mu.Lock()
	run := c.running
	if run == nil {
		run = &checkRun{done: make(chan struct{})}
		c.running = run
		go func() {
			checkCtx, cancel := context.WithTimeout(context.Background(), pingTimeout)
			defer cancel()
			run.missing = check(checkCtx)
			c.mu.Lock()
			c.running = nil
			c.mu.Unlock()
			close(run.done)
		}()
	}
	c.mu.Unlock()
	select {
	case <-run.done:
		return run.missing, true
	case <-ctx.Done():
		return nil, false
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
