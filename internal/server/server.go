// Package server serves billing's operational HTTP endpoints: liveness,
// readiness and Prometheus metrics.
package server

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Readiness is what /readyz checks.
type Readiness struct {
	// SchemaVersion reads the database's schema version
	// (postgres.SchemaVersion): an answer says that the database is
	// reachable, its value whether the schema is the one billing needs.
	SchemaVersion func(ctx context.Context) (int64, error)
	// WantSchema is the schema version this binary needs.
	WantSchema int64
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
func handleReadyz(ready Readiness, log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		missing := []string{}
		ctx, cancel := context.WithTimeout(r.Context(), pingTimeout)
		defer cancel()
		switch have, err := ready.SchemaVersion(ctx); {
		case err != nil:
			log.Debug("readiness: database unreachable", "err", err)
			missing = append(missing, "database")
		case have < ready.WantSchema:
			missing = append(missing, fmt.Sprintf("database schema: at version %d, billing needs %d (run billing migrate)", have, ready.WantSchema))
		default:
			if err := ready.Writable(ctx); err != nil {
				missing = append(missing, "database writes: "+err.Error())
			}
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

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
