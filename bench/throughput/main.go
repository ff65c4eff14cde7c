// Command throughput is billing's end-to-end benchmark (`make bench`).
//
// For each scenario it pre-produces events (10% duplicates) into an embedded
// broker with 6 partitions, starts the real `billing serve` binary as a
// process of its own against the local PostgreSQL and a fake provider with a
// given latency, and measures the time until the group's committed offsets
// reach the end offsets. It reports events/s, latency percentiles, the
// service's own CPU per 1,000 events and its peak RSS.
//
// The baseline is billing itself configured as the seed design: one message
// at a time per partition, at most 3 partitions at once, an offset commit per
// message. Both run in the same invocation on the same machine, so their
// ratio is measured side by side. pgbench runs billing's per-event SQL too,
// as the database's own ceiling for one transaction per event.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"example.com/billing/internal/config"
	"example.com/billing/internal/devkafka"
	"example.com/billing/internal/fakepsp"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/loadgen"
	"example.com/billing/internal/postgres"
)

const (
	topic    = "orders.confirmed"
	dlqTopic = "orders.confirmed.dlq"
	group    = "billing-order-confirmed"
)

type scenario struct {
	name    string
	latency time.Duration
	events  int
	env     []string // extra environment of serve
}

// seedEnv configures billing as the seed's design: kafkajs eachMessage with
// partitionsConsumedConcurrently: 3 and commitOffsets after every message.
var seedEnv = []string{
	"CONSUMER_LANES=1", "CONSUMER_BATCH_MAX=1", "DATABASE_MAX_CONNS=3", "MAX_IN_FLIGHT=3",
	"KAFKA_COMMIT_EVERY_MESSAGE=true",
}

type result struct {
	scenario
	produced    int
	elapsed     time.Duration
	eventsPerS  float64
	p50, p99    float64 // occurredAt → commit, seconds
	proc50      float64 // take → commit, seconds
	proc99      float64
	cpuPer1000  time.Duration
	peakRSS     int64 // bytes
	txEvents    float64
	doubleOrder int64
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		events     = flag.Int("events", 30000, "events per billing scenario")
		seedEvents = flag.Int("seed-events", 4000, "events per seed-baseline scenario at 0 ms (fewer at 50 ms: it is slow)")
		partitions = flag.Int("partitions", 6, "partitions of the topic")
		binary     = flag.String("binary", "bin/billing", "the billing binary to run")
		server     = flag.String("db", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "PostgreSQL server (maintenance database URL)")
		only       = flag.String("only", "", "run only scenarios whose name contains this")
		extra      = flag.String("env", "", "extra serve environment for the billing scenarios, comma-separated K=V")
		pgbenchT   = flag.Duration("pgbench", 15*time.Second, "pgbench duration (0 skips it)")
	)
	flag.Parse()

	var billingEnv []string
	if *extra != "" {
		billingEnv = strings.Split(*extra, ",")
	}
	scenarios := []scenario{
		{name: "billing, provider 0 ms", latency: 0, events: *events, env: billingEnv},
		{name: "seed design, provider 0 ms", latency: 0, events: *seedEvents, env: seedEnv},
		{name: "billing, provider 50 ms", latency: 50 * time.Millisecond, events: *events, env: billingEnv},
		{name: "seed design, provider 50 ms", latency: 50 * time.Millisecond, events: max(*seedEvents/4, 500), env: seedEnv},
	}

	fmt.Printf("machine: %d CPUs, %s; %s\n", numCPU(), memTotal(), goVersion())
	var results []result
	for _, sc := range scenarios {
		if *only != "" && !strings.Contains(sc.name, *only) {
			continue
		}
		fmt.Printf("--- %s: %d events\n", sc.name, sc.events)
		r, err := runScenario(sc, *binary, *server, int32(*partitions))
		if err != nil {
			return fmt.Errorf("%s: %w", sc.name, err)
		}
		fmt.Printf("    %.0f events/s in %s, CPU %s/1000 events, peak RSS %.1f MiB\n",
			r.eventsPerS, r.elapsed.Round(time.Millisecond), r.cpuPer1000.Round(time.Millisecond), float64(r.peakRSS)/(1<<20))
		results = append(results, r)
	}
	var pgTPS float64
	if *pgbenchT > 0 {
		var err error
		if pgTPS, err = runPgbench(*server, *pgbenchT); err != nil {
			return fmt.Errorf("pgbench: %w", err)
		}
	}
	printTable(results, pgTPS)
	return nil
}

