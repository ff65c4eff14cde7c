package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"example.com/billing/internal/testenv/dbtest"
	"example.com/billing/internal/testenv/wait"
)

// TestServe_ProfilesOnlyOnTheirOwnListener: with DEBUG_PPROF_ADDR set,
// serve answers the profiles there, from the start (before Kafka answers),
// and never on HTTP_ADDR; an address it cannot listen on stops it with an
// error naming the variable.
func TestServe_ProfilesOnlyOnTheirOwnListener(t *testing.T) {
	t.Parallel()
	_, dsn := dbtest.New(t)

	t.Run("OK_Served", func(t *testing.T) {
		env := schemaEnv(t, dsn) // a broker that refuses: serve waits for it, serving HTTP
		env["DEBUG_PPROF_ADDR"] = freeAddr(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		logs := &syncBuffer{}
		go func() { done <- run(ctx, []string{"billing", "serve"}, env, nil, io.Discard, logs) }()
		// The index, not a profile: a heap profile of this test binary
		// (every in-process serve of the package, under the race
		// detector) can take longer to write than the wait on a loaded
		// machine. internal/server's test reads the profiles themselves.
		wait.For(t, 20*time.Second, "the profiles' index on DEBUG_PPROF_ADDR", func() bool {
			select {
			case err := <-done:
				t.Fatalf("serve returned %v before serving profiles\n%s", err, logs.String())
			default:
			}
			code, body := get(env["DEBUG_PPROF_ADDR"], "/debug/pprof/")
			return code == http.StatusOK && strings.Contains(body, "heap")
		})
		if code, _ := get(env["HTTP_ADDR"], "/debug/pprof/heap"); code != http.StatusNotFound {
			t.Errorf("HTTP_ADDR /debug/pprof/heap: %d, want 404", code)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve exited with %v, want exit 0\n%s", err, logs.String())
		}
	})

	t.Run("ErrAddressTaken", func(t *testing.T) {
		taken, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer taken.Close()
		env := schemaEnv(t, dsn)
		env["DEBUG_PPROF_ADDR"] = taken.Addr().String()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err = run(ctx, []string{"billing", "serve"}, env, nil, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "DEBUG_PPROF_ADDR") {
			t.Errorf("serve with DEBUG_PPROF_ADDR taken: %v, want an error naming DEBUG_PPROF_ADDR", err)
		}
	})
}
