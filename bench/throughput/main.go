// Command throughput is billing's end-to-end benchmark (`make bench`).
//
// For each scenario it pre-produces events (10% duplicates) into a topic
// with 6 partitions, starts the real `billing serve` binary as a process of
// its own against the local PostgreSQL and a fake provider with a given
// latency, and measures the time until the group's committed offsets reach
// the end offsets. It reports events/s, latency percentiles, the service's
// own CPU per 1,000 events and its peak RSS.
//
// Every scenario runs on each broker that -broker names, one after the
// other: the embedded kfake broker (in this process, a fresh one per
// scenario) and a real Apache Kafka cluster in KRaft mode (started once from
// the jars Maven resolves, -nodes 1 or 3, with fresh topics and a group per
// scenario), so that the two are compared side by side; on Apache Kafka the
// brokers' own CPU is measured too.
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
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/apachekafka"
	"example.com/billing/internal/config"
	"example.com/billing/internal/devkafka"
	"example.com/billing/internal/fakepsp"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/loadgen"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/postgres"
)

type scenario struct {
	name    string
	binary  string // the billing binary to run
	latency time.Duration
	events  int
	env     []string // extra environment of serve
	// rateLimit, when > 0, makes the fake provider answer 429 beyond that
	// many requests a second, as a provider's rate limit does.
	rateLimit int
}

// seedEnv configures billing as the seed's design: kafkajs eachMessage with
// partitionsConsumedConcurrently: 3 and commitOffsets after every message.
var seedEnv = []string{
	"CONSUMER_LANES=1", "CONSUMER_BATCH_MAX=1", "DATABASE_MAX_CONNS=3", "MAX_IN_FLIGHT=3",
	"KAFKA_COMMIT_EVERY_MESSAGE=true",
}

type result struct {
	scenario
	broker      string
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
	// The provider's view: requests, the most within any one second, and
	// 429s answered.
	requests, peakPerSecond, rateLimited int64
	// brokerCPU is Apache Kafka's own CPU per 1,000 events (all nodes); 0
	// on kfake, which runs inside the benchmark's process.
	brokerCPU time.Duration
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
		brokerFlag = flag.String("broker", "", "kfake, apache or both (default: both where Java and Maven are installed, else kfake)")
		nodes      = flag.Int("nodes", 1, "Apache Kafka nodes: 1, or 3 (replication factor 3, min.insync.replicas 2)")
		latencyArg = flag.String("latencies", "0,50,200,500,1000", "provider latencies to sweep, milliseconds, comma-separated")
		baseline   = flag.String("baseline", "", "an earlier billing binary to sweep beside -binary (label: -baseline-label)")
		baseLabel  = flag.String("baseline-label", "billing (baseline)", "the baseline's name in the tables")
		svgPath    = flag.String("svg", "", "write the sweep's events/s against latency as an SVG image to this file")
		rps        = flag.Bool("rps", true, "also run billing with PAYMENT_MAX_RPS=100 against a provider limited to 100 requests/s")
	)
	flag.Parse()

	kinds, err := chooseBrokers(*brokerFlag)
	if err != nil {
		return err
	}

	var billingEnv []string
	if *extra != "" {
		billingEnv = strings.Split(*extra, ",")
	}
	latencies, err := parseLatencies(*latencyArg)
	if err != nil {
		return err
	}
	// Event counts per design: billing takes the full count; the earlier
	// binary held a transaction per event across the provider call (about
	// 100 open at once, so ~100/latency events/s); the seed design handles
	// 3 events at a time.
	designs := []design{{label: "billing", binary: *binary, env: billingEnv, events: capped(*events, 1e9, 0)}}
	if *baseline != "" {
		designs = append(designs, design{label: *baseLabel, binary: *baseline, env: billingEnv, events: capped(*events, 100, 2000)})
	}
	designs = append(designs, design{label: "seed design", binary: *binary, env: seedEnv, events: capped(*seedEvents, 3, 100)})
	var scenarios []scenario
	for _, l := range latencies {
		for _, d := range designs {
			scenarios = append(scenarios, scenario{name: scenarioName(d.label, l), binary: d.binary, latency: l, events: d.events(l), env: d.env})
		}
	}
	if *rps {
		// Stripe's live-mode default: 100 requests/s. The backlog must
		// drain at about that rate without a storm of 429s.
		scenarios = append(scenarios, scenario{name: "billing, PAYMENT_MAX_RPS=100, provider 50 ms (limit 100/s)", binary: *binary,
			latency: 50 * time.Millisecond, events: 3000, env: append(slices.Clone(billingEnv), "PAYMENT_MAX_RPS=100"), rateLimit: 100})
	}

	fmt.Printf("machine: %d CPUs, %s; %s\n", numCPU(), memTotal(), goVersion())
	brokers := make([]*broker, 0, len(kinds))
	for _, kind := range kinds {
		b, err := startBroker(kind, *nodes)
		if err != nil {
			return err
		}
		defer b.close()
		brokers = append(brokers, b)
	}
	var results []result
	for _, sc := range scenarios {
		if *only != "" && !strings.Contains(sc.name, *only) {
			continue
		}
		for _, b := range brokers {
			fmt.Printf("--- %s on %s: %d events\n", sc.name, b.name, sc.events)
			r, err := runScenario(sc, b, *server, int32(*partitions))
			if err != nil {
				return fmt.Errorf("%s on %s: %w", sc.name, b.name, err)
			}
			fmt.Printf("    %.0f events/s in %s, CPU %s/1000 events, peak RSS %.1f MiB\n",
				r.eventsPerS, r.elapsed.Round(time.Millisecond), r.cpuPer1000.Round(time.Millisecond), float64(r.peakRSS)/(1<<20))
			results = append(results, r)
		}
	}
	var pgTPS float64
	if *pgbenchT > 0 {
		var err error
		if pgTPS, err = runPgbench(*server, *pgbenchT); err != nil {
			return fmt.Errorf("pgbench: %w", err)
		}
	}
	printTable(results, pgTPS)
	for _, b := range brokers {
		printSweep(designs, latencies, results, b.name)
	}
	if *svgPath != "" && len(brokers) > 0 {
		if err := writeSweepSVG(*svgPath, designs, latencies, results, brokers[0].name); err != nil {
			return fmt.Errorf("-svg: %w", err)
		}
		fmt.Printf("\nsweep drawn in %s (%s)\n", *svgPath, brokers[0].name)
	}
	return nil
}