func runScenario(sc scenario, binary, server string, partitions int32) (result, error) {
	res := result{scenario: sc}
	dsn, drop, err := freshDatabase(server, "billing_bench")
	if err != nil {
		return res, err
	}
	defer drop()

	broker, err := devkafka.Start(devkafka.Options{Topics: []string{topic, dlqTopic}, Partitions: partitions})
	if err != nil {
		return res, err
	}
	defer broker.Close()
	psp := fakepsp.New(fakepsp.Options{Latency: sc.latency, Seed: 1})
	pspSrv := httptest.NewServer(psp)
	defer pspSrv.Close()

	env := append(os.Environ(),
		"KAFKA_BROKERS="+broker.Addr(), "DATABASE_URL="+dsn, "PAYMENT_BASE_URL="+pspSrv.URL,
		"HTTP_ADDR="+freeAddr(), "LOG_LEVEL=warn")
	env = append(env, sc.env...)
	migrate := exec.Command(binary, "migrate")
	migrate.Env = env
	if out, err := migrate.CombinedOutput(); err != nil {
		return res, fmt.Errorf("migrate: %w\n%s", err, out)
	}

	// Pre-produce the backlog.
	kcfg := config.Kafka{Brokers: []string{broker.Addr()}, ClientID: "bench", Version: "3.6.0"}
	pcfg, err := kafka.ProducerConfig(kcfg)
	if err != nil {
		return res, err
	}
	producer, err := sarama.NewAsyncProducer(kcfg.Brokers, pcfg)
	if err != nil {
		return res, err
	}
	gen, err := loadgen.New(loadgen.Options{Count: sc.events, Duplicates: 0.1, Seed: 1})
	if err != nil {
		return res, err
	}
	pub, err := loadgen.Publish(context.Background(), producer, gen, loadgen.PublishOptions{Topic: topic})
	producer.Close()
	if err != nil {
		return res, err
	}
	res.produced = pub.Produced
	client, err := sarama.NewClient(kcfg.Brokers, sarama.NewConfig())
	if err != nil {
		return res, err
	}
	defer client.Close()
	end, err := kafka.EndOffsets(client, topic)
	if err != nil {
		return res, err
	}

	// Start the service and wait until it holds a group session.
	var addr string
	for _, kv := range env {
		if a, ok := strings.CutPrefix(kv, "HTTP_ADDR="); ok {
			addr = a
		}
	}
	cmd := exec.Command(binary, "serve")
	cmd.Env = env
	logs, err := os.CreateTemp("", "billing-bench-*.log")
	if err != nil {
		return res, err
	}
	defer os.Remove(logs.Name())
	cmd.Stderr, cmd.Stdout = logs, logs
	if err := cmd.Start(); err != nil {
		return res, err
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	if err := waitReady(addr, 30*time.Second); err != nil {
		return res, fmt.Errorf("%w (logs in %s)", err, logs.Name())
	}
	start := time.Now()
	cpu0, err := cpuTime(cmd.Process.Pid)
	if err != nil {
		return res, err
	}

	for {
		done, err := caughtUp(client, end)
		if err != nil {
			return res, err
		}
		if done {
			break
		}
		if time.Since(start) > 15*time.Minute {
			return res, errors.New("did not catch up within 15 minutes")
		}
		time.Sleep(50 * time.Millisecond)
	}
	res.elapsed = time.Since(start)
	cpu1, err := cpuTime(cmd.Process.Pid)
	if err != nil {
		return res, err
	}
	res.eventsPerS = float64(res.produced) / res.elapsed.Seconds()
	res.cpuPer1000 = time.Duration(float64(cpu1-cpu0) / float64(res.produced) * 1000)
	if res.peakRSS, err = peakRSS(cmd.Process.Pid); err != nil {
		return res, err
	}
	families, err := scrape(addr)
	if err != nil {
		return res, err
	}
	res.p50 = quantile(families["billing_event_latency_seconds"], 0.5)
	res.p99 = quantile(families["billing_event_latency_seconds"], 0.99)
	res.proc50 = quantile(families["billing_event_processing_seconds"], 0.5)
	res.proc99 = quantile(families["billing_event_processing_seconds"], 0.99)
	res.txEvents = mean(families["billing_transaction_events"])
	res.doubleOrder = psp.Stats().OrdersChargedTwice
	if st := psp.Stats(); st.ChargesCreated != int64(gen.Expected().Unique) {
		return res, fmt.Errorf("provider created %d charges for %d unique events", st.ChargesCreated, gen.Expected().Unique)
	}
	return res, nil
}

// caughtUp reports whether the group committed every partition to end.
func caughtUp(client sarama.Client, end map[int32]int64) (bool, error) {
	committed, err := kafka.CommittedOffsets(client, group, topic)
	if err != nil {
		return false, err
	}
	for p, e := range end {
		if committed[p] != e {
			return false, nil
		}
	}
	return true, nil
}

// freshDatabase creates database name on server (dropping a leftover of an
// earlier run) and returns its URL and a function that drops it.
func freshDatabase(server, name string) (string, func(), error) {
	admin, err := postgres.Open(server, 1)
	if err != nil {
		return "", nil, err
	}
	if _, err := admin.Exec(`DROP DATABASE IF EXISTS ` + name + ` WITH (FORCE)`); err != nil {
		admin.Close()
		return "", nil, err
	}
	if _, err := admin.Exec(`CREATE DATABASE ` + name); err != nil {
		admin.Close()
		return "", nil, err
	}
	u, err := url.Parse(server)
	if err != nil {
		admin.Close()
		return "", nil, err
	}
	u.Path = "/" + name
	return u.String(), func() {
		_, _ = admin.Exec(`DROP DATABASE IF EXISTS ` + name + ` WITH (FORCE)`)
		admin.Close()
	}, nil
}

func waitReady(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if resp, err := http.Get("http://" + addr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("serve not ready")
}

func scrape(addr string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(resp.Body)
}

// cpuTime is the user+system CPU time of process pid so far.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which may contain spaces.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticks, nil
}

// peakRSS is the process's high-water resident set size.
func peakRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmHWM")
}

