package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/reconcile"
)

// reconcileRun runs `billing reconcile args...` and returns its stdout.
func reconcileRun(t *testing.T, env map[string]string, args ...string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), append([]string{"billing", "reconcile"}, args...), env, nil, &stdout, &stderr)
	t.Logf("billing reconcile %s\n%s%s", strings.Join(args, " "), stdout.String(), stderr.String())
	return stdout.String(), err
}

func TestReconcile_AfterThePipelineThenWithLosses(t *testing.T) {
	h := newHarness(t, 2)
	h.psp.SetOptions(fakepsp.Options{DeclineEvery: 5, Seed: 1})
	start := time.Now().UTC()
	h.serve(h.environ())

	const n = 10
	for i := range int64(n) {
		_, value := event(t, 300+i, 1000+i, "EUR")
		h.publish(int32(i%2), strconv.FormatInt(300+i, 10), value)
	}
	h.waitCaughtUp()

	// The window ends a minute from now: nothing is in flight any more.
	env := h.environ()
	window := []string{"--from", start.Add(-time.Minute).Format(time.RFC3339Nano), "--to", time.Now().Add(time.Minute).Format(time.RFC3339Nano)}
	out, err := reconcileRun(t, env, window...)
	if err != nil {
		t.Fatalf("reconcile after a clean run: %v", err)
	}
	if !strings.Contains(out, "matched 8, declined or rejected (not expected at the provider) 2, missing at provider 0, missing in database 0, mismatched 0, pending 0") {
		t.Fatalf("clean run: unexpected summary:\n%s", out)
	}

	// Now lose a row, charge outside billing, and alter an amount.
	var deleted, altered string
	if err := h.db.Get(&deleted, `DELETE FROM charge WHERE order_id = 301 RETURNING event_id`); err != nil {
		t.Fatal(err)
	}
	if err := h.db.Get(&altered, `UPDATE charge SET amount_minor = amount_minor + 1 WHERE order_id = 302 RETURNING event_id`); err != nil {
		t.Fatal(err)
	}
	extra := uuid.Must(uuid.NewV7()).String()
	if code := postCharge(t, h.pspURL, "", 999, extra); code != http.StatusOK {
		t.Fatalf("extra provider charge: %d", code)
	}

	out, err = reconcileRun(t, env, append(window, "--format", "json")...)
	var ec interface{ ExitCode() int }
	if !errors.As(err, &ec) || ec.ExitCode() != 2 {
		t.Fatalf("reconcile with discrepancies: err = %v, want exit status 2", err)
	}
	var rep reconcile.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("JSON report: %v\n%s", err, out)
	}
	want := reconcile.Summary{Records: 9, Charges: 9, Matched: 6, Declined: 2, MissingInDB: 2, Mismatched: 1}
	if rep.Summary != want {
		t.Errorf("summary = %+v, want %+v", rep.Summary, want)
	}
	got := map[string]reconcile.Kind{}
	for _, d := range rep.Discrepancies {
		got[d.Key] = d.Kind
		if d.Kind == reconcile.Mismatch && (len(d.Diffs) != 1 || d.Diffs[0].Field != "amount") {
			t.Errorf("mismatch %s: diffs %+v, want the amount only", d.Key, d.Diffs)
		}
	}
	wantKinds := map[string]reconcile.Kind{deleted: reconcile.MissingInDB, extra: reconcile.MissingInDB, altered: reconcile.Mismatch}
	if len(got) != len(wantKinds) {
		t.Errorf("discrepancies %v, want %v", got, wantKinds)
	}
	for k, kind := range wantKinds {
		if got[k] != kind {
			t.Errorf("%s: %q, want %q", k, got[k], kind)
		}
	}

	// A row the provider never saw.
	if _, err := h.db.Exec(`INSERT INTO charge (event_id, order_id, customer_id, amount_minor, currency, status, provider_charge_id)
VALUES ($1, 777, 1777, 500, 'EUR', 'succeeded', 'ch_ghost')`, uuid.Must(uuid.NewV7()).String()); err != nil {
		t.Fatal(err)
	}
	out, err = reconcileRun(t, env, window...)
	if err == nil || !strings.Contains(out, "missing at provider 1, missing in database 2, mismatched 1") ||
		!strings.Contains(out, "MISSING AT PROVIDER") || !strings.Contains(out, "charge ch_ghost") {
		t.Errorf("text report: err %v\n%s", err, out)
	}
}

func TestReconcile_Flags(t *testing.T) {
	now := time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC)
	w, err := reconcileWindow("", "", 5*time.Minute, now)
	if err != nil || !w.To.Equal(now.Add(-5*time.Minute)) || !w.From.Equal(w.To.Add(-24*time.Hour)) {
		t.Errorf("default window = %+v, %v; want the 24h ending 5m ago", w, err)
	}
	w, err = reconcileWindow("2026-03-01T00:00:00+01:00", "", 0, now)
	if err != nil || !w.From.Equal(time.Date(2026, 2, 28, 23, 0, 0, 0, time.UTC)) || !w.To.Equal(now) {
		t.Errorf("--from only = %+v, %v", w, err)
	}
	for _, bad := range [][2]string{{"yesterday", ""}, {"", "2026-03-01"}, {"2026-03-02T00:00:00Z", "2026-03-01T00:00:00Z"}} {
		if _, err := reconcileWindow(bad[0], bad[1], 0, now); err == nil {
			t.Errorf("reconcileWindow(%q, %q) accepted", bad[0], bad[1])
		}
	}

	env := map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/x", "PAYMENT_BASE_URL": "http://127.0.0.1:1"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--format", "xml"}, "--format"},
		{[]string{"extra"}, "takes no arguments"},
		{[]string{"--settle", "-1m"}, "--settle"},
		{[]string{"--to", "now"}, "--to"},
	} {
		if _, err := reconcileRun(t, env, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("reconcile %v: err = %v, want %q", tc.args, err, tc.want)
		}
	}
	if _, err := reconcileRun(t, map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/x"}); err == nil || !strings.Contains(err.Error(), "PAYMENT_BASE_URL") {
		t.Errorf("missing PAYMENT_BASE_URL: err = %v", err)
	}
	// A database that does not answer is an error (exit 1), not a report.
	_, err = reconcileRun(t, env)
	var ec interface{ ExitCode() int }
	if err == nil || errors.As(err, &ec) {
		t.Errorf("unreachable database: err = %v, want a plain error", err)
	}
	out, err := reconcileRun(t, env, "-h")
	if err != nil || !strings.Contains(out, "Usage: billing reconcile") || !strings.Contains(out, "-slack") {
		t.Errorf("-h: %v\n%s", err, out)
	}
}
