package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/config"
	"example.com/billing/internal/dev/loadgen"
	"example.com/billing/internal/dev/pgserver"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/postgres"
)

// runOptions are what every scenario of a run shares.
type runOptions struct {
	server     string // PostgreSQL maintenance URL
	partitions int32
	// outcomePartitions are the outcome topic's (payments.settled).
	outcomePartitions int32
	// profileDir, when set, is where heap profiles of serve go (-profile),
	// taken every profileEvery and at the peak resident set.
	profileDir   string
	profileEvery time.Duration
	// providerHTTP2: the provider speaks HTTP/2 over TLS, as the large
	// payment providers' APIs do, instead of HTTP/1.1 in the clear.
	providerHTTP2 bool
	// provider is how the fake provider runs (-provider), fakepspBinary
	// the developer build of billing whose `fakepsp` runs it as a process.
	provider      string
	fakepspBinary string
	// pg is the benchmark's own PostgreSQL cluster, whose WAL and CPU are
	// the scenarios' alone; nil on a server given with -db (no database
	// cost is measured there).
	pg *pgCluster
}

// replica is one running serve process.
type replica struct {
	cmd  *exec.Cmd
	addr string // HTTP_ADDR
	logs *os.File
	cpu0 time.Duration
}

func runScenario(sc scenario, b *broker, opts runOptions) (result, error) {
	ctx := context.Background()
	binary := sc.binary
	res := result{scenario: sc, broker: b.name}
	replicas := max(sc.replicas, 1)
	known, err := knownVars(binary)
	if err != nil {
		return res, err
	}
	const dbName = "billing_bench"
	dsn, drop, err := freshDatabase(opts.server, dbName)
	if err != nil {
		return res, err
	}
	defer drop()

	addrs, names, cleanup, err := b.prepare(opts.partitions, opts.outcomePartitions)
	if err != nil {
		return res, err
	}
	defer cleanup()
	psp, err := startProvider(opts.provider, sc, opts)
	if err != nil {
		return res, err
	}
	defer psp.close()

	set := []string{"KAFKA_BROKERS=" + strings.Join(addrs, ","), "KAFKA_TOPIC=" + names.topic, "KAFKA_DLQ_TOPIC=" + names.dlq,
		"KAFKA_OUTCOME_TOPIC=" + names.outcome, "KAFKA_GROUP_ID=" + names.group,
		"DATABASE_URL=" + dsn, "PAYMENT_BASE_URL=" + psp.url, "LOG_LEVEL=warn"}
	set = append(set, psp.trust...)
	var pprofAddr string
	if opts.profileDir != "" {
		if known["DEBUG_PPROF_ADDR"] {
			pprofAddr = freeAddr()
		} else {
			fmt.Printf("    no heap profiles: %s does not read DEBUG_PPROF_ADDR\n", binary)
		}
	}
	env, dropped := serveEnv(known, os.Environ(), set, sc.env)
	if len(dropped) > 0 {
		fmt.Printf("    not passed to %s, which does not read them: %s\n", binary, strings.Join(dropped, " "))
	}
	res.maxConcurrency = 1024 // PAYMENT_MAX_CONCURRENCY's default since it exists
	if v, ok := lookup(env, "PAYMENT_MAX_CONCURRENCY"); ok {
		res.maxConcurrency, _ = strconv.Atoi(v)
	}
	migrate := exec.Command(binary, "migrate")
	migrate.Env = env
	if out, err := migrate.CombinedOutput(); err != nil {
		return res, fmt.Errorf("migrate: %w\n%s", err, out)
	}

	kcfg := config.Kafka{Brokers: addrs, ClientID: "bench", Version: "3.6.0"}
	client, err := sarama.NewClient(kcfg.Brokers, sarama.NewConfig())
	if err != nil {
		return res, err
	}
	defer client.Close()
	var end map[int32]int64
	var wantCharges int64
	produce := func() error {
		var err error
		if res.produced, wantCharges, err = produceBacklog(ctx, sc, kcfg, names.topic); err != nil {
			return err
		}
		end, err = kafka.EndOffsets(client, names.topic)
		return err
	}
	if !sc.live {
		if err := produce(); err != nil {
			return res, err
		}
	}

	// The database window opens before serve starts: its first writes are
	// the events' too.
	dbw, err := beginDB(ctx, opts.pg)
	if err != nil {
		return res, err
	}
	// Start the replicas, one group.
	reps := make([]*replica, replicas)
	defer func() {
		for _, r := range reps {
			if r != nil {
				_ = r.cmd.Process.Signal(syscall.SIGTERM)
			}
		}
		for _, r := range reps {
			if r != nil {
				_ = r.cmd.Wait()
				r.logs.Close()
			}
		}
	}()
	for i := range reps {
		r := &replica{addr: freeAddr()}
		renv := append(slices.Clone(env), "HTTP_ADDR="+r.addr)
		if i == 0 && pprofAddr != "" {
			renv = append(renv, "DEBUG_PPROF_ADDR="+pprofAddr)
		}
		if r.logs, err = os.CreateTemp("", "billing-bench-*.log"); err != nil {
			return res, err
		}
		r.cmd = exec.Command(binary, "serve")
		r.cmd.Env = renv
		r.cmd.Stderr, r.cmd.Stdout = r.logs, r.logs
		if err := r.cmd.Start(); err != nil {
			r.logs.Close()
			return res, err
		}
		reps[i] = r
	}

	// The throughput window: on a backlog, from the moment the first
	// replica holds a group session (the others join meanwhile, as a
	// deployment scaled from zero does); live, from the moment every
	// replica holds one, steadily, and the events start to arrive.
	var start time.Time
	var samples *sampler
	var watch *watcher
	var broker0, self0, pg0 time.Duration
	var machine0 cpuSample
	begin := func() error {
		start = time.Now()
		res.load0 = loadAverage()
		for _, r := range reps {
			if r.cpu0, err = cpuTime(r.cmd.Process.Pid); err != nil {
				return err
			}
		}
		if broker0, err = b.cpu(); err != nil {
			return err
		}
		if self0, err = cpuTime(os.Getpid()); err != nil {
			return err
		}
		if opts.pg != nil {
			if pg0, err = serverCPU(opts.pg.postmaster()); err != nil {
				return err
			}
		}
		if machine0, err = machineCPU(); err != nil {
			return err
		}
		samples = startSampler(psp, start)
		watch = startWatcher(reps[0].cmd.Process.Pid, reps[0].addr, pprofAddr, opts.profileDir, slug(sc.name+" "+b.name), opts.profileEvery)
		return nil
	}
	finishWatch := func() {
		if watch == nil {
			return
		}
		var files []string
		res.memAtPeak, res.peakAnon, files, err = watch.finish()
		watch = nil
		if err != nil {
			fmt.Printf("    profiling: %v\n", err)
		}
		if len(files) > 0 {
			fmt.Printf("    heap profiles: %s\n", strings.Join(files, " "))
		}
	}
	defer finishWatch()
	if sc.live {
		if err := waitGroupSteady(reps, client, names.group, names.topic, 2*time.Minute); err != nil {
			return res, err
		}
		if err := begin(); err != nil {
			return res, err
		}
		produced := time.Now()
		if err := produce(); err != nil {
			return res, err
		}
		res.produceTime = time.Since(produced)
	} else {
		first := true
		if err := waitReplicas(reps, 30*time.Second, func() error {
			if !first {
				return nil
			}
			first = false
			return begin()
		}); err != nil {
			return res, err
		}
		res.allReady = time.Since(start)
	}

	for {
		done, err := caughtUp(ctx, client, names, end)
		if err != nil {
			return res, err
		}
		if done {
			break
		}
		if time.Since(start) > 15*time.Minute {
			return res, fmt.Errorf("did not catch up within 15 minutes (logs in %s)", reps[0].logs.Name())
		}
		time.Sleep(50 * time.Millisecond)
	}
	res.elapsed = time.Since(start)
	var cpu time.Duration
	for _, r := range reps {
		cpu1, err := cpuTime(r.cmd.Process.Pid)
		if err != nil {
			return res, err
		}
		cpu += cpu1 - r.cpu0
		res.replicaCores = append(res.replicaCores, (cpu1-r.cpu0).Seconds()/res.elapsed.Seconds())
	}
	broker1, err := b.cpu()
	if err != nil {
		return res, err
	}
	self1, err := cpuTime(os.Getpid())
	if err != nil {
		return res, err
	}
	res.benchCores = (self1 - self0).Seconds() / res.elapsed.Seconds()
	res.pgCores = math.NaN()
	if opts.pg != nil {
		pg1, err := serverCPU(opts.pg.postmaster())
		if err != nil {
			return res, err
		}
		res.pgCores = (pg1 - pg0).Seconds() / res.elapsed.Seconds()
	}
	machine1, err := machineCPU()
	if err != nil {
		return res, err
	}
	res.load1 = loadAverage()
	finishWatch()
	res.samples = samples.finish()
	res.phases = splitPhases(res.samples, int64(res.maxConcurrency*replicas))
	res.brokerCPU = time.Duration(float64(broker1-broker0) / float64(res.produced))
	res.eventsPerS = float64(res.produced) / res.elapsed.Seconds()
	res.cpuPerEvent = time.Duration(float64(cpu) / float64(res.produced))
	res.serviceCores = cpu.Seconds() / res.elapsed.Seconds()
	res.machineBusy = machine1.busySince(machine0)
	for _, r := range reps {
		rss, err := peakRSS(r.cmd.Process.Pid)
		if err != nil {
			return res, err
		}
		res.peakRSS = max(res.peakRSS, rss)
	}
	var snaps []metrics.Snapshot
	for _, r := range reps {
		s, err := scrape(r.addr)
		if err != nil {
			return res, err
		}
		snaps = append(snaps, s)
	}
	families := mergeSnapshots(snaps)
	res.p50 = families.Histograms["billing_event_latency_seconds"].Quantile(0.5)
	res.p99 = families.Histograms["billing_event_latency_seconds"].Quantile(0.99)
	res.proc50 = families.Histograms["billing_event_processing_seconds"].Quantile(0.5)
	res.proc99 = families.Histograms["billing_event_processing_seconds"].Quantile(0.99)
	res.txEvents = mean(families.Histograms["billing_transaction_events"])
	res.poolWait = math.NaN()
	if w, ok := families.Values[`go_sql_wait_duration_seconds_total{db_name="billing"}`]; ok {
		res.poolWait = w / float64(res.produced)
	}
	st, err := psp.stats()
	if err != nil {
		return res, err
	}
	if psp.counted != nil {
		res.maxInFlight = psp.counted.max.Load()
		res.meanInFlight = float64(psp.counted.busy.Load()) / float64(res.elapsed)
	} else {
		for _, s := range res.samples {
			res.maxInFlight = max(res.maxInFlight, s.inFlight)
		}
		res.meanInFlight = res.phases.meanBusy * (res.phases.lastAnswer - res.phases.first).Seconds() / res.elapsed.Seconds()
	}
	res.doubleOrder = st.OrdersChargedTwice
	res.requests, res.peakPerSecond, res.rateLimited = st.Requests, st.PeakPerSecond, st.RateLimited
	for _, r := range reps {
		if c := complaints(r.logs.Name()); c != "" {
			res.complaints = strings.TrimPrefix(res.complaints+"; "+c, "; ")
		}
	}

	// The relay publishes the last outcomes after the offsets: its writes
	// (the rows marked published) are the events' too.
	if dbw != nil {
		if err := waitOutboxRelayed(ctx, dsn, 30*time.Second); err != nil {
			fmt.Printf("    %v: the database window ends without it\n", err)
		}
		detail := sc.latency == 0 && sc.valueBytes == 0
		if res.db, err = dbw.end(ctx, dbName, detail); err != nil {
			return res, fmt.Errorf("database cost: %w", err)
		}
	}
	if st.ChargesCreated != wantCharges || st.OrdersChargedTwice != 0 {
		return res, fmt.Errorf("provider created %d charges for %d unique events, %d orders charged twice (logs in %s)",
			st.ChargesCreated, wantCharges, st.OrdersChargedTwice, reps[0].logs.Name())
	}
	for _, r := range reps {
		os.Remove(r.logs.Name()) // kept when the scenario failed
	}
	return res, nil
}

