//go:build dev

package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"example.com/billing/internal/dev/loadgen"
	"example.com/billing/internal/dev/pgserver"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/testenv/dbtest"
	"example.com/billing/internal/testenv/kafkatest"
)

// demoDatabase returns a database name of the test's own, dropped when the
// test ends, so that the test never touches the billing_demo of a person
// running `make demo` on the same server.
func demoDatabase(t *testing.T) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "billing_demo_test_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		admin, err := postgres.Open(dbtest.ServerURL(t), 1)
		if err != nil {
			t.Errorf("drop %s: %v", name, err)
			return
		}
		defer admin.Close()
		if _, err := admin.Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)"); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
	})
	return name
}

var summaryRow = regexp.MustCompile(`(?m)^(\S[^\n]*?)\s{2,}(\d+)\s+(\d+)\s{3}`)

// summaryRows returns the summary table: row label → measured, expected.
func summaryRows(t *testing.T, out string) map[string][2]int64 {
	t.Helper()
	rows := map[string][2]int64{}
	for _, m := range summaryRow.FindAllStringSubmatch(out, -1) {
		got, _ := strconv.ParseInt(m[2], 10, 64)
		want, _ := strconv.ParseInt(m[3], 10, 64)
		rows[strings.TrimSpace(m[1])] = [2]int64{got, want}
	}
	if len(rows) < 10 {
		t.Fatalf("no summary table in:\n%s", out)
	}
	return rows
}

