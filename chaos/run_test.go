//go:build chaos

package chaos_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/dev/embeddedkafka"
	"example.com/billing/internal/dev/freeport"
	"example.com/billing/internal/dev/loadgen"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/postgres"
)

const (
	partitions   = 6
	declineEvery = 20
	// drainTimeout is serve's DRAIN_TIMEOUT (its default, set explicitly).
	drainTimeout = 10 * time.Second
	// stopGrace is how long a SIGTERM'd serve may take to exit: the drain,
	// then leaving the group and stopping HTTP (at most 5s).
	stopGrace = drainTimeout + 5*time.Second
)

// scenario is one fault-injection run.
type scenario struct {
	name      string
	consumers int     // serve processes at the start
	count     int     // messages of loadgen's mix
	rate      float64 // messages per second
	latency   time.Duration
	// inject injects the scenario's faults while the stream runs; it returns
	// when they are over and everything is restored.
	inject func(r *run)
	// only, when set, is the one broker (brokerApache, brokerKfake) the
	// scenario can run on, and why says why.
	only, why string
	// seconds sends a second, different event for every valid event's
	// order, on another partition (see stream.seconds).
	seconds bool
	// needs says why the scenario cannot run on this machine (not root,
	// no iptables), nil when it can. Such a scenario is skipped with that
	// reason, and fails under CI=true, where nothing may be skipped for
	// lack of tools.
	needs func() error
	// hosts: the serve processes of the first hosts slots each run in a
	// network namespace of their own (netHost), the rest on the machine.
	hosts int
	// env is added to every serve's environment.
	env map[string]string
	// prepare runs once the hosts exist and before the database is
	// created: infrastructure of the scenario's own (proxies, a PostgreSQL
	// of its own in r.server), cleaned up with t.Cleanup.
	prepare func(r *run) error
	// ready runs once every serve is ready (its start-up upkeep done) and
	// before the first event is published: a state of the database the
	// stream must meet from its first event.
	ready func(r *run) error
	// check runs once the group caught up and the outbox is published,
	// while the consumers still run (their /metrics, their logs).
	check func(r *run)
	// secured runs serve as least-privilege users, over SASL_SSL and
	// verified TLS to PostgreSQL (see secureRun).
	secured bool
	// txn: the order service publishes the stream in Kafka transactions,
	// a quarter of them aborted (txn_test.go).
	txn bool
	// past, when its upper bound is set, dates the stream's valid events
	// between past[0] and past[1] ago (backlog_test.go).
	past [2]time.Duration
	// upgrade: the run starts on the previous release, migrated and
	// served by its binary (upgrade_test.go).
	upgrade bool
	// provider, when set, is the real provider's API serve speaks to
	// fakepsp's profile of it, whose webhooks reach the replicas through
	// one load balancer (provider_test.go: stripe, adyen).
	provider *providerSpec
}

// dbServer is a PostgreSQL server a run's database lives on: the suite's
// cluster, or one of the scenario's own.
type dbServer interface {
	URL(name string) string
	createDatabase(name string) error
}

