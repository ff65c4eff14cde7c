// Command throughput is billing's end-to-end benchmark (`make bench`).
//
// For each scenario it pre-produces events (10% duplicates) into a topic
// with 6 partitions, starts the real `billing serve` binary as a process of
// its own against PostgreSQL and a fake provider with a given
// latency, and measures the time until the group's committed offsets reach
// the end offsets. It reports events/s, latency percentiles, the service's
// own CPU per event, its peak RSS, the provider requests in flight (the
// most at once and the mean) and what else says what bounds a scenario
// (the cores the service kept busy, the machine's CPU, the wait for a
// database connection), and checks that the provider made exactly one
// charge per unique event. With -profile it saves heap profiles of serve.
//
// PostgreSQL is a cluster of the benchmark's own (pgcluster.go), so that
// the WAL and the server's CPU between two samples are the scenario's:
// each scenario also reports what it cost the database per event (WAL
// bytes and records, full-page images, write transactions, PostgreSQL's
// CPU), and at 0 ms where the WAL went, by record type and by relation
// (dbcost.go). -replicas runs several serve processes in one group on one
// database; -provider runs the fake provider in this process, as a process
// of its own or as a Node.js stub; the provider's requests in flight are
// sampled, to say where a provider-bound run's time goes (phases.go).
//
// Every scenario runs on each broker that -broker names, one after the
// other: the embedded kfake broker (in this process, a fresh one per
// scenario) and a real Apache Kafka cluster in KRaft mode (started once from
// the jars Maven resolves, -nodes 1 or 3, with fresh topics and a group per
// scenario), so that the two are compared side by side; on Apache Kafka the
// brokers' own CPU is measured too.
//
// The sweep runs each provider latency (-latencies) with billing, an
// earlier billing (-baseline: a binary, or a commit of this repository,
// built once) and the seed design: billing itself configured as the seed
// (seedEnv: one message at a time per partition, at most 3 partitions at
// once; and an offset commit per message, a build with -tags seeddesign).
// A binary is given only the
// variables it reads, so an earlier binary runs with its own defaults.
// pgbench runs billing's per-event SQL too, as the database's own ceiling
// for one transaction per event, and the seed's own SQL (its schema), for
// the WAL an event costs there.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/redact"
)

