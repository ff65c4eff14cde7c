// Package server serves billing's operational HTTP endpoints: liveness,
// readiness and Prometheus metrics.
package server

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Pinger reaches the database.
type Pinger interface {
	PingContext(ctx context.Context) error
}

// Readiness is what /readyz checks besides the database.
type Readiness struct {
	DB Pinger
	// Consumer reports whether the consumer holds a group session.
	Consumer func() bool
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

// handleReadyz answers 200 only when the database answers and the consumer
// holds a group session, else 503 naming what is missing.
func handleReadyz(ready Readiness, log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		missing := []string{}
		ctx, cancel := context.WithTimeout(r.Context(), pingTimeout)
		defer cancel()
		if err := ready.DB.PingContext(ctx); err != nil {
			log.Debug("readiness: database unreachable", "err", err)
			missing = append(missing, "database")
		}
		if !ready.Consumer() {
			missing = append(missing, "consumer group session")
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