// chooseBrokers reads -broker: unset, both brokers where Apache Kafka can
// run here, else kfake alone, said on stderr.
func chooseBrokers(flagValue string) ([]string, error) {
	switch flagValue {
	case "kfake", "apache":
		return []string{flagValue}, nil
	case "both":
		return []string{"kfake", "apache"}, nil
	case "":
	default:
		return nil, fmt.Errorf("-broker %q: want kfake, apache or both", flagValue)
	}
	if err := apachekafka.Available(); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v: the embedded kfake broker only (-broker apache to insist)\n", err)
		return []string{"kfake"}, nil
	}
	return []string{"kfake", "apache"}, nil
}

// broker is a Kafka the scenarios run on.
type broker struct {
	name    string // for the tables: kfake, or apache with its node count
	cluster *apachekafka.Cluster
	dir     string
	seq     int // scenarios run on it, for unique topic names
}

func startBroker(kind string, nodes int) (*broker, error) {
	if kind == "kfake" {
		return &broker{name: "kfake"}, nil
	}
	started := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	jars, err := apachekafka.PinnedJars(ctx)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "billing-bench-kafka-")
	if err != nil {
		return nil, err
	}
	c, err := apachekafka.Start(ctx, apachekafka.Options{Nodes: nodes, Dir: dir, Jars: jars})
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("apache kafka (-broker kfake runs without it): %w", err)
	}
	b := &broker{name: fmt.Sprintf("apache ×%d", nodes), cluster: c, dir: dir}
	fmt.Printf("Apache Kafka %d node(s), KRaft, on %s: started in %s\n", nodes, strings.Join(c.Addrs(), ","), time.Since(started).Round(100*time.Millisecond))
	// A JVM broker uses CPU while idle too (GC, the KRaft quorum's
	// heartbeats); over a slow scenario that is a good part of its CPU per
	// event, so say how much.
	time.Sleep(3 * time.Second)
	cpu0, err := b.cpu()
	if err != nil {
		b.close()
		return nil, err
	}
	const sample = 5 * time.Second
	time.Sleep(sample)
	cpu1, err := b.cpu()
	if err != nil {
		b.close()
		return nil, err
	}
	fmt.Printf("Apache Kafka idle: %d ms of CPU per second (all nodes)\n", ((cpu1 - cpu0) * time.Second / sample).Milliseconds())
	return b, nil
}

func (b *broker) close() {
	if b.cluster != nil {
		b.cluster.Close()
		os.RemoveAll(b.dir)
	}
}

// kafkaNames are one scenario's topic, dead-letter topic and group.
type kafkaNames struct{ topic, dlq, group string }