// pgbenchScript is billing's SQL for one event, as its two transactions:
// the claim (the dedup insert, the order lock, the read of the order's
// attempts, the pending attempt) and the settle (the update and its read
// back). The event id is a UUID v7 made from the clock, as billing's are.
// One script run is one event, so pgbench's tps are events/s.
const pgbenchScript = `\set order random(1, 1000000000000)
SELECT (lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') || '7' || substr(md5(random()::text), 1, 3) || '8' || substr(md5(random()::text), 1, 15))::uuid AS id \gset
BEGIN;
INSERT INTO processed_event (event_id, consumer_group, fingerprint, claimed_with)
  VALUES (':id', 'pgbench', sha256(':id'::bytea), 2) ON CONFLICT DO NOTHING RETURNING event_id;
SELECT count(pg_advisory_xact_lock(1651076204, hashint8(:order)));
SELECT event_id, status FROM charge WHERE order_id = :order;
INSERT INTO charge (event_id, order_id, customer_id, amount_minor, currency, status)
  VALUES (':id', :order, 1, 1999, 'EUR', 'pending');
COMMIT;
BEGIN;
UPDATE charge SET status = 'succeeded', provider_charge_id = 'ch_pgbench', settled_at = now(), updated_at = now(),
  requests = requests + 1, counted_by = 'pgbench'
  WHERE event_id = ':id' AND status = 'pending' RETURNING event_id;
SELECT status FROM charge WHERE event_id = ':id';
COMMIT;
`

