package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/config"
	"example.com/billing/internal/fakepsp"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/loadgen"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/postgres"
)

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
	if st.ChargesCreated != wantCharges {
		return res, fmt.Errorf("provider created %d charges for %d unique events", st.ChargesCreated, wantCharges)
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
