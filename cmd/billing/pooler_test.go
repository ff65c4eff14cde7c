package main

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"example.com/billing/internal/testenv/pgbouncer"
	"example.com/billing/internal/testenv/wait"
)

// Two replicas of serve and maintain through PgBouncer in transaction
// mode: serve says which pool mode it found, every event is charged once
// and announced, one replica relays, maintain runs (it is not skipped for
// a lock nobody holds), and once they stopped nothing is held.
func TestServe_ThroughATransactionPooler(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 3)
	bouncer := pgbouncer.Require(t, h.dsn, pgbouncer.Options{Mode: pgbouncer.Transaction, PoolSize: 4})
	pooled := bouncer.URL(h.dsn)
	a := h.serve(h.environ("DATABASE_URL", pooled))
	b := h.serve(h.environ("DATABASE_URL", pooled))
	for _, s := range []*service{a, b} {
		s.waitLog(t, `"msg":"database pool mode","pool_mode":"transaction"`)
	}

	const n = 30
	for i := range int64(n) {
		_, value := event(t, 500+i, 1000+i, "EUR")
		h.publish(int32(i%3), strconv.FormatInt(500+i, 10), value)
	}
	h.waitCaughtUp()
	if got := h.count(`SELECT count(*) FROM charge WHERE status = 'succeeded'`); got != n {
		t.Errorf("succeeded charges = %d, want %d", got, n)
	}
	h.outcomes(n)
	relaying := 0
	for _, s := range []*service{a, b} {
		if strings.Contains(s.logs.String(), `"msg":"relaying payment outcome events"`) {
			relaying++
		}
	}
	if relaying != 1 {
		t.Errorf("%d replicas relayed, want one", relaying)
	}

	var out, errOut syncBuffer
	if err := run(t.Context(), []string{"billing", "maintain"}, map[string]string{"DATABASE_URL": pooled}, nil, &out, &errOut); err != nil {
		t.Fatalf("maintain through the pooler: %v\n%s", err, errOut.String())
	}
	if strings.Contains(out.String(), `"skipped":true`) {
		// serve's own maintenance may hold a lease at that moment: it
		// names itself.
		if !strings.Contains(out.String(), `"heldBy":"`) {
			t.Errorf("maintain skipped without naming the holder: %s", out.String())
		}
	}

	a.stop(t)
	b.stop(t)
	wait.For(t, 5*time.Second, "nothing held once every process stopped", func() bool {
		return h.count(`SELECT count(*) FROM billing_lease WHERE expires_at > now()`) == 0 &&
			h.count(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`) == 0
	})
}

// With binary_parameters turned off, lib/pq's parameterised statements
// take two round trips, which a transaction pooler may give to two server
// sessions: serve refuses to start, naming the pool mode, before it takes
// anything.
func TestServe_RefusesATransactionPoolerWithoutBinaryParameters(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1)
	bouncer := pgbouncer.Require(t, h.dsn, pgbouncer.Options{Mode: pgbouncer.Transaction})
	err := serveUntilItStops(t, bouncer.URL(h.dsn)+"&binary_parameters=no")
	for _, s := range []string{"pool mode transaction", "binary_parameters"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
}
