package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/config"
	"example.com/billing/internal/fakepsp"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/loadgen"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/pgtest"
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
}

func runScenario(sc scenario, b *broker, opts runOptions) (result, error) {
	binary := sc.binary
	res := result{scenario: sc, broker: b.name}
	known, err := knownVars(binary)
	if err != nil {
		return res, err
	}
	dsn, drop, err := freshDatabase(opts.server, "billing_bench")
	if err != nil {
		return res, err
	}
	defer drop()

	addrs, names, cleanup, err := b.prepare(opts.partitions, opts.outcomePartitions)
	if err != nil {
		return res, err
	}
	defer cleanup()
	psp := fakepsp.New(fakepsp.Options{Latency: sc.latency, RateLimit: sc.rateLimit, Seed: 1})
	counted := &inFlight{next: psp}
	pspSrv := httptest.NewUnstartedServer(counted)
	var trust []string
	if opts.providerHTTP2 {
		pspSrv.EnableHTTP2 = true
		pspSrv.StartTLS()
		// serve trusts the test server's certificate as Go does a
		// system's: SSL_CERT_FILE.
		ca := filepath.Join(os.TempDir(), fmt.Sprintf("bench-provider-%d.pem", os.Getpid()))
		if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pspSrv.Certificate().Raw}), 0o644); err != nil {
			return res, err
		}
		defer os.Remove(ca)
		trust = append(trust, "SSL_CERT_FILE="+ca)
	} else {
		pspSrv.Start()
	}
	defer pspSrv.Close()

	addr := freeAddr()
	set := []string{"KAFKA_BROKERS=" + strings.Join(addrs, ","), "KAFKA_TOPIC=" + names.topic, "KAFKA_DLQ_TOPIC=" + names.dlq,
		"KAFKA_OUTCOME_TOPIC=" + names.outcome, "KAFKA_GROUP_ID=" + names.group,
		"DATABASE_URL=" + dsn, "PAYMENT_BASE_URL=" + pspSrv.URL, "HTTP_ADDR=" + addr, "LOG_LEVEL=warn"}
	set = append(set, trust...)
	var pprofAddr string
	if opts.profileDir != "" {
		if known["DEBUG_PPROF_ADDR"] {
			pprofAddr = freeAddr()
			set = append(set, "DEBUG_PPROF_ADDR="+pprofAddr)
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

	// Pre-produce the backlog.
	kcfg := config.Kafka{Brokers: addrs, ClientID: "bench", Version: "3.6.0"}
	pcfg, err := kafka.ProducerConfig(kcfg)
	if err != nil {
		return res, err
	}
	// A large-message backlog is not a loadgen mix: each value is a JSON
	// object of sc.valueBytes that is not an event (parked, not charged).
	wantCharges := int64(0)
	if sc.valueBytes > 0 {
		pcfg.Producer.Compression = sc.compression
		if res.produced, err = produceLarge(kcfg, pcfg, names.topic, sc.events, sc.valueBytes); err != nil {
			return res, err
		}
	} else {
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
		wantCharges = int64(gen.Expected().Unique)
	}
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
	cmd := exec.Command(binary, "serve")
	cmd.Env = env
	logs, err := os.CreateTemp("", "billing-bench-*.log")
	if err != nil {
		return res, err
	}
	defer logs.Close()
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
	res.load0 = loadAverage()
	cpu0, err := cpuTime(cmd.Process.Pid)
	if err != nil {
		return res, err
	}
	broker0, err := b.cpu()
	if err != nil {
		return res, err
	}
	machine0, err := machineCPU()
	if err != nil {
		return res, err
	}
	watch := startWatcher(cmd.Process.Pid, addr, pprofAddr, opts.profileDir, slug(sc.name+" "+b.name), opts.profileEvery)
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

	for {
		done, err := caughtUp(client, names, end)
		if err != nil {
			return res, err
		}
		if done {
			break
		}
		if time.Since(start) > 15*time.Minute {
			return res, fmt.Errorf("did not catch up within 15 minutes (logs in %s)", logs.Name())
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
	machine1, err := machineCPU()
	if err != nil {
		return res, err
	}
	res.load1 = loadAverage()
	finishWatch()
	res.brokerCPU = time.Duration(float64(broker1-broker0) / float64(res.produced))
	res.eventsPerS = float64(res.produced) / res.elapsed.Seconds()
	res.cpuPerEvent = time.Duration(float64(cpu1-cpu0) / float64(res.produced))
	res.serviceCores = (cpu1 - cpu0).Seconds() / res.elapsed.Seconds()
	res.machineBusy = machine1.busySince(machine0)
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
	res.poolWait = math.NaN()
	if w, ok := families.Values[`go_sql_wait_duration_seconds_total{db_name="billing"}`]; ok {
		res.poolWait = w / float64(res.produced)
	}
	res.maxInFlight = counted.max.Load()
	res.meanInFlight = float64(counted.busy.Load()) / float64(res.elapsed)
	st := psp.Stats()
	res.doubleOrder = st.OrdersChargedTwice
	res.requests, res.peakPerSecond, res.rateLimited = st.Requests, st.PeakPerSecond, st.RateLimited
	res.complaints = complaints(logs.Name())
	if st.ChargesCreated != wantCharges || st.OrdersChargedTwice != 0 {
		return res, fmt.Errorf("provider created %d charges for %d unique events, %d orders charged twice (logs in %s)",
			st.ChargesCreated, wantCharges, st.OrdersChargedTwice, logs.Name())
	}
	os.Remove(logs.Name()) // kept when the scenario failed
	return res, nil
}

// inFlight counts the provider requests (POST /v1/charges) being answered:
// the most at once, and their summed duration, which divided by the
// measured time is the mean number in flight.
type inFlight struct {
	next     http.Handler
	now, max atomic.Int64
	busy     atomic.Int64 // nanoseconds
}

func (f *inFlight) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/charges" {
		f.next.ServeHTTP(w, r)
		return
	}
	n := f.now.Add(1)
	for m := f.max.Load(); n > m && !f.max.CompareAndSwap(m, n); m = f.max.Load() {
	}
	started := time.Now()
	defer func() {
		f.busy.Add(int64(time.Since(started)))
		f.now.Add(-1)
	}()
	f.next.ServeHTTP(w, r)
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
	dsn, err := pgtest.Recreate(ctx, server, name)
	if err != nil {
		return "", nil, err
	}
	return dsn, func() { _ = pgtest.Drop(ctx, server, name) }, nil
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