// prepare gives a scenario its topics on b: on kfake a fresh broker with
// the contract's names, on Apache Kafka fresh topics (deleted by the
// returned function) and a group on the running cluster.
func (b *broker) prepare(partitions int32) (addrs []string, n kafkaNames, cleanup func(), err error) {
	if b.cluster == nil {
		n = kafkaNames{topic: "orders.confirmed", dlq: "orders.confirmed.dlq", group: "billing-order-confirmed"}
		dev, err := devkafka.Start(devkafka.Options{Topics: []string{n.topic, n.dlq}, Partitions: partitions})
		if err != nil {
			return nil, n, nil, err
		}
		return []string{dev.Addr()}, n, dev.Close, nil
	}
	b.seq++
	suffix := fmt.Sprintf("bench.%d.%d", os.Getpid(), b.seq)
	n = kafkaNames{topic: "orders.confirmed." + suffix, dlq: "orders.confirmed.dlq." + suffix, group: "billing-order-confirmed." + suffix}
	addrs = b.cluster.Addrs()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_6_0_0
	admin, err := sarama.NewClusterAdmin(addrs, cfg)
	if err != nil {
		return nil, n, nil, err
	}
	rf := int16(min(3, len(addrs)))
	for _, t := range []string{n.topic, n.dlq} {
		detail := &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: rf}
		if err := admin.CreateTopic(t, detail, false); err != nil {
			admin.Close()
			return nil, n, nil, fmt.Errorf("create topic %s: %w", t, err)
		}
	}
	cleanup = func() {
		_ = admin.DeleteTopic(n.topic)
		_ = admin.DeleteTopic(n.dlq)
		admin.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := b.cluster.WaitHealthy(ctx, time.Minute); err != nil {
		cleanup()
		return nil, n, nil, err
	}
	return addrs, n, cleanup, nil
}

// cpu is the CPU time Apache Kafka's nodes have used so far, 0 on kfake.
func (b *broker) cpu() (time.Duration, error) {
	if b.cluster == nil {
		return 0, nil
	}
	var total time.Duration
	for _, n := range b.cluster.Nodes() {
		t, err := cpuTime(n.Pid())
		if err != nil {
			return 0, fmt.Errorf("node %d: %w", n.ID, err)
		}
		total += t
	}
	return total, nil
}