// run is the state of one scenario.
type run struct {
	t      *testing.T
	sc     scenario
	seed   int64
	dir    string
	start  time.Time // when publishing started
	client sarama.Client
	// probe is a client with short timeouts for polling while brokers
	// fail: a request to a paused broker fails in seconds, not after
	// sarama's 30s read timeout.
	probe  sarama.Client
	dbName string
	dsn    string
	server dbServer // where the database is
	psp    *psp
	stream *stream
	// hosts are the network namespaces of the first sc.hosts slots.
	hosts map[int]*netHost
	// The scenario's own infrastructure, set by its prepare.
	proxies []*tcpProxy // latency proxies in front of the brokers
	pair    *pgPair     // a primary and its standby
	disk    *tmpfs      // the filesystem under the database
	diskPG  *pgCluster  // the cluster on it

	// The run's Kafka: its bootstrap addresses (KAFKA_BROKERS), topics and
	// group. embedded is the kfake broker of a run on kfake, nil on Apache
	// Kafka (whose cluster is suite.kafka).
	brokers                              string
	topic, dlqTopic, outcomeTopic, group string
	embedded                             *embeddedkafka.Broker

	mu         sync.Mutex
	consumers  map[int]*consumer // running, by slot
	all        []*consumer       // every serve process started
	nextSlot   int
	starts     map[int]int // restarts per slot, for log names
	faultCount map[string]int
	faultOrder []string
	unexpected []string // processes that exited without being told to
	// extra are invalid messages a fault published beside the stream
	// (oversized values): verify expects each in the DLQ.
	extra     []*sent
	stopTimes []time.Duration
	zombies   int // kfake members evicted by reapZombies
	// figures are what the scenario measured beyond the common columns
	// (see figure).
	figures []string
	// faultStart is when the scenario's main fault began, for figures
	// measured from it; committedAtEnd the group's committed messages when
	// it ended, for the throughput after it.
	faultStart     time.Time
	committedAtEnd int64
	// faultEnd is when the last injected fault was undone (see faultOver),
	// published when the broker had acknowledged the whole stream, lagZero
	// when the group's committed offsets were first seen at the end
	// offsets after that.
	faultEnd, published, lagZero time.Time
	// secured is the run's users and secrets when sc.secured.
	secured *securedRun
	// maintaining runs billing maintain over and over (backlog_test.go).
	maintaining *maintainLoop
	// binary is the billing binary serve processes start from now:
	// suite.binary, or a release's (upgrade_test.go).
	binary string
	// upgrading is the rolling upgrade's state (upgrade_test.go).
	upgrading *upgrade
	// pooler is the PgBouncer between billing and the database
	// (pooler_test.go).
	pooler *pooler
	// provider is the provider's wiring when sc.provider is set
	// (provider_test.go).
	provider *providerRun
	// fleet is what the fleet scenario samples (fleet_test.go).
	fleet *fleetRun
}

// scenarioSeed derives a scenario's seed from the suite's, so that one
// scenario run alone (-run TestChaos/name) replays the same way.
func scenarioSeed(name string) int64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s", suite.seed, name)
	return int64(h.Sum64() >> 2)
}

