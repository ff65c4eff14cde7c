//go:build chaos

// Package chaos_test is billing's fault-injection suite: it runs real
// `billing serve` processes, several in one consumer group, against Kafka
// (a three-node Apache Kafka cluster, or the embedded kfake broker whose
// Fault API fails chosen requests; CHAOS_BROKER picks), a throwaway
// PostgreSQL cluster of its own and `billing fakepsp` as a process, drives a
// stream of valid, duplicated and invalid events through them while it
// injects faults, and then checks that every valid event was charged
// exactly once in effect.
//
// It runs only with the build tag chaos (make chaos). Randomness is seeded:
// CHAOS_SEED (or -seed) replays the event mix and the fault schedule of a
// failed run; the seed is printed at the start and in the summary.
package chaos_test

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"example.com/billing/internal/testenv/apachekafka"
	"example.com/billing/internal/testenv/testpki"
)

var (
	seedFlag = flag.Int64("seed", 0, "seed of the event mix and the fault schedule (default: CHAOS_SEED, else the time)")
	keepFlag = flag.Bool("keep", false, "keep the suite's directory (logs, database files) even when every scenario passed (or CHAOS_KEEP=1)")
)

// suite is what all scenarios share: the billing binaries, the PostgreSQL
// cluster, the broker and the directory that holds their files and logs.
var suite struct {
	seed int64
	dir  string
	// binary is billing as it ships, which runs serve and every operator's
	// command; devBinary the developer build, whose fakepsp is the
	// provider.
	binary, devBinary string
	pg                *pgCluster
	// broker is brokerApache or brokerKfake; kafka is the Apache Kafka
	// cluster (nil on kfake, where each scenario starts its own broker).
	broker string
	kafka  *apachekafka.Cluster
	// pki is the suite's test CA: the Apache Kafka nodes' certificate for
	// their secured listeners, and the PostgreSQL cluster's for
	// secured-cluster.
	pki *testpki.PKI

	mu      sync.Mutex
	rows    []summaryRow
	failed  bool
	started time.Time
}

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) (code int) {
	suite.started = time.Now()
	suite.seed = chooseSeed()
	fmt.Printf("chaos: seed %d (replay with CHAOS_SEED=%d make chaos)\n", suite.seed, suite.seed)
	broker, err := chooseBroker()
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	suite.broker = broker

	dir, err := os.MkdirTemp("", "billing-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 1
	}
	suite.dir = dir
	defer func() {
		if code != 0 || suite.failed || *keepFlag || os.Getenv("CHAOS_KEEP") != "" {
			fmt.Printf("chaos: logs and data kept in %s\n", dir)
			return
		}
		if err := os.RemoveAll(dir); err != nil {
			fmt.Fprintln(os.Stderr, "chaos: remove", dir, err)
		}
	}()
	// PostgreSQL may run as another user (see pgCluster), which must be
	// able to reach its directories below this one.
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 1
	}

	// Network namespaces, veth pairs, nat chains and tmpfs mounts a
	// killed suite left behind, then this suite's chain at the end.
	if removed := cleanStale(); len(removed) > 0 {
		fmt.Printf("chaos: removed what a killed suite left behind: %s\n", strings.Join(removed, ", "))
	}
	defer tearDownNet()

	if suite.pki, err = testpki.New(dir); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 1
	}
	if suite.binary, err = buildBinary(dir, "CHAOS_BINARY", "billing"); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 1
	}
	if suite.devBinary, err = buildBinary(dir, "CHAOS_DEV_BINARY", "billing-dev", "-tags", "dev"); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 1
	}
	suite.pg, err = startCluster(filepath.Join(dir, "pg"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos: PostgreSQL:", err)
		return 1
	}
	defer suite.pg.close()
	fmt.Printf("chaos: PostgreSQL cluster on 127.0.0.1:%d (%s)\n", suite.pg.port, suite.pg.how)
	if suite.broker == brokerApache {
		started := time.Now()
		if suite.kafka, err = startApache(filepath.Join(dir, "kafka")); err != nil {
			fmt.Fprintln(os.Stderr, "chaos: Apache Kafka (CHAOS_BROKER=kfake runs on the embedded broker instead):", err)
			return 1
		}
		defer suite.kafka.Close()
		fmt.Printf("chaos: Apache Kafka, 3 nodes (KRaft, RF 3, min.insync.replicas 2) on %s, started in %s\n",
			strings.Join(suite.kafka.Addrs(), ","), time.Since(started).Round(100*time.Millisecond))
	} else {
		fmt.Println("chaos: embedded kfake broker, a fresh one per scenario (CHAOS_BROKER=kfake)")
	}

	code = m.Run()
	printSummary(os.Stdout)
	return code
}

// chooseSeed returns -seed, else CHAOS_SEED, else a seed from the clock.
func chooseSeed() int64 {
	if *seedFlag != 0 {
		return *seedFlag
	}
	if s := os.Getenv("CHAOS_SEED"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaos: CHAOS_SEED=%q is not an integer\n", s)
			os.Exit(2)
		}
		return n
	}
	return time.Now().UnixNano() % 1_000_000_000
}