type scenario struct {
	name    string
	binary  string // the billing binary to run
	latency time.Duration
	events  int
	env     []string // extra environment of serve
	// valueBytes, when > 0, makes the scenario a backlog of large values
	// (valid JSON, not events: parked) instead of loadgen's mix.
	valueBytes int
	// compression is the codec the backlog's values are produced with.
	compression sarama.CompressionCodec
	// rateLimit, when > 0, makes the fake provider answer 429 beyond that
	// many requests a second, as a provider's rate limit does.
	rateLimit int
	// replicas is how many serve processes share the consumer group (0
	// and 1: one).
	replicas int
	// live: the replicas start first and the events are produced once
	// they all hold a group session, instead of a backlog produced before
	// serve starts; the window then measures the group at work, not its
	// members joining one by one while the first drains the backlog.
	live bool
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
	cpuPerEvent time.Duration // the service's own CPU
	peakRSS     int64         // bytes, VmHWM
	peakAnon    int64         // bytes, the highest RssAnon sampled: without the binary's own pages
	txEvents    float64
	doubleOrder int64
	// The provider's view: requests, the most within any one second, and
	// 429s answered; the most requests answered at once and the mean
	// number in flight over the measurement, against the service's
	// PAYMENT_MAX_CONCURRENCY.
	requests, peakPerSecond, rateLimited int64
	maxInFlight                          int64
	meanInFlight                         float64
	maxConcurrency                       int
	// brokerCPU is Apache Kafka's own CPU per event (all nodes); 0 on
	// kfake, which runs inside the benchmark's process.
	brokerCPU time.Duration
	// What bounds a scenario: the cores the service kept busy, the share
	// of the machine's CPU that was busy (everyone's), and the time events
	// waited for a database connection, per event (NaN when the binary
	// does not export it).
	serviceCores, machineBusy, poolWait float64
	// benchCores are the cores this process kept busy over the window:
	// the fake provider in process, kfake, the producer of a live run,
	// the sampling.
	benchCores float64
	// pgCores are the cores PostgreSQL kept busy over the same window
	// (the database window is longer: db.cpu is per event over that).
	pgCores      float64
	load0, load1 string    // 1-minute load average at the start and the end
	memAtPeak    memSample // near the highest resident set
	complaints   string    // serve's warnings and errors, summarised
	// With replicas: the time from the first replica's readiness to the
	// last's, and the cores each kept busy.
	allReady     time.Duration
	replicaCores []float64
	// produceTime, live: how long producing the events took, within the
	// window.
	produceTime time.Duration
	// The provider's requests over the run (received, in flight), sampled,
	// and the ramp, steady state and tail read from them.
	samples []sample
	phases  phases
	// db is what the scenario cost PostgreSQL.
	db dbCost
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
		outcomeN   = flag.Int("outcome-partitions", 0, "partitions of the outcome topic (payments.settled); 0: as many as the topic")
		binary     = flag.String("binary", "bin/billing", "the billing binary to run (make build)")
		devBinary  = flag.String("fakepsp", "bin/dev/billing", "with -provider process: the developer build of billing, whose fakepsp serves as the provider (make dev)")
		server     = flag.String("db", "", "PostgreSQL server (maintenance database URL) instead of the benchmark's own cluster (initdb'd in a temporary directory); no database cost is measured there, as its WAL and CPU are everyone's")
		only       = flag.String("only", "", "run only scenarios whose name contains this")
		extra      = flag.String("env", "", "extra serve environment for the billing scenarios, comma-separated K=V")
		pgbenchT   = flag.Duration("pgbench", 15*time.Second, "pgbench duration (0 skips it)")
		brokerFlag = flag.String("broker", "", "kfake, apache or both (default: both where Java and Maven are installed, else kfake)")
		nodes      = flag.Int("nodes", 1, "Apache Kafka nodes: 1, or 3 (replication factor 3, min.insync.replicas 2)")
		latencyArg = flag.String("latencies", "0,50,200,500,1000,2000", "provider latencies to sweep, milliseconds, comma-separated")
		baseline   = flag.String("baseline", "", "an earlier billing to sweep beside -binary: a binary, or a commit of this repository, built once into ~/.cache/billing/bench-binaries/<commit>/billing (make bench: 3f706e0)")
		baseLabel  = flag.String("baseline-label", "", "the baseline's name in the tables (default: billing <commit>)")
		svgPath    = flag.String("svg", "", "write the sweep's events/s against latency as an SVG image to this file")
		backlog    = flag.Int("backlog", 0, "instead of the sweep: a backlog of this many large values with distinct keys (-value-bytes each), for peak RSS")
		valueBytes = flag.Int("value-bytes", 900_000, "size of each -backlog value")
		codec      = flag.String("compression", "zstd", "codec of the -backlog values: none, gzip, snappy, lz4 or zstd")
		http2      = flag.Bool("provider-http2", false, "the provider speaks HTTP/2 over TLS (as the large payment providers' APIs do) instead of HTTP/1.1 in the clear")
		rps        = flag.Bool("rps", true, "also run billing with PAYMENT_MAX_RPS=100 against a provider limited to 100 requests/s")
		profileDir = flag.String("profile", "", "save heap profiles of serve (inuse_space and alloc_space) in this directory: at the peak resident set (with a goroutine profile and the memory then), every -profile-every and at the end; perturbs what it measures a little: for finding where memory goes, not for the tables (finer samples: -env GODEBUG=memprofilerate=16384)")
		profEvery  = flag.Duration("profile-every", 5*time.Second, "with -profile: how often to save a heap profile besides the peak's (0: only the peak's and the end's)")
		pspKind    = flag.String("provider", providerInProcess, "how the fake provider runs: inprocess (fakepsp in this process), process (billing fakepsp, a process of its own) or node (a Node.js stub, node-psp.mjs)")
		timeline   = flag.String("timeline", "", "write each scenario's provider requests over time (seconds since the window started, received, in flight; every 50 ms) as CSV files in this directory")
		replicaArg = flag.String("replicas", "1", "serve processes in one consumer group, comma-separated counts: billing's scenarios run with each (events × replicas); the seed design and the baseline with one")
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
	replicaCounts, err := parseCounts(*replicaArg)
	if err != nil {
		return fmt.Errorf("-replicas: %w", err)
	}
	// A scale-out comparison runs billing live (see scenario.live), one
	// replica too, so that its rows compare like with like.
	scaleOut := len(replicaCounts) > 1 || replicaCounts[0] > 1
	// Event counts per design: billing takes the full count; the earlier
	// binary held a transaction per event across the provider call (about
	// 100 open at once, so ~100/latency events/s); the seed design handles
	// 3 events at a time.
	designs := []design{{label: "billing", binary: *binary, env: billingEnv, events: capped(*events, 1e9, 0)}}
	if *baseline != "" {
		path, label, err := baselineBinary(*baseline)
		if err != nil {
			return err
		}
		if *baseLabel != "" {
			label = *baseLabel
		}
		designs = append(designs, design{label: label, binary: path, env: billingEnv, events: capped(*events, 100, 2000)})
	}
	seedBinary, seedDir, err := seedDesignBinary()
	if err != nil {
		return err
	}
	defer os.RemoveAll(seedDir)
	designs = append(designs, design{label: "seed design", binary: seedBinary, env: seedEnv, events: capped(*seedEvents, 3, 100)})
	var scenarios []scenario
	var compression sarama.CompressionCodec
	if err := compression.UnmarshalText([]byte(*codec)); err != nil {
		return fmt.Errorf("-compression: %w", err)
	}
	if *backlog > 0 {
		// Peak RSS of a backlog of large messages: billing, and the
		// baseline when given, each with its defaults.
		for _, d := range designs[:len(designs)-1] {
			scenarios = append(scenarios, scenario{name: fmt.Sprintf("%s, backlog %d × %d bytes (%s)", d.label, *backlog, *valueBytes, compression),
				binary: d.binary, events: *backlog, valueBytes: *valueBytes, compression: compression, env: d.env})
		}
		latencies, *rps = nil, false
	}
	for _, l := range latencies {
		for i, d := range designs {
			counts := replicaCounts
			if i > 0 {
				counts = []int{1} // the baseline and the seed design: one process
			}
			for _, n := range counts {
				name := scenarioName(d.label, l)
				if n > 1 {
					name = scenarioName(fmt.Sprintf("%s ×%d", d.label, n), l)
				}
				scenarios = append(scenarios, scenario{name: name, binary: d.binary, latency: l, events: d.events(l) * n, env: d.env, replicas: n,
					live: i == 0 && scaleOut})
			}
		}
	}
	if *rps {
		// Stripe's live-mode default: 100 requests/s. The backlog must
		// drain at about that rate without a storm of 429s.
		scenarios = append(scenarios, scenario{name: "billing, PAYMENT_MAX_RPS=100, provider 50 ms (limit 100/s)", binary: *binary,
			latency: 50 * time.Millisecond, events: 3000, env: append(slices.Clone(billingEnv), "PAYMENT_MAX_RPS=100"), rateLimit: 100})
	}

	if *profileDir != "" {
		if err := os.MkdirAll(*profileDir, 0o755); err != nil {
			return fmt.Errorf("-profile: %w", err)
		}
	}
	if *outcomeN <= 0 {
		*outcomeN = *partitions
	}
	opts := runOptions{server: *server, partitions: int32(*partitions), outcomePartitions: int32(*outcomeN), profileDir: *profileDir, profileEvery: *profEvery,
		providerHTTP2: *http2, provider: *pspKind, fakepspBinary: *devBinary}
	if *pspKind != providerInProcess && *http2 {
		return errors.New("-provider-http2 needs -provider inprocess")
	}

	fmt.Printf("machine: %d CPUs, %s; %s; load average %s\n", numCPU(), memTotal(), goVersion(), loadAverage())
	if opts.server == "" {
		pg, err := startPGCluster(context.Background())
		if err != nil {
			return fmt.Errorf("the benchmark's PostgreSQL cluster: %w", err)
		}
		defer pg.Close()
		opts.pg, opts.server = pg, pg.URL("postgres")
		fmt.Printf("PostgreSQL %s: the benchmark's own cluster on 127.0.0.1:%d (%s), %s\n", pg.Binaries.Version, pg.Port, pg.Dir(), strings.Join(pgSettings, " "))
	} else {
		fmt.Printf("PostgreSQL: %s, shared: no database cost measured\n", redact.DSN(opts.server))
	}
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
			r, err := runScenario(sc, b, opts)
			if err != nil {
				return fmt.Errorf("%s on %s: %w", sc.name, b.name, err)
			}
			fmt.Printf("    %.0f events/s in %s, CPU %.3f ms/event (%.2f cores; PostgreSQL %.2f; the benchmark's process %.2f; machine %.0f%% busy, load %s→%s), peak RSS %.1f MiB (anonymous %.1f), provider requests in flight: most %d, mean %.0f\n",
				r.eventsPerS, r.elapsed.Round(time.Millisecond), ms(r.cpuPerEvent), r.serviceCores, r.pgCores, r.benchCores, 100*r.machineBusy, r.load0, r.load1,
				float64(r.peakRSS)/(1<<20), float64(r.peakAnon)/(1<<20), r.maxInFlight, r.meanInFlight)
			fmt.Print(indent(describe(r.memAtPeak), "    "))
			if r.live {
				fmt.Printf("    live: %d replica(s) held the group steadily before the events were produced (in %s, within the window); cores each: %s\n",
					len(r.replicaCores), r.produceTime.Round(time.Millisecond), formatCores(r.replicaCores))
			} else if len(r.replicaCores) > 1 {
				fmt.Printf("    %d replicas, all ready %s after the first; cores each: %s\n", len(r.replicaCores), r.allReady.Round(time.Millisecond), formatCores(r.replicaCores))
			}
			if r.db.measured {
				fmt.Printf("    database: %s\n", describeDB(r))
			}
			if r.latency > 0 {
				fmt.Printf("    provider: %s\n", describePhases(r))
			}
			if *timeline != "" {
				path, err := writeTimeline(*timeline, slug(sc.name+" "+b.name), r.samples)
				if err != nil {
					return fmt.Errorf("-timeline: %w", err)
				}
				fmt.Printf("    timeline: %s\n", path)
			}
			if r.complaints != "" {
				fmt.Printf("    serve logged %s\n", r.complaints)
			}
			results = append(results, r)
		}
	}
	var pgTPS float64
	var sqlResults []result
	if *pgbenchT > 0 {
		var err error
		if sqlResults, err = runPgbench(opts.server, opts.pg, *pgbenchT); err != nil {
			return fmt.Errorf("pgbench: %w", err)
		}
		pgTPS = sqlResults[0].eventsPerS
	}
	printTable(results, pgTPS)
	printDBCost(append(slices.Clip(results), sqlResults...))
	printScaleOut(results)
	for _, b := range brokers {
		if len(latencies) > 0 {
			printSweep(designs, latencies, results, b.name)
		}
	}
	if *svgPath != "" && len(brokers) > 0 {
		if err := writeSweepSVG(*svgPath, designs, latencies, results, brokers[0].name); err != nil {
			return fmt.Errorf("-svg: %w", err)
		}
		fmt.Printf("\nsweep drawn in %s (%s)\n", *svgPath, brokers[0].name)
	}
	return nil
}

// ms is d in milliseconds, fractions kept.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// indent prefixes every line of s.
func indent(s, prefix string) string {
	lines := strings.SplitAfter(strings.TrimSuffix(s, "\n"), "\n")
	return prefix + strings.Join(lines, prefix) + "\n"
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

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