func newRun(t *testing.T, sc scenario) *run {
	r := &run{
		t: t, sc: sc, seed: scenarioSeed(sc.name),
		consumers:  map[int]*consumer{},
		starts:     map[int]int{},
		faultCount: map[string]int{},
		hosts:      map[int]*netHost{},
	}
	r.dir = filepath.Join(suite.dir, sc.name)
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("scenario %s: seed %d, %d messages at %.0f/s, %d consumers; logs in %s", sc.name, r.seed, sc.count, sc.rate, sc.consumers, r.dir)

	if err := r.setUpKafka(); err != nil {
		t.Fatal(err)
	}

	// The hosts, removed after the processes in them were killed
	// (t.Cleanup runs last-in first-out).
	for slot := range sc.hosts {
		h, err := newHost()
		if err != nil {
			t.Fatalf("network namespace: %v", err)
		}
		t.Cleanup(h.remove)
		r.hosts[slot] = h
		t.Logf("slot %d runs in network namespace %s (%s, veth %s/%s)", slot, h.ns, h.nsIP, h.hostIf, h.nsIf)
	}
	if sc.prepare != nil {
		if err := sc.prepare(r); err != nil {
			t.Fatalf("prepare: %v", err)
		}
	}

	// A database of its own in the suite's cluster (or the scenario's
	// server), migrated by the binary.
	if r.server == nil {
		if err := suite.pg.ensureRunning(); err != nil {
			t.Fatalf("PostgreSQL: %v", err)
		}
		r.server = suite.pg
	}
	r.dbName = "chaos_" + strings.ReplaceAll(sc.name, "-", "_")
	if err := r.server.createDatabase(r.dbName); err != nil {
		t.Fatalf("create database: %v", err)
	}
	r.dsn = r.server.URL(r.dbName)
	migrateURL := r.dsn
	if r.pooler != nil {
		// Migration 10 sets its session's lock_timeout, which billing
		// migrate applies over a direct connection only: the migrate Job
		// of a deployment behind a transaction pooler reaches PostgreSQL
		// directly.
		migrateURL = r.pooler.direct.URL(r.dbName)
	}
	if sc.secured {
		secured, err := r.secure()
		if err != nil {
			t.Fatal(err)
		}
		r.secured, migrateURL = secured, secured.ownerURL
	}
	r.binary = suite.binary
	if sc.upgrade {
		previous, err := releases.previous()
		if err != nil {
			t.Fatalf("the previous release: %v", err)
		}
		r.binary = previous
	}
	mig, err := startBinaryIn(r.binary, nil, "migrate", filepath.Join(r.dir, "migrate.log"), map[string]string{"DATABASE_URL": migrateURL}, nil, "migrate")
	if err != nil {
		t.Fatal(err)
	}
	<-mig.done
	if mig.exitErr != nil {
		t.Fatalf("billing migrate: %v\n%s", mig.exitErr, mig.tail(20))
	}

	// The provider, as a process.
	if sc.provider != nil {
		if r.provider, err = r.startProvider(sc.provider); err != nil {
			t.Fatal(err)
		}
	} else {
		args := []string{"--decline-every", fmt.Sprint(declineEvery), "--seed", fmt.Sprint(r.seed)}
		if sc.latency > 0 {
			args = append(args, "--latency", sc.latency.String())
		}
		if r.psp, err = startPSP(filepath.Join(r.dir, "fakepsp.log"), nil, args...); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.stopPSP)
	}

	r.stream, err = newStream(r.topic, partitions, sc.count, sc.rate, r.seed, sc.past)
	if err != nil {
		t.Fatal(err)
	}
	r.stream.seconds = sc.seconds
	if sc.past[1] > 0 {
		// Copies of an event raced by two replicas are asked by both (the
		// provider replays the answer): a backlog counts one request per
		// event.
		r.stream.crossRate = 0
	}
	if sc.txn {
		r.stream.txn = &txnStream{id: "chaos-orders-" + sc.name + "-" + randomHex(3), phantoms: map[string]loadgen.Event{}}
	}

	// The consumer group.
	t.Cleanup(r.killAll) // after a failure; normally they are stopped already
	for range sc.consumers {
		r.startConsumer()
	}
	for _, c := range r.running() {
		if err := c.waitReady(60 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if sc.ready != nil {
		if err := sc.ready(r); err != nil {
			t.Fatalf("ready: %v", err)
		}
	}
	return r
}

// stopPSP stops the provider, once the run is over.
func (r *run) stopPSP() {
	if _, err := r.psp.terminate(10 * time.Second); err != nil {
		r.t.Logf("fakepsp: %v", err)
	}
}

// rng returns a random source of its own for one fault track: tracks run
// concurrently, and each must replay the same way from the seed.
func (r *run) rng(track string) *rand.Rand {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s", r.seed, track)
	return rand.New(rand.NewPCG(h.Sum64(), uint64(r.seed)))
}

// elapsed is the time since publishing started, for the fault log.
func (r *run) elapsed() time.Duration {
	return time.Since(r.start).Round(100 * time.Millisecond)
}

// fault logs one injected fault and counts it by kind.
func (r *run) fault(kind, format string, args ...any) {
	r.mu.Lock()
	if !slices.Contains(r.faultOrder, kind) {
		r.faultOrder = append(r.faultOrder, kind)
	}
	r.faultCount[kind]++
	r.mu.Unlock()
	r.t.Logf("[+%s] %s: %s", r.elapsed(), kind, fmt.Sprintf(format, args...))
}

// faultOver records that a fault was undone now: a killed or stopped
// process (consumer, broker, PostgreSQL) started again, a paused broker
// continued, the provider up again or its resets off, a kfake fault
// removed, a joined consumer gone. The last of these is where the summary's
// "fault end → lag 0" starts.
func (r *run) faultOver() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faultEnd = time.Now()
}

// recovery is the time from the end of the last fault to lag 0: 0 when the
// group had caught up before the last fault ended, and not ok before both
// are known.
func (r *run) recovery() (d time.Duration, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.faultEnd.IsZero() || r.lagZero.IsZero() {
		return 0, false
	}
	return max(r.lagZero.Sub(r.faultEnd), 0), true
}