// buildBinary builds cmd/billing with tags into dir as name, or returns
// the binary the variable env names when set. Building every time, with
// the Go build cache, is quick and never runs a stale binary.
func buildBinary(dir, env, name string, tags ...string) (string, error) {
	if b := os.Getenv(env); b != "" {
		abs, err := filepath.Abs(b)
		if err != nil {
			return "", err
		}
		fmt.Printf("chaos: using %s=%s\n", env, abs)
		return abs, nil
	}
	// The go command that runs this test puts its own GOROOT/bin first in
	// PATH, so this is the same toolchain.
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("the go command is needed to build cmd/billing (or set %s): %w", env, err)
	}
	out := filepath.Join(dir, name)
	started := time.Now()
	// make build's (make dev's) flags, so that they share the build cache.
	cmd := exec.Command(goBin, append(append([]string{"build"}, tags...), "-trimpath", "-o", out, "example.com/billing/cmd/billing")...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if extra := os.Getenv("CHAOS_BUILD_FLAGS"); extra != "" {
		cmd.Args = append(cmd.Args[:2], append(strings.Fields(extra), cmd.Args[2:]...)...)
		cmd.Env = os.Environ()
	}
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", strings.Join(append(tags, "./cmd/billing"), " "), err, msg)
	}
	fmt.Printf("chaos: built %s in %s\n", out, time.Since(started).Round(time.Millisecond))
	return out, nil
}

// summaryRow is one scenario's line in the final table.
type summaryRow struct {
	scenario  string
	seed      int64
	messages  int // published: valid + duplicates + invalid
	valid     int
	dups      int           // loadgen's duplicates plus the cross-partition copies
	cross     int           // of dups: same-bytes copies sent to another partition
	maxStop   time.Duration // slowest exit after SIGTERM
	invalid   int
	charges   int // created at the provider
	faults    string
	figures   string // the scenario's own measurements
	double    int
	lost      int
	dlqRepark int
	zombies   int // members of dead processes the suite evicted (see reapZombies)
	// outcomes is the number of distinct payment outcome events published,
	// settled the number of settled events that should have one.
	outcomes, settled int
	// recovery is the time from the end of the last injected fault to the
	// moment the group's committed offsets reached the end offsets (0 when
	// they had before it ended); afterStream the same from the moment the
	// whole stream was acknowledged, which recovery includes when the
	// stream outlasted the faults.
	recovery, afterStream time.Duration
	recovered             bool // the group caught up: both are known
	elapsed               time.Duration
	passed                bool
	skipped               string // why the scenario does not run on this broker
	// cannot says why the scenario could not run on this machine under
	// CI=true, where that fails it.
	cannot string
}

func addRow(r summaryRow) {
	suite.mu.Lock()
	defer suite.mu.Unlock()
	suite.rows = append(suite.rows, r)
	if !r.passed {
		suite.failed = true
	}
}

func printSummary(w io.Writer) {
	suite.mu.Lock()
	defer suite.mu.Unlock()
	if len(suite.rows) == 0 {
		return
	}
	broker := "kfake (embedded, a fresh broker per scenario)"
	if suite.kafka != nil {
		broker = "Apache Kafka, 3 nodes"
	}
	fmt.Fprintf(w, "\nchaos summary (%s; seed %d, total %s)\n", broker, suite.seed, time.Since(suite.started).Round(time.Second))
	header := []string{"scenario", "seed", "messages", "valid", "dups (x-part)", "invalid", "charges", "double", "lost", "dlq re-park", "outcomes", "evicted", "slowest stop", "lag 0 after fault end (stream end)", "time", "result", "faults injected", "figures"}
	rows := [][]string{header}
	for _, r := range suite.rows {
		if r.skipped != "" {
			rows = append(rows, []string{r.scenario, "", "", "", "", "", "", "", "", "", "", "", "", "", "", "SKIP", r.skipped, ""})
			continue
		}
		if r.cannot != "" {
			rows = append(rows, []string{r.scenario, "", "", "", "", "", "", "", "", "", "", "", "", "", "", "FAIL", "cannot run here (CI=true): " + r.cannot, ""})
			continue
		}
		result := "PASS"
		if !r.passed {
			result = "FAIL"
		}
		// The reaper works around kfake's bugs; it never runs on Apache
		// Kafka.
		evicted := "–"
		if suite.kafka == nil {
			evicted = strconv.Itoa(r.zombies)
		}
		recovery := "–"
		if r.recovered {
			recovery = fmt.Sprintf("%s (%s)", r.recovery.Round(100*time.Millisecond), r.afterStream.Round(100*time.Millisecond))
		}
		rows = append(rows, []string{
			r.scenario, strconv.FormatInt(r.seed, 10), strconv.Itoa(r.messages), strconv.Itoa(r.valid),
			fmt.Sprintf("%d (%d)", r.dups, r.cross), strconv.Itoa(r.invalid), strconv.Itoa(r.charges), strconv.Itoa(r.double), strconv.Itoa(r.lost),
			strconv.Itoa(r.dlqRepark), fmt.Sprintf("%d/%d", r.outcomes, r.settled), evicted, r.maxStop.Round(100 * time.Millisecond).String(),
			recovery, r.elapsed.Round(time.Second).String(), result, r.faults, r.figures,
		})
	}
	widths := make([]int, len(header))
	for _, row := range rows {
		for i, c := range row {
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	for n, row := range rows {
		var b strings.Builder
		b.WriteString("|")
		for i, c := range row {
			fmt.Fprintf(&b, " %s%s |", c, strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c)))
		}
		fmt.Fprintln(w, b.String())
		if n == 0 {
			b.Reset()
			b.WriteString("|")
			for i := range row {
				b.WriteString(strings.Repeat("-", widths[i]+2) + "|")
			}
			fmt.Fprintln(w, b.String())
		}
	}
}
