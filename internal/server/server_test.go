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
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"example.com/billing/internal/server"
)

func TestReadyz(t *testing.T) {
	t.Parallel()
	const want = 3
	version := func(v int64, err error) func(context.Context) (int64, error) {
		return func(context.Context) (int64, error) { return v, err }
	}
	tests := []struct {
		name        string
		schema      func(context.Context) (int64, error)
		consumer    bool
		readOnly    error
		wantStatus  int
		wantMissing []string
	}{
		{"OK_Ready", version(want, nil), true, nil, http.StatusOK, nil},
		{"ErrDatabaseTakesNoWrites", version(want, nil), true, errors.New("in recovery"), http.StatusServiceUnavailable,
			[]string{"database writes: in recovery"}},
		// A binary rolled back after a migration still runs: migrations
		// are additive.
		{"OK_SchemaNewerThanBinary", version(want+1, nil), true, nil, http.StatusOK, nil},
		{"ErrDatabaseDown", version(0, errors.New("connection refused")), true, nil, http.StatusServiceUnavailable, []string{"database"}},
		{"ErrSchemaBehind", version(want-1, nil), true, nil, http.StatusServiceUnavailable,
			[]string{"database schema: at version 2, billing needs 3 (run billing migrate)"}},
		{"ErrNeverMigrated", version(0, nil), true, nil, http.StatusServiceUnavailable,
			[]string{"database schema: at version 0, billing needs 3 (run billing migrate)"}},
		{"ErrNoSession", version(want, nil), false, nil, http.StatusServiceUnavailable, []string{"consumer group session"}},
		{"ErrEverything", version(0, errors.New("timeout")), false, nil, http.StatusServiceUnavailable, []string{"database", "consumer group session"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := server.NewHandler(server.Readiness{
				SchemaVersion: tt.schema,
				WantSchema:    want,
				Writable:      func(context.Context) error { return tt.readOnly },
				Consumer:      func() bool { return tt.consumer },
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

// A Kafka permission the principal lacks makes the service unready, named,
// also while everything else is in place.
func TestReadyz_MissingACLsAreNamed(t *testing.T) {
	t.Parallel()
	h := server.NewHandler(server.Readiness{
		SchemaVersion: func(context.Context) (int64, error) { return 3, nil },
		WantSchema:    3,
		Writable:      func(context.Context) error { return nil },
		Consumer:      func() bool { return true },
		MissingACLs:   func() []string { return []string{"Write on Topic orders.confirmed.dlq"} },
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