// figure records one of the scenario's measurements: logged now, and
// printed in its summary line and row.
func (r *run) figure(format string, args ...any) {
	f := fmt.Sprintf(format, args...)
	r.mu.Lock()
	r.figures = append(r.figures, f)
	r.mu.Unlock()
	r.t.Logf("[+%s] figure: %s", r.elapsed(), f)
}

// addFaults counts n faults of kind (hits of a broker fault, rejected
// provider requests) without logging each.
func (r *run) addFaults(kind string, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !slices.Contains(r.faultOrder, kind) {
		r.faultOrder = append(r.faultOrder, kind)
	}
	r.faultCount[kind] += n
}

// count returns how many faults of kind were injected.
func (r *run) count(kind string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.faultCount[kind]
}

func (r *run) faultSummary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var parts []string
	for _, k := range r.faultOrder {
		parts = append(parts, fmt.Sprintf("%s×%d", k, r.faultCount[k]))
	}
	return strings.Join(parts, " ")
}

// sleepUntil sleeps until d after publishing started.
func (r *run) sleepUntil(d time.Duration) {
	if wait := time.Until(r.start.Add(d)); wait > 0 {
		time.Sleep(wait)
	}
}

// --- the consumer group's processes ---

func (r *run) env(c *consumer) map[string]string {
	env := map[string]string{
		"KAFKA_BROKERS":       r.brokers,
		"KAFKA_TOPIC":         r.topic,
		"KAFKA_DLQ_TOPIC":     r.dlqTopic,
		"KAFKA_OUTCOME_TOPIC": r.outcomeTopic,
		"KAFKA_GROUP_ID":      r.group,
		"KAFKA_CLIENT_ID":     c.name,
		"DATABASE_URL":        r.dsn,
		"PAYMENT_BASE_URL":    r.psp.url,
		"PAYMENT_TIMEOUT":     "2s",
		"HTTP_ADDR":           c.addr,
		"LOG_LEVEL":           "info",
		"DRAIN_TIMEOUT":       drainTimeout.String(),
	}
	for k, v := range r.sc.env {
		env[k] = v
	}
	if r.secured != nil {
		maps.Copy(env, r.secured.serveEnv)
	}
	if r.provider != nil {
		maps.Copy(env, r.provider.env(c.name))
		env["WEBHOOK_ADDR"] = c.webhook
	}
	return env
}

// startConsumer starts a serve process in a new slot.
func (r *run) startConsumer() *consumer {
	r.mu.Lock()
	slot := r.nextSlot
	r.nextSlot++
	r.mu.Unlock()
	return r.startInSlot(slot)
}

// startInSlot starts a serve process in slot (a restart when the slot was
// used before). It does not wait for readiness: a restarted consumer joins
// the group while the stream and the other faults go on.
func (r *run) startInSlot(slot int) *consumer {
	r.mu.Lock()
	gen := r.starts[slot]
	r.starts[slot]++
	r.mu.Unlock()
	port, err := freeport.Port()
	if err != nil {
		r.t.Errorf("free port: %v", err)
		return nil
	}
	// A serve in a host listens on the namespace's address, which the
	// suite reaches over the veth pair.
	host := r.hosts[slot]
	ip := "127.0.0.1"
	var wrap []string
	if host != nil {
		ip, wrap = host.nsIP, host.wrap()
	}
	c := &consumer{addr: fmt.Sprintf("%s:%d", ip, port), host: host}
	if r.provider != nil {
		// Its provider-facing listener, behind the run's load balancer.
		webhookPort, err := freeport.Port()
		if err != nil {
			r.t.Errorf("free port: %v", err)
			return nil
		}
		c.webhook = fmt.Sprintf("%s:%d", ip, webhookPort)
	}
	name := fmt.Sprintf("serve-%d", slot)
	if gen > 0 {
		name = fmt.Sprintf("serve-%d.%d", slot, gen)
	}
	c.proc = &proc{name: name} // for env's client id
	r.mu.Lock()
	binary := r.binary
	r.mu.Unlock()
	p, err := startBinaryIn(binary, wrap, name, filepath.Join(r.dir, name+".log"), r.env(c), nil, "serve")
	if err != nil {
		r.t.Errorf("%v", err)
		return nil
	}
	c.proc = p
	r.mu.Lock()
	r.consumers[slot] = c
	r.all = append(r.all, c)
	r.mu.Unlock()
	go func() {
		<-p.done
		if !p.wasSignaled() {
			r.mu.Lock()
			r.unexpected = append(r.unexpected, fmt.Sprintf("%s (pid %d) exited on its own after %s: %v\n%s",
				p.name, p.pid(), p.exitedAt.Sub(p.started).Round(time.Millisecond), p.exitErr, p.tail(40)))
			r.mu.Unlock()
		}
		r.mu.Lock()
		if r.consumers[slot] == c {
			delete(r.consumers, slot)
		}
		r.mu.Unlock()
	}()
	return c
}