// waitReplicas waits until every replica's /readyz answered 200 once,
// calling ready each time one does.
func waitReplicas(reps []*replica, timeout time.Duration, ready func() error) error {
	deadline := time.Now().Add(timeout)
	done := make([]bool, len(reps))
	for left := len(reps); left > 0; {
		for i, r := range reps {
			if done[i] || !isReady(r) {
				continue
			}
			done[i] = true
			left--
			if err := ready(); err != nil {
				return err
			}
		}
		if left > 0 && time.Now().After(deadline) {
			return fmt.Errorf("serve not ready (logs in %s)", reps[0].logs.Name())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// waitGroupSteady waits until every replica holds a group session and the
// group has assigned every partition of topic among all of them, and it
// stayed so for groupSteadyFor. Readiness alone does not say it: under the
// cooperative protocol a member that joins holds a session, with nothing
// assigned, until the others learn of the rebalance at their next
// heartbeat and give partitions up in a second round.
func waitGroupSteady(reps []*replica, client sarama.Client, group, topic string, timeout time.Duration) error {
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return err
	}
	// Not admin.Close: it would close the shared client.
	partitions, err := client.Partitions(topic)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	var since time.Time
	last := "no description"
	for {
		steady := true
		for _, r := range reps {
			steady = steady && isReady(r)
		}
		if steady {
			var why string
			steady, why = groupAssigned(admin, group, topic, len(reps), len(partitions))
			last = why
		}
		switch {
		case !steady:
			since = time.Time{}
		case since.IsZero():
			since = time.Now()
		case time.Since(since) >= groupSteadyFor:
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the %d replicas did not share the group's partitions steadily within %s (%s; logs in %s)", len(reps), timeout, last, reps[0].logs.Name())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// groupSteadyFor is how long the assignment must hold: a heartbeat
// interval (3 s), after which every member has heard of any rebalance.
const groupSteadyFor = 3500 * time.Millisecond

// groupAssigned reports whether group is stable with members members that
// each hold at least one partition of topic, all of its partitions
// assigned, and why not.
func groupAssigned(admin sarama.ClusterAdmin, group, topic string, members, partitions int) (bool, string) {
	descs, err := admin.DescribeConsumerGroups([]string{group})
	if err != nil || len(descs) != 1 {
		return false, fmt.Sprintf("describe group: %v", err)
	}
	d := descs[0]
	if d.State != "Stable" || len(d.Members) != members {
		return false, fmt.Sprintf("group %s with %d members", d.State, len(d.Members))
	}
	assigned := 0
	for id, m := range d.Members {
		a, err := m.GetMemberAssignment()
		if err != nil || a == nil || len(a.Topics[topic]) == 0 {
			return false, fmt.Sprintf("member %s holds nothing yet", id)
		}
		assigned += len(a.Topics[topic])
	}
	if assigned != partitions {
		return false, fmt.Sprintf("%d of %d partitions assigned", assigned, partitions)
	}
	return true, ""
}

func isReady(r *replica) bool {
	resp, err := http.Get("http://" + r.addr + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// produceBacklog publishes the scenario's events to topic: loadgen's mix
// (10 % duplicates) and the charges it should make, or, for a backlog of
// large values, JSON objects that are not events (parked, not charged).
func produceBacklog(ctx context.Context, sc scenario, kcfg config.Kafka, topic string) (produced int, wantCharges int64, err error) {
	pcfg, err := kafka.ProducerConfig(kcfg)
	if err != nil {
		return 0, 0, err
	}
	if sc.valueBytes > 0 {
		pcfg.Producer.Compression = sc.compression
		produced, err = produceLarge(kcfg, pcfg, topic, sc.events, sc.valueBytes)
		return produced, 0, err
	}
	producer, err := sarama.NewAsyncProducer(kcfg.Brokers, pcfg)
	if err != nil {
		return 0, 0, err
	}
	gen, err := loadgen.New(loadgen.Options{Count: sc.events, Duplicates: 0.1, Seed: 1})
	if err != nil {
		producer.Close()
		return 0, 0, err
	}
	pub, err := loadgen.Publish(ctx, producer, gen, loadgen.PublishOptions{Topic: topic})
	producer.Close()
	if err != nil {
		return 0, 0, err
	}
	return pub.Produced, int64(gen.Expected().Unique), nil
}

// waitOutboxRelayed waits until the outbox of the database at dsn holds
// nothing left to publish (a binary without an outbox has none).
func waitOutboxRelayed(ctx context.Context, dsn string, timeout time.Duration) error {
	db, err := postgres.Open(dsn, 1)
	if err != nil {
		return err
	}
	defer db.Close()
	var has bool
	if err := db.QueryRowContext(ctx, `SELECT to_regclass('outbox') IS NOT NULL`).Scan(&has); err != nil || !has {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		var left int64
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM outbox WHERE published_at IS NULL AND NOT dead`).Scan(&left); err != nil {
			return fmt.Errorf("outbox: %w", err)
		}
		if left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d outbox rows still unpublished after %s", left, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// complaints summarises serve's warnings and errors (LOG_LEVEL=warn logs
// nothing else): how many, and the distinct messages, most frequent first.
func complaints(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	count := map[string]int{}
	total := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var line struct{ Msg string }
		if json.Unmarshal(sc.Bytes(), &line) != nil || line.Msg == "" {
			continue
		}
		count[line.Msg]++
		total++
	}
	if total == 0 {
		return ""
	}
	msgs := slices.Collect(maps.Keys(count))
	slices.SortFunc(msgs, func(a, b string) int { return cmp.Or(count[b]-count[a], strings.Compare(a, b)) })
	var parts []string
	for _, m := range msgs[:min(3, len(msgs))] {
		parts = append(parts, fmt.Sprintf("%d× %q", count[m], m))
	}
	return fmt.Sprintf("%d warnings or errors: %s", total, strings.Join(parts, ", "))
}

// cpuSample is the machine's CPU time so far (/proc/stat), in ticks.
type cpuSample struct{ busy, total int64 }

func machineCPU() (cpuSample, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuSample{}, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return cpuSample{}, errors.New("/proc/stat: no cpu line")
	}
	var s cpuSample
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		s.total += n
		if i != 3 && i != 4 { // idle, iowait
			s.busy += n
		}
	}
	return s, nil
}

// busySince is the share of the machine's CPU time that was busy between
// the two samples: everyone's, the service's, the database's, the
// broker's and other engineers'.
func (s cpuSample) busySince(earlier cpuSample) float64 {
	if s.total == earlier.total {
		return math.NaN()
	}
	return float64(s.busy-earlier.busy) / float64(s.total-earlier.total)
}

// loadAverage is the machine's 1-minute load average, as /proc/loadavg
// says.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// caughtUp reports whether the group committed every partition to end.
func caughtUp(ctx context.Context, client sarama.Client, n kafkaNames, end map[int32]int64) (bool, error) {
	committed, err := kafka.CommittedOffsets(ctx, client, n.group, n.topic)
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
	dsn, err := pgserver.Recreate(ctx, server, name)
	if err != nil {
		return "", nil, err
	}
	return dsn, func() { _ = pgserver.Drop(ctx, server, name) }, nil
}

func scrape(addr string) (metrics.Snapshot, error) {
	return metrics.Scrape(context.Background(), "http://"+addr+"/metrics")
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

// produceLarge publishes count values of size bytes with distinct keys:
// valid JSON but not events, zstd-compressed on the wire as a producer may,
// so that the broker takes them and billing holds them whole.
func produceLarge(k config.Kafka, cfg *sarama.Config, topic string, count, size int) (int, error) {
	cfg.Producer.MaxMessageBytes = size + 1<<20
	producer, err := sarama.NewSyncProducer(k.Brokers, cfg)
	if err != nil {
		return 0, err
	}
	defer producer.Close()
	value := append(append([]byte(`{"pad":"`), bytes.Repeat([]byte("x"), size-10)...), `"}`...)
	for i := range count {
		msg := &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(fmt.Sprintf("large-%d", i)), Value: sarama.ByteEncoder(value)}
		if _, _, err := producer.SendMessage(msg); err != nil {
			return i, fmt.Errorf("produce large message %d: %w", i, err)
		}
	}
	return count, nil
}