func TestDemo_SummaryMatchesTheDatabaseProviderAndBroker(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	name := demoDatabase(t)
	const count = 300
	c := startCommand(t, map[string]string{"DATABASE_URL": dbtest.ServerURL(t)}, "demo",
		"--count", strconv.Itoa(count), "--partitions", "3", "--keep", "--db-name", name,
		"--log", filepath.Join(t.TempDir(), "serve.log"))
	c.waitOutput(t, regexp.MustCompile(`Ctrl-C stops everything`), 90*time.Second)
	out := c.stdout.String()
	if !strings.Contains(out, "\nPASS: ") {
		t.Fatalf("no PASS line:\n%s", out)
	}
	rows := summaryRows(t, out)
	measured := func(row string) int64 {
		t.Helper()
		r, ok := rows[row]
		if !ok {
			t.Fatalf("summary has no row %q:\n%s", row, out)
		}
		return r[0]
	}

	// The generator's truth, recomputed here with the demo's defaults: the
	// mix depends only on the options and the seed.
	g, err := loadgen.New(loadgen.Options{Count: count, Duplicates: 0.10, Invalid: 0.03, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, ok, err := g.Next(); err != nil || !ok {
			break
		}
	}
	exp := g.Expected()
	declined := exp.Declined(20)

	// The database.
	u, err := url.Parse(dbtest.ServerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	db, err := postgres.Open(u.String(), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	count1 := func(q string) int64 {
		t.Helper()
		var n int64
		if err := db.Get(&n, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return n
	}
	dbChecks := []struct {
		row, query string
		truth      int64
	}{
		{"unique events processed", `SELECT count(*) FROM processed_event`, int64(exp.Unique)},
		{"charged", `SELECT count(*) FROM charge WHERE status = 'succeeded'`, int64(exp.Unique - declined)},
		{"declined by the provider", `SELECT count(*) FROM charge WHERE status = 'declined'`, int64(declined)},
		{"orders charged twice (database)", `SELECT count(*) FROM (SELECT order_id FROM charge
			WHERE status = 'succeeded' GROUP BY order_id HAVING count(*) > 1) AS twice`, 0},
	}
	for _, ch := range dbChecks {
		got := count1(ch.query)
		if m := measured(ch.row); m != got {
			t.Errorf("summary %q = %d, the database says %d", ch.row, m, got)
		}
		if got != ch.truth {
			t.Errorf("%q: the database says %d, the generator produced %d", ch.row, got, ch.truth)
		}
	}

	// The provider.
	pspURL := c.waitOutput(t, regexp.MustCompile(`provider\s+(http://127\.0\.0\.1:\d+)/_stats`), time.Second)
	st := pspStats(t, pspURL)
	if m := measured("provider charges created"); m != st.ChargesCreated || st.ChargesCreated != int64(exp.Unique-declined) {
		t.Errorf("summary provider charges %d, /_stats %d, generated %d", m, st.ChargesCreated, exp.Unique-declined)
	}
	if m := measured("orders charged twice (provider)"); m != st.OrdersChargedTwice || st.OrdersChargedTwice != 0 {
		t.Errorf("summary orders charged twice %d, /_stats %d", m, st.OrdersChargedTwice)
	}
	if st.Declines != int64(declined) {
		t.Errorf("provider declined %d, want %d", st.Declines, declined)
	}

	// The broker.
	brokerAddr := c.waitOutput(t, regexp.MustCompile(`broker\s+(127\.0\.0\.1:\d+)\s`), time.Second)
	client := kafkatest.Client(t, brokerAddr)
	var published int64
	for _, e := range kafkatest.EndOffsets(t, client, kafkatest.Topic) {
		published += e
	}
	if m := measured("events published"); m != published || published != count {
		t.Errorf("summary published %d, the broker holds %d, want %d", m, published, count)
	}
	parked := int64(len(kafkatest.ReadAll(t, client, kafkatest.DLQTopic)))
	if m := measured("sent to the dead-letter topic"); m != parked || parked != int64(exp.Invalid) {
		t.Errorf("summary dead-lettered %d, the DLQ holds %d, generated invalid %d", m, parked, exp.Invalid)
	}
	for p, o := range kafkatest.Committed(t, client, kafkatest.Group, kafkatest.Topic) {
		if end := kafkatest.EndOffsets(t, client, kafkatest.Topic)[p]; end > 0 && o != end {
			t.Errorf("partition %d committed %d of %d: the demo reported before the group caught up", p, o, end)
		}
	}

	// /metrics.
	metricsAddr := c.waitOutput(t, regexp.MustCompile(`metrics\s+http://(127\.0\.0\.1:\d+)/metrics`), time.Second)
	svc := &service{addr: metricsAddr}
	if m, got := measured("duplicates skipped"), svc.metric(t, `billing_events_total{outcome="duplicate"}`); float64(m) != got || m != int64(exp.Duplicates) {
		t.Errorf("summary duplicates %d, /metrics %v, generated %d", m, got, exp.Duplicates)
	}
	if !regexp.MustCompile(`throughput\s+\d+ events/s`).MatchString(out) || !regexp.MustCompile(`p50 [\d.]+m?s, p99 [\d.]+m?s: occurredAt`).MatchString(out) ||
		!regexp.MustCompile(`p99 in (\(|> )`).MatchString(out) {
		t.Errorf("no throughput or latency in the summary:\n%s", out)
	}
	if !strings.Contains(out, "produce --count") {
		t.Errorf("--keep does not say how to produce more events:\n%s", out)
	}

	if err := c.stop(t); err != nil {
		t.Fatalf("demo --keep exited with %v after Ctrl-C", err)
	}
}

func TestDemo_ExitsZeroAfterThePassingSummary(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	name := demoDatabase(t)
	var stdout syncBuffer
	err := run(t.Context(), []string{"billing", "demo", "--count", "100", "--partitions", "2", "--db-name", name,
		"--log", filepath.Join(t.TempDir(), "serve.log")}, map[string]string{"DATABASE_URL": dbtest.ServerURL(t)}, nil, &stdout, &stdout)
	if err != nil {
		t.Fatalf("demo exited with %v:\n%s", err, stdout.String())
	}
	out := stdout.String()
	if !strings.Contains(out, "\nPASS: ") || strings.Contains(out, "\r") {
		t.Errorf("want a PASS line and no terminal rewrites when stdout is not a terminal:\n%s", out)
	}
	for row, r := range summaryRows(t, out) {
		if r[0] != r[1] {
			t.Errorf("row %q: measured %d, expected %d", row, r[0], r[1])
		}
	}
	// The progress lines' lag is what is published and not finished: it
	// never contradicts finished (it once said "finished 3000/3000 lag
	// 3000"), and the last line shows everything finished and committed.
	progress := regexp.MustCompile(`(?m)^published (\d+)/\d+  finished (\d+)/\d+  lag (\d+)  committed (\d+)/\d+`).FindAllStringSubmatch(out, -1)
	if len(progress) == 0 {
		t.Fatalf("no progress line:\n%s", out)
	}
	for _, m := range progress {
		published, _ := strconv.Atoi(m[1])
		finished, _ := strconv.Atoi(m[2])
		lag, _ := strconv.Atoi(m[3])
		if lag != max(published-finished, 0) {
			t.Errorf("progress %q: lag %d disagrees with published %d and finished %d", m[0], lag, published, finished)
		}
	}
	if last := progress[len(progress)-1]; last[2] != "100" || last[3] != "0" || last[4] != "100" {
		t.Errorf("last progress line %q, want 100 finished, lag 0, 100 committed", last[0])
	}
}

// With --provider stripe or adyen the demo imports the customers' saved
// cards, the fake speaks that provider's API, payments decided later are
// settled by signed webhooks, and the summary still accounts for every
// event.
func TestDemo_CardProvidersAccountForEveryEvent(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	for provider, api := range map[string]string{"stripe": "Stripe's PaymentIntents API", "adyen": "Adyen's Checkout API"} {
		t.Run(provider, func(t *testing.T) {
			name := demoDatabase(t)
			var stdout syncBuffer
			err := run(t.Context(), []string{"billing", "demo", "--count", "300", "--partitions", "2", "--db-name", name, "--provider", provider,
				"--log", filepath.Join(t.TempDir(), "serve.log")}, map[string]string{"DATABASE_URL": dbtest.ServerURL(t)}, nil, &stdout, &stdout)
			if err != nil {
				t.Fatalf("demo exited with %v:\n%s", err, stdout.String())
			}
			out := stdout.String()
			rows := summaryRows(t, out)
			for row, r := range rows {
				if r[0] != r[1] {
					t.Errorf("row %q: measured %d, expected %d", row, r[0], r[1])
				}
			}
			if r := rows["charged once the provider said so"]; r[0] == 0 {
				t.Errorf("no charge was settled by a webhook; the mix has payments decided later:\n%s", out)
			}
			if !strings.Contains(out, api) || !strings.Contains(out, "\nPASS: ") {
				t.Errorf("want the provider line (%s) and a PASS:\n%s", api, out)
			}
		})
	}
}

// Where no PostgreSQL answers, the demo starts one of its own from the
// binaries this run finds (local ones, or the embedded PostgreSQL with
// PG_BIN an empty directory), says which, and removes it at exit.
func TestDemo_WithoutPostgreSQLStartsOneOfItsOwn(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	closed := freeAddr(t)
	var stdout syncBuffer
	err := run(t.Context(), []string{"billing", "demo", "--count", "100", "--partitions", "2", "--log", filepath.Join(t.TempDir(), "serve.log")},
		map[string]string{"DATABASE_URL": "postgres://postgres@" + closed + "/postgres?sslmode=disable",
			"PG_BIN": os.Getenv("PG_BIN"), "BILLING_CACHE_DIR": os.Getenv("BILLING_CACHE_DIR")}, nil, &stdout, &stdout)
	out := stdout.String()
	if err != nil {
		t.Fatalf("demo exited with %v:\n%s", err, out)
	}
	m := regexp.MustCompile(`(?m)^  postgres  (?:embedded )?PostgreSQL 1\d[.\d]* (?:from|in) \S+.*started on (127\.0\.0\.1:\d+) in [\d.]+s \(nothing answered at ` +
		regexp.QuoteMeta(closed) + `\)`).FindStringSubmatch(out)
	if m == nil || !strings.Contains(out, "\nPASS: ") {
		t.Fatalf("want a postgres line naming the PostgreSQL started and a PASS line:\n%s", out)
	}
	if !strings.Contains(out, "  database  postgres://postgres@"+m[1]+"/billing_demo") {
		t.Errorf("the demo's database is not on the server it started:\n%s", out)
	}
	if pgserver.Answers(t.Context(), "postgres://postgres@"+m[1]+"/postgres?sslmode=disable") {
		t.Errorf("the PostgreSQL the demo started on %s still answers after it exited", m[1])
	}
}

func TestDemo_WithoutPostgreSQLAndNoneToStartSaysHowToGetOne(t *testing.T) {
	// No server, no local binaries, and a cache that cannot be made.
	notADir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notADir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	err := run(t.Context(), []string{"billing", "demo", "--count", "10", "--log", filepath.Join(t.TempDir(), "serve.log")},
		map[string]string{"DATABASE_URL": "postgres://postgres@" + freeAddr(t) + "/postgres?sslmode=disable",
			"PG_BIN": t.TempDir(), "BILLING_CACHE_DIR": notADir}, nil, &stdout, &stdout)
	if err == nil {
		t.Fatal("demo succeeded without a database")
	}
	for _, want := range []string{"no PostgreSQL answers", "could not start one", "DATABASE_URL=", "PG_BIN=", "Maven Central"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

func TestDemo_SummaryFailsWhenANumberDiffers(t *testing.T) {
	exp := loadgen.Expected{Produced: 10, Unique: 8, Duplicates: 1, Invalid: 1,
		Events: make([]loadgen.Event, 8)}
	for i := range exp.Events {
		exp.Events[i].OrderID = int64(i + 1)
	}
	ok := demoSummary{produced: 10, dlq: 1, unique: 8, charged: 8, duplicates: 1, providerCharges: 8, elapsed: time.Second,
		outcomes: outcomeCounts{distinct: 8}}
	var out bytes.Buffer
	if n := ok.print(&out, demoExpected{Expected: exp}); n != 0 || !strings.Contains(out.String(), "PASS") {
		t.Fatalf("a matching summary: %d failures\n%s", n, out.String())
	}
	unannounced := ok
	unannounced.outcomes.distinct = 7
	out.Reset()
	if n := unannounced.print(&out, demoExpected{Expected: exp}); n != 1 || !strings.Contains(out.String(), "FAIL: outcome events published") {
		t.Errorf("a charge without its outcome event: %d failures\n%s", n, out.String())
	}
	twice := ok
	twice.chargedTwiceDB = 1
	out.Reset()
	if n := twice.print(&out, demoExpected{Expected: exp}); n != 1 || !strings.Contains(out.String(), "FAIL: orders charged twice (database)") {
		t.Errorf("an order charged twice: %d failures\n%s", n, out.String())
	}
}

func TestDemo_RejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--count", "0"},
		{"--partitions", "0"},
		{"--db-name", "postgres; DROP"},
		{"--duplicates", "0.8", "--invalid", "0.5"},
		{"--decline-every", "-1"},
	} {
		err := run(t.Context(), append([]string{"billing", "demo"}, args...), nil, nil, &syncBuffer{}, &syncBuffer{})
		if err == nil {
			t.Errorf("demo %v succeeded", args)
		}
	}
}