// running returns the running serve processes, by slot.
func (r *run) running() []*consumer {
	r.mu.Lock()
	defer r.mu.Unlock()
	slots := make([]int, 0, len(r.consumers))
	for s := range r.consumers {
		slots = append(slots, s)
	}
	sort.Ints(slots)
	out := make([]*consumer, 0, len(slots))
	for _, s := range slots {
		out = append(out, r.consumers[s])
	}
	return out
}

// slotOf returns c's slot, or -1.
func (r *run) slotOf(c *consumer) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	for s, x := range r.consumers {
		if x == c {
			return s
		}
	}
	return -1
}

// pick returns a random running consumer that no other fault is already
// stopping (a kill -9 of a process draining after its SIGTERM would fail
// that SIGTERM's exit check), nil when there is none.
func (r *run) pick(rng *rand.Rand) *consumer {
	var cs []*consumer
	for _, c := range r.running() {
		if !c.wasSignaled() {
			cs = append(cs, c)
		}
	}
	if len(cs) == 0 {
		return nil
	}
	return cs[rng.IntN(len(cs))]
}

// kill9 kills a random consumer with SIGKILL and restarts it after a short
// random pause.
func (r *run) kill9(rng *rand.Rand) {
	c := r.pick(rng)
	if c == nil {
		r.t.Errorf("kill -9: %v", errNotRunning)
		return
	}
	slot := r.slotOf(c)
	pause := time.Duration(rng.IntN(1500)) * time.Millisecond
	r.fault("kill-9", "%s (pid %d), restart in %s", c.name, c.pid(), pause)
	c.kill9()
	time.Sleep(pause)
	r.startInSlot(slot)
	r.faultOver()
}

// sigterm stops a random consumer with SIGTERM while the stream runs,
// asserts that it drained and exited 0 within its grace period, and starts
// it again.
func (r *run) sigterm(rng *rand.Rand) {
	c := r.pick(rng)
	if c == nil {
		r.t.Errorf("SIGTERM: %v", errNotRunning)
		return
	}
	slot := r.slotOf(c)
	r.stop(c, "sigterm")
	r.startInSlot(slot)
	r.faultOver()
}

// stop sends SIGTERM to c and checks its exit: status 0 within stopGrace.
func (r *run) stop(c *consumer, kind string) {
	took, err := c.terminate(stopGrace)
	r.mu.Lock()
	r.stopTimes = append(r.stopTimes, took)
	r.mu.Unlock()
	if kind != "" {
		r.fault(kind, "%s (pid %d) exited in %s: %v", c.name, c.pid(), took.Round(time.Millisecond), exitText(err))
	}
	if err != nil {
		r.t.Errorf("SIGTERM %s: %v (limit: DRAIN_TIMEOUT %s + 5s)\n%s", c.name, err, drainTimeout, c.tail(40))
	}
}

func exitText(err error) string {
	if err == nil {
		return "status 0"
	}
	return err.Error()
}