func runScenario(sc scenario, b *broker, server string, partitions int32) (result, error) {
	binary := sc.binary
	res := result{scenario: sc, broker: b.name}
	dsn, drop, err := freshDatabase(server, "billing_bench")
	if err != nil {
		return res, err
	}
	defer drop()

	addrs, names, cleanup, err := b.prepare(partitions)
	if err != nil {
		return res, err
	}
	defer cleanup()
	psp := fakepsp.New(fakepsp.Options{Latency: sc.latency, RateLimit: sc.rateLimit, Seed: 1})
	pspSrv := httptest.NewServer(psp)
	defer pspSrv.Close()

	env := append(os.Environ(),
		"KAFKA_BROKERS="+strings.Join(addrs, ","), "KAFKA_TOPIC="+names.topic, "KAFKA_DLQ_TOPIC="+names.dlq, "KAFKA_GROUP_ID="+names.group,
		"DATABASE_URL="+dsn, "PAYMENT_BASE_URL="+pspSrv.URL, "HTTP_ADDR="+freeAddr(), "LOG_LEVEL=warn")
	env = append(env, sc.env...)
	migrate := exec.Command(binary, "migrate")
	migrate.Env = env
	if out, err := migrate.CombinedOutput(); err != nil {
		return res, fmt.Errorf("migrate: %w\n%s", err, out)
	}

	// Pre-produce the backlog.
	kcfg := config.Kafka{Brokers: addrs, ClientID: "bench", Version: "3.6.0"}
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
	pub, err := loadgen.Publish(context.Background(), producer, gen, loadgen.PublishOptions{Topic: names.topic})
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
	end, err := kafka.EndOffsets(client, names.topic)
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
	broker0, err := b.cpu()
	if err != nil {
		return res, err
	}

	for {
		done, err := caughtUp(client, names, end)
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
	broker1, err := b.cpu()
	if err != nil {
		return res, err
	}
	res.brokerCPU = time.Duration(float64(broker1-broker0) / float64(res.produced) * 1000)
	res.eventsPerS = float64(res.produced) / res.elapsed.Seconds()
	res.cpuPer1000 = time.Duration(float64(cpu1-cpu0) / float64(res.produced) * 1000)
	if res.peakRSS, err = peakRSS(cmd.Process.Pid); err != nil {
		return res, err
	}
	families, err := scrape(addr)
	if err != nil {
		return res, err
	}
	res.p50 = families.Histograms["billing_event_latency_seconds"].Quantile(0.5)
	res.p99 = families.Histograms["billing_event_latency_seconds"].Quantile(0.99)
	res.proc50 = families.Histograms["billing_event_processing_seconds"].Quantile(0.5)
	res.proc99 = families.Histograms["billing_event_processing_seconds"].Quantile(0.99)
	res.txEvents = mean(families.Histograms["billing_transaction_events"])
	st := psp.Stats()
	res.doubleOrder = st.OrdersChargedTwice
	res.requests, res.peakPerSecond, res.rateLimited = st.Requests, st.PeakPerSecond, st.RateLimited
	if st.ChargesCreated != int64(gen.Expected().Unique) {
		return res, fmt.Errorf("provider created %d charges for %d unique events", st.ChargesCreated, gen.Expected().Unique)
	}
	return res, nil
}

// caughtUp reports whether the group committed every partition to end.
func caughtUp(client sarama.Client, n kafkaNames, end map[int32]int64) (bool, error) {
	committed, err := kafka.CommittedOffsets(client, n.group, n.topic)
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
	ctx := context.Background()
	dsn, err := postgres.Recreate(ctx, server, name)
	if err != nil {
		return "", nil, err
	}
	return dsn, func() { _ = postgres.Drop(ctx, server, name) }, nil
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

func scrape(addr string) (metrics.Snapshot, error) {
	return metrics.Scrape(context.Background(), "http://"+addr+"/metrics")
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
	fmt.Println("| scenario | broker | events | events/s | occurredAt→commit p50 / p99 | take→commit p50 / p99 | events per tx | CPU per 1,000 events | broker CPU per 1,000 events | peak RSS | orders charged twice | provider requests: most in 1 s, 429s |")
	fmt.Println("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, r := range results {
		brokerCPU := "in process"
		if r.brokerCPU > 0 {
			brokerCPU = fmt.Sprintf("%d ms", r.brokerCPU.Milliseconds())
		}
		fmt.Printf("| %s | %s | %d | %.0f | %s / %s | %s / %s | %.1f | %d ms | %s | %.1f MiB | %d | %d: %d, %d |\n",
			r.name, r.broker, r.produced, r.eventsPerS, secs(r.p50), secs(r.p99), secs(r.proc50), secs(r.proc99),
			r.txEvents, r.cpuPer1000.Milliseconds(), brokerCPU, float64(r.peakRSS)/(1<<20), r.doubleOrder,
			r.requests, r.peakPerSecond, r.rateLimited)
	}
	type key struct{ name, broker string }
	byKey := map[key]result{}
	var brokers []string
	for _, r := range results {
		byKey[key{r.name, r.broker}] = r
		if !slices.Contains(brokers, r.broker) {
			brokers = append(brokers, r.broker)
		}
	}
	fmt.Println()
	for _, b := range brokers {
		for _, lat := range []string{"0 ms", "50 ms"} {
			bill, okB := byKey[key{"billing, provider " + lat, b}]
			seed, okS := byKey[key{"seed design, provider " + lat, b}]
			if okB && okS {
				fmt.Printf("%s, provider %s: billing / seed design = %.1f×\n", b, lat, bill.eventsPerS/seed.eventsPerS)
			}
		}
		if bill, ok := byKey[key{"billing, provider 0 ms", b}]; ok && pgTPS > 0 {
			fmt.Printf("%s: billing at 0 ms reaches %.0f%% of pgbench (billing's per-event SQL, 16 clients: %.0f tx/s)\n", b, 100*bill.eventsPerS/pgTPS, pgTPS)
		}
	}
	if len(brokers) == 2 {
		// Side by side: what the second broker (Apache Kafka) costs or
		// gives compared with the first (the embedded one).
		a, z := brokers[0], brokers[1]
		fmt.Println()
		fmt.Printf("| scenario | events/s %s | events/s %s | %s / %s | take→commit p99 %s / %s | CPU per 1,000 events %s / %s | peak RSS %s / %s |\n", a, z, z, a, a, z, a, z, a, z)
		fmt.Println("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
		var names []string
		for _, r := range results {
			if !slices.Contains(names, r.name) {
				names = append(names, r.name)
			}
		}
		for _, name := range names {
			x, okX := byKey[key{name, a}]
			y, okY := byKey[key{name, z}]
			if !okX || !okY {
				continue
			}
			fmt.Printf("| %s | %.0f | %.0f | %.2f | %s / %s | %d / %d ms | %.1f / %.1f MiB |\n", name, x.eventsPerS, y.eventsPerS, y.eventsPerS/x.eventsPerS,
				secs(x.proc99), secs(y.proc99), x.cpuPer1000.Milliseconds(), y.cpuPer1000.Milliseconds(), float64(x.peakRSS)/(1<<20), float64(y.peakRSS)/(1<<20))
		}
	}
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

// mean is a histogram's sum divided by its count: NaN when empty.
func mean(h metrics.Histogram) float64 { return h.Sum / h.Count }

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