// runPgbench runs billing's per-event SQL with 16 clients on a fresh
// migrated database and returns its transactions per second.
func runPgbench(server string, d time.Duration) (float64, error) {
	fmt.Printf("--- pgbench: billing's per-event transaction, 16 clients, %s\n", d)
	dsn, drop, err := freshDatabase(server, "billing_bench_pgbench")
	if err != nil {
		return 0, err
	}
	defer drop()
	db, err := postgres.Open(dsn, 2)
	if err != nil {
		return 0, err
	}
	err = postgres.Migrate(context.Background(), db.DB, discardLogger())
	db.Close()
	if err != nil {
		return 0, err
	}
	dir, err := os.MkdirTemp("", "pgbench")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	script := filepath.Join(dir, "billing.sql")
	if err := os.WriteFile(script, []byte(pgbenchScript), 0o600); err != nil {
		return 0, err
	}
	bin := "pgbench"
	if _, err := exec.LookPath(bin); err != nil {
		bin = "/usr/lib/postgresql/15/bin/pgbench"
	}
	out, err := exec.Command(bin, "-n", "-M", "prepared", "-c", "16", "-j", "2",
		"-T", strconv.Itoa(int(d.Seconds())), "-f", script, dsn).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("%w\n%s", err, out)
	}
	m := regexp.MustCompile(`tps = ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("no tps in pgbench output:\n%s", out)
	}
	tps, _ := strconv.ParseFloat(string(m[1]), 64)
	fmt.Printf("    %.0f transactions/s\n", tps)
	return tps, nil
}

func printTable(results []result, pgTPS float64) {
	fmt.Println()
	fmt.Println("| scenario | events | events/s | occurredAt→commit p50 / p99 | take→commit p50 / p99 | events per tx | CPU per 1,000 events | peak RSS | orders charged twice |")
	fmt.Println("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, r := range results {
		fmt.Printf("| %s | %d | %.0f | %s / %s | %s / %s | %.1f | %d ms | %.1f MiB | %d |\n",
			r.name, r.produced, r.eventsPerS, secs(r.p50), secs(r.p99), secs(r.proc50), secs(r.proc99),
			r.txEvents, r.cpuPer1000.Milliseconds(), float64(r.peakRSS)/(1<<20), r.doubleOrder)
	}
	byName := map[string]result{}
	for _, r := range results {
		byName[r.name] = r
	}
	for _, lat := range []string{"0 ms", "50 ms"} {
		b, okB := byName["billing, provider "+lat]
		s, okS := byName["seed design, provider "+lat]
		if okB && okS {
			fmt.Printf("\nprovider %s: billing / seed design = %.1f×", lat, b.eventsPerS/s.eventsPerS)
		}
	}
	if b, ok := byName["billing, provider 0 ms"]; ok && pgTPS > 0 {
		fmt.Printf("\npgbench, billing's per-event SQL (16 clients): %.0f tx/s; billing at 0 ms reaches %.0f%% of it", pgTPS, 100*b.eventsPerS/pgTPS)
	}
	fmt.Println()
}

func secs(s float64) string {
	switch {
	case math.IsNaN(s):
		return "–"
	case s < 1:
		return fmt.Sprintf("%.0f ms", s*1000)
	default:
		return fmt.Sprintf("%.2f s", s)
	}
}

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func numCPU() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(b), "processor\t:")
}

func memTotal() string {
	b, _ := os.ReadFile("/proc/meminfo")
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.Join(strings.Fields(line)[1:], " ") + " RAM"
}

func goVersion() string {
	out, err := exec.Command("go", "version").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// quantile estimates the q-quantile of a histogram family's first series by
// linear interpolation inside its buckets, as Prometheus's
// histogram_quantile does.
func quantile(f *dto.MetricFamily, q float64) float64 {
	if f == nil || len(f.GetMetric()) == 0 {
		return math.NaN()
	}
	h := f.GetMetric()[0].GetHistogram()
	total := float64(h.GetSampleCount())
	if total == 0 {
		return math.NaN()
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for _, b := range h.GetBucket() {
		upper, count := b.GetUpperBound(), float64(b.GetCumulativeCount())
		if count >= rank {
			if math.IsInf(upper, 1) {
				return lower
			}
			return lower + (upper-lower)*(rank-below)/(count-below)
		}
		lower, below = upper, count
	}
	return lower
}

// mean is a histogram's sum divided by its count.
func mean(f *dto.MetricFamily) float64 {
	if f == nil || len(f.GetMetric()) == 0 {
		return math.NaN()
	}
	h := f.GetMetric()[0].GetHistogram()
	return h.GetSampleSum() / float64(h.GetSampleCount())
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