// join starts one more consumer; leave stops it with SIGTERM after hold.
func (r *run) joinAndLeave(hold time.Duration) {
	c := r.startConsumer()
	if c == nil {
		return
	}
	r.fault("join", "%s (pid %d) joins for %s", c.name, c.pid(), hold.Round(time.Millisecond))
	defer r.faultOver()
	time.Sleep(hold)
	if c.exited() {
		return
	}
	r.stop(c, "leave")
}

// stopAll stops every running consumer with SIGTERM, concurrently, checking
// each exit.
func (r *run) stopAll() {
	var wg sync.WaitGroup
	for _, c := range r.running() {
		wg.Go(func() { r.stop(c, "") })
	}
	wg.Wait()
}

// killAll kills whatever still runs (after a failed scenario).
func (r *run) killAll() {
	r.mu.Lock()
	all := slices.Clone(r.all)
	r.mu.Unlock()
	for _, c := range all {
		if !c.exited() {
			c.kill9()
		}
	}
}

// --- waiting for the group ---

// caughtUp reports whether the group has committed every partition to its
// end, with the offsets for a message.
func (r *run) caughtUp() (bool, string, error) {
	end, err := kafka.EndOffsets(r.probe, r.topic)
	if err != nil {
		return false, "", err
	}
	committed, err := committedOffsets(r.probe, r.group, r.topic)
	if err != nil {
		return false, "", err
	}
	done := true
	var lag []string
	for p := range int32(partitions) {
		if committed[p] != end[p] {
			done = false
			lag = append(lag, fmt.Sprintf("p%d committed %d end %d", p, committed[p], end[p]))
		}
	}
	return done, strings.Join(lag, ", "), nil
}

// watchLag is started once everything is published (the end offsets are
// final): it polls every 250ms until the group has committed everything and
// records that moment in r.lagZero, while faults may still go on. Once
// caught up after publishing the group stays caught up: no message comes
// after, and committed offsets only move forward. It fails the test when
// ctx ends first.
func (r *run) watchLag(ctx context.Context) bool {
	var last string
	for {
		done, lag, err := r.caughtUp()
		if err == nil && done {
			r.mu.Lock()
			r.lagZero = time.Now()
			r.mu.Unlock()
			return true
		}
		if err != nil {
			lag = err.Error()
		}
		last = lag
		select {
		case <-ctx.Done():
			var tails []string
			for _, c := range r.running() {
				tails = append(tails, fmt.Sprintf("--- %s (%s)\n%s", c.name, c.logPath, c.tail(25)))
			}
			r.t.Errorf("group did not catch up within %s of the end of the faults: %s\n%s", catchUpLimit, last, strings.Join(tails, "\n"))
			return false
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// catchUpLimit is how long after the faults ended (and everything was
// published) the group must have committed everything.
const catchUpLimit = 3 * time.Minute

// readiness checks, during a database outage, that every consumer that
// keeps running answers /readyz 503 and /healthz 200; and afterwards 200.
func (r *run) checkReadyz(want int, within time.Duration) {
	deadline := time.Now().Add(within)
	for _, c := range r.running() {
		for {
			if c.exited() {
				break
			}
			if code := c.get("/healthz"); !c.healthzOK(code) {
				r.t.Errorf("[+%s] %s /healthz = %d, want 200 whatever the database does", r.elapsed(), c.name, code)
			}
			got := c.get("/readyz")
			if got == want {
				r.t.Logf("[+%s] %s /readyz = %d, /healthz = 200", r.elapsed(), c.name, got)
				break
			}
			if time.Now().After(deadline) {
				if !c.exited() {
					r.t.Errorf("[+%s] %s /readyz = %d, want %d within %s", r.elapsed(), c.name, got, want, within)
				}
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// --- topics, read without failing the test from a helper ---

// readTopic reads every message of topic that exists now.
func (r *run) readTopic(topic string) ([]*sarama.ConsumerMessage, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return embeddedkafka.ReadTopic(ctx, r.client, topic)
}

// runScenario runs sc: the stream with its faults, the wait for the group,
// a clean stop, and the checks.
func runScenario(t *testing.T, sc scenario) {
	began := time.Now()
	r := newRun(t, sc)
	row := summaryRow{scenario: sc.name, seed: r.seed}
	defer func() {
		row.elapsed = time.Since(began)
		row.faults = r.faultSummary()
		r.mu.Lock()
		row.zombies = r.zombies
		r.mu.Unlock()
		row.passed = !t.Failed()
		r.mu.Lock()
		row.figures = strings.Join(r.figures, "; ")
		r.mu.Unlock()
		addRow(row)
		t.Logf("scenario %s: %d messages (%d valid, %d duplicates, %d invalid), %d provider charges, faults: %s; double charges %d, lost events %d, DLQ re-parks %d; %s; %s",
			sc.name, row.messages, row.valid, row.dups, row.invalid, row.charges, row.faults, row.double, row.lost, row.dlqRepark, row.elapsed.Round(100*time.Millisecond), row.figures)
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	published := make(chan error, 1)
	lagCtx, stopLag := context.WithCancel(ctx)
	defer stopLag()
	caughtUp := make(chan bool, 1)
	r.start = time.Now()
	if r.embedded != nil {
		stopReaper := make(chan struct{})
		reaped := make(chan struct{})
		go func() { r.reapZombies(stopReaper); close(reaped) }()
		defer func() { close(stopReaper); <-reaped }()
	}
	go func() {
		err := r.stream.publish(ctx, r.brokers)
		r.mu.Lock()
		r.published = time.Now()
		r.mu.Unlock()
		published <- err
		caughtUp <- err == nil && r.watchLag(lagCtx)
	}()
	sc.inject(r)
	r.mu.Lock()
	faultEnd := r.faultEnd
	r.mu.Unlock()
	t.Logf("[+%s] faults over (the last one ended at +%s)", r.elapsed(), faultEnd.Sub(r.start).Round(100*time.Millisecond))
	if err := <-published; err != nil {
		t.Fatalf("publish: %v", err)
	}
	timer := time.AfterFunc(catchUpLimit, stopLag)
	defer timer.Stop()
	r.mu.Lock()
	publishedAt := r.published
	r.mu.Unlock()
	t.Logf("[+%s] all %d messages were published (acknowledged) at +%s", r.elapsed(), len(r.stream.messages()), publishedAt.Sub(r.start).Round(100*time.Millisecond))

	if <-caughtUp {
		row.recovery, row.recovered = r.recovery()
		r.mu.Lock()
		lagZero := r.lagZero
		r.mu.Unlock()
		row.afterStream = max(lagZero.Sub(publishedAt), 0)
		t.Logf("[+%s] group caught up at +%s: %s after the last fault ended (0: caught up before it ended), %s after the stream was published",
			r.elapsed(), lagZero.Sub(r.start).Round(100*time.Millisecond), row.recovery.Round(100*time.Millisecond),
			row.afterStream.Round(100*time.Millisecond))
	}
	r.waitOutboxPublished(time.Minute)
	if sc.check != nil {
		sc.check(r)
	}
	r.stopAll()
	r.mu.Lock()
	for _, u := range r.unexpected {
		t.Errorf("unexpected exit: %s", u)
	}
	var maxStop time.Duration
	for _, d := range r.stopTimes {
		maxStop = max(maxStop, d)
	}
	r.mu.Unlock()
	t.Logf("[+%s] all consumers stopped with SIGTERM; slowest exit %s", r.elapsed(), maxStop.Round(time.Millisecond))

	row.maxStop = maxStop
	var res result
	if r.provider != nil {
		res = r.verifyProvider()
	} else {
		res = r.verify()
	}
	if r.secured != nil {
		r.checkNoSecrets()
	}
	row.messages, row.valid, row.dups, row.invalid, row.cross = res.messages, res.valid, res.dups, res.invalid, res.cross
	row.double, row.lost, row.dlqRepark = res.double, res.lost, res.dlqRepark
	row.outcomes, row.settled = res.outcomes, res.settled
	row.charges = res.charges
}

// waitOutboxPublished waits until the outbox relay of the running
// consumers has published every payment outcome event recorded.
func (r *run) waitOutboxPublished(timeout time.Duration) {
	db, err := postgres.Open(r.dsn, 1)
	if err != nil {
		r.t.Errorf("open database: %v", err)
		return
	}
	defer db.Close()
	deadline := time.Now().Add(timeout)
	for {
		var waiting int
		err := db.Get(&waiting, `SELECT count(*) FROM outbox WHERE published_at IS NULL`)
		if err == nil && waiting == 0 {
			return
		}
		if time.Now().After(deadline) {
			r.t.Errorf("%d payment outcome events still unpublished after %s (%v)", waiting, timeout, err)
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// reapAfter is how long after a process died the suite removes its member
// from the group, if kfake has not (see reapZombies).
const reapAfter = 6 * time.Second

// reapZombies works around two bugs of kfake, the embedded broker (not of
// billing):
//
//  1. A member whose JoinGroup answer cannot be delivered, because its
//     process died while it waited in JoinGroup, never gets a session timer:
//     kfake never expires it, and the leader assigns it partitions that
//     nobody consumes, for ever (or, once a rebalance starts, the group
//     waits for it for the whole rebalance timeout, 60s). Apache Kafka
//     expires it session.timeout.ms (10s) after the join completed.
//  2. A live member that waits in JoinGroup for longer than its session
//     timeout (because of 1) is removed from the group, and its JoinGroup
//     request is never answered: the process hangs in sarama's JoinGroup,
//     and a SIGTERM cannot stop it. Apache Kafka keeps members that await a
//     join alive.
//
// Until kfake is fixed, the suite plays the broker's part: the member of a
// process that has been dead for reapAfter is removed with a LeaveGroup on
// its behalf. That is a little sooner than Kafka's session timeout (the
// partitions of a killed consumer are reassigned after ~6s rather than
// ~10s), and early enough that no live member waits in JoinGroup for 10s.
// Each eviction is logged and counted in the summary. CHAOS_KFAKE_REAPER=off
// disables it: kill -9 during a join then leaves partitions unconsumed or
// SIGTERM'd processes hanging in JoinGroup.
func (r *run) reapZombies(stop <-chan struct{}) {
	if os.Getenv("CHAOS_KFAKE_REAPER") == "off" {
		return
	}
	admin, err := sarama.NewClusterAdminFromClient(r.client)
	if err != nil {
		r.t.Errorf("reaper: %v", err)
		return
	}
	evicted := map[string]bool{}
	var lastState string
	var lastMembers int
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		groups, err := admin.DescribeConsumerGroups([]string{r.group})
		if err != nil || len(groups) == 0 {
			continue
		}
		if groups[0].State != lastState || len(groups[0].Members) != lastMembers {
			var names []string
			for _, m := range groups[0].Members {
				names = append(names, m.ClientId)
			}
			sort.Strings(names)
			r.t.Logf("[+%s] group %s: %v", r.elapsed(), groups[0].State, names)
			lastState, lastMembers = groups[0].State, len(groups[0].Members)
		}
		byClient := map[string]*consumer{}
		r.mu.Lock()
		for _, c := range r.all {
			byClient[c.name] = c
		}
		r.mu.Unlock()
		for id, m := range groups[0].Members {
			c, ok := byClient[m.ClientId]
			if !ok || evicted[id] || !c.exited() || time.Since(c.exitedAt) < reapAfter {
				continue
			}
			coord, err := r.client.Coordinator(r.group)
			if err != nil {
				continue
			}
			resp, err := coord.LeaveGroup(&sarama.LeaveGroupRequest{Version: 3, GroupId: r.group, Members: []sarama.MemberIdentity{{MemberId: id}}})
			if err != nil || resp.Err != sarama.ErrNoError {
				r.t.Logf("reaper: LeaveGroup for %s: %v %v", id, err, resp)
				continue
			}
			evicted[id] = true
			r.mu.Lock()
			r.zombies++
			r.mu.Unlock()
			r.t.Logf("[+%s] member %s of %s, dead for %s, evicted with LeaveGroup (kfake workaround, see reapZombies)",
				r.elapsed(), id, c.name, time.Since(c.exitedAt).Round(100*time.Millisecond))
		}
	}
}
