// Package apachekafka runs real Apache Kafka clusters in KRaft mode for
// billing's tests, chaos suite and benchmark.
//
// The broker is the one operators run: org.apache.kafka:kafka_2.13 at the
// version pinned in test/kafka/pom.xml, resolved from Maven Central with its
// runtime dependencies into a cache folder outside the work tree (see Jars)
// and started with `java -cp 'libs/*' kafka.Kafka`. Each node is a combined
// broker and controller with a private log directory formatted by Kafka's
// storage tool, listening on free loopback ports. A cluster of three nodes
// has a three-voter controller quorum, replication factor 3 and
// min.insync.replicas 2, so that a node can be killed, stopped, paused or
// restarted the way operators meet it.
//
// Every node runs as a child of the calling process that the kernel kills
// when that process dies (PDEATHSIG), so a test binary that is killed by a
// timeout or Ctrl-C leaves no JVM behind.
package apachekafka

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/dev/freeport"
)

// Options configure a Cluster.
type Options struct {
	// Nodes is the number of combined broker+controller nodes: 1, or 3 for
	// a replicated cluster.
	Nodes int
	// Dir holds one directory per node (its log dir, configuration and
	// logs). It must exist.
	Dir string
	// Jars is the directory of Kafka's jars (see Jars).
	Jars string
	// HeapMB is each node's maximum Java heap; 0 means 512.
	HeapMB int
	// Security adds TLS and SASL listeners beside the plaintext one.
	Security *Security
	// Config overrides or adds broker settings.
	Config map[string]string
}

// Security describes the secured listeners a cluster offers: one that
// requires TLS with a client certificate, one that requires SASL over TLS,
// and one that requires SASL over plaintext. SASL accepts PLAIN,
// SCRAM-SHA-256 and SCRAM-SHA-512 for User/Password (when User is set);
// more SCRAM users are added while the cluster runs (SetSCRAM).
type Security struct {
	// CertFile and KeyFile are the brokers' certificate (for 127.0.0.1)
	// and its PKCS #8 key, PEM; CAFile is the CA that signed it and that
	// client certificates must chain to.
	CAFile, CertFile, KeyFile string
	User, Password            string
	// Authorizer turns on Kafka's StandardAuthorizer with
	// allow.everyone.if.no.acl.found=false: a principal may do only what
	// an ACL allows it. User:ANONYMOUS, the principal of the plaintext and
	// controller listeners, is a super user: the nodes talk to each other
	// there, and the tests do their own admin work there (topics, ACLs,
	// users), never on the secured listeners. SuperUsers are more of them
	// (e.g. "User:billing").
	Authorizer bool
	SuperUsers []string
}

// Cluster is a running Apache Kafka cluster.
type Cluster struct {
	opts  Options
	id    string
	nodes []*Node
}

// Start formats and starts a cluster and waits until it answers metadata
// with every node and a group coordinator is available.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Nodes != 1 && opts.Nodes != 3 {
		return nil, fmt.Errorf("apachekafka: %d nodes: 1 or 3 are supported", opts.Nodes)
	}
	if opts.HeapMB == 0 {
		opts.HeapMB = 512
	}
	java, err := Java()
	if err != nil {
		return nil, err
	}
	if v, err := JavaMajor(java); err != nil || v < 17 {
		return nil, errors.Join(err, fmt.Errorf("apachekafka: Apache Kafka 4 needs Java 17 or newer; %s is %d (set JAVA_HOME)", java, v))
	}
	c := &Cluster{opts: opts, id: clusterID()}
	ports, err := freeport.Ports(opts.Nodes * 5)
	if err != nil {
		return nil, err
	}
	for i := range opts.Nodes {
		n := &Node{
			ID:    i + 1,
			dir:   filepath.Join(opts.Dir, fmt.Sprintf("node-%d", i+1)),
			java:  java,
			jars:  opts.Jars,
			heap:  opts.HeapMB,
			ports: ports[i*5 : i*5+5],
		}
		if err := os.MkdirAll(n.dir, 0o755); err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, n)
	}
	for _, n := range c.nodes {
		if err := n.writeConfig(c); err != nil {
			return nil, err
		}
	}
	// The storage tool is a JVM start of its own; format the nodes at once.
	errs := make([]error, len(c.nodes))
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		wg.Go(func() { errs[i] = n.format(ctx, c) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for _, n := range c.nodes {
		if err := n.Start(); err != nil {
			c.Close()
			return nil, err
		}
	}
	if err := c.WaitHealthy(ctx, 90*time.Second); err != nil {
		c.Close()
		return nil, fmt.Errorf("%w\n%s", err, c.LogTail(40))
	}
	return c, nil
}

// Nodes returns the cluster's nodes, by id.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// Node returns the node with broker id id, or nil.
func (c *Cluster) Node(id int32) *Node {
	for _, n := range c.nodes {
		if int32(n.ID) == id {
			return n
		}
	}
	return nil
}

// Addrs returns the plaintext listener of every node.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.Addr()
	}
	return out
}

// Listener names a cluster's listeners.
type Listener int

const (
	// Plaintext: no TLS, no authentication.
	Plaintext Listener = iota
	// MutualTLS: TLS with a client certificate signed by Security.CAFile.
	MutualTLS
	// SASLOverTLS: TLS (no client certificate) and SASL.
	SASLOverTLS
	// SASLPlaintext: SASL without TLS.
	SASLPlaintext
)

// AddrsOf returns every node's address on listener l (Security must be set
// for the secured ones).
func (c *Cluster) AddrsOf(l Listener) []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = fmt.Sprintf("127.0.0.1:%d", n.ports[listenerPort[l]])
	}
	return out
}

// port indexes of a node's ports.
const (
	portPlaintext = iota
	portController
	portMutualTLS
	portSASLOverTLS
	portSASLPlaintext
)

var listenerPort = map[Listener]int{
	Plaintext:     portPlaintext,
	MutualTLS:     portMutualTLS,
	SASLOverTLS:   portSASLOverTLS,
	SASLPlaintext: portSASLPlaintext,
}

// Close stops every node (SIGKILL: a test cluster has nothing to keep).
func (c *Cluster) Close() {
	for _, n := range c.nodes {
		n.Kill()
	}
}

// LogTail returns the last lines of every node's log, for a failure
// message.
func (c *Cluster) LogTail(lines int) string {
	var b strings.Builder
	for _, n := range c.nodes {
		fmt.Fprintf(&b, "--- Apache Kafka node %d (%s)\n%s\n", n.ID, n.dir, n.LogTail(lines))
	}
	return b.String()
}

// Restore undoes what a fault left behind: it continues the paused nodes,
// starts the ones that are not running (from their own log dirs, as a
// restart after a crash does) and waits up to timeout until the cluster is
// healthy. It returns the ids of the nodes it continued or started.
func (c *Cluster) Restore(ctx context.Context, timeout time.Duration) ([]int, error) {
	var touched []int
	for _, n := range c.nodes {
		switch {
		case n.Paused():
			n.Resume()
		case !n.Running():
			if err := n.Start(); err != nil {
				return touched, err
			}
		default:
			continue
		}
		touched = append(touched, n.ID)
	}
	return touched, c.WaitHealthy(ctx, timeout)
}

// WaitHealthy waits until every running node is in the cluster's metadata,
// every partition of every topic has a leader and all its replicas in sync,
// and the group coordinator answers.
func (c *Cluster) WaitHealthy(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if last = c.healthy(); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("apache kafka not healthy within %s: %w", timeout, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (c *Cluster) healthy() error {
	for _, n := range c.nodes {
		if err := n.exitError(); err != nil {
			return err
		}
	}
	// Each node answers on its own: the cluster's metadata can still list
	// a node that was just killed, until the controller fences it.
	for _, n := range c.nodes {
		if err := n.answers(); err != nil {
			return err
		}
	}
	client, err := sarama.NewClient(c.Addrs(), probeConfig())
	if err != nil {
		return err
	}
	defer client.Close()
	if got := len(client.Brokers()); got != len(c.nodes) {
		return fmt.Errorf("%d of %d brokers in the metadata", got, len(c.nodes))
	}
	if n, err := c.underReplicated(client); err != nil || n > 0 {
		return errors.Join(err, fmt.Errorf("%d partitions under-replicated", n))
	}
	// FindCoordinator creates __consumer_offsets on first use; until its
	// partitions have leaders the answer is "not available".
	if _, err := client.Coordinator("apachekafka-probe"); err != nil {
		return fmt.Errorf("group coordinator: %w", err)
	}
	return nil
}

// UnderReplicated returns how many partitions have fewer in-sync replicas
// than replicas, or no leader.
func (c *Cluster) UnderReplicated() (int, error) {
	client, err := sarama.NewClient(c.runningAddrs(), probeConfig())
	if err != nil {
		return 0, err
	}
	defer client.Close()
	return c.underReplicated(client)
}

func (c *Cluster) underReplicated(client sarama.Client) (int, error) {
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return 0, err
	}
	topics, err := admin.ListTopics()
	if err != nil {
		return 0, err
	}
	names := make([]string, 0, len(topics))
	for t := range topics {
		names = append(names, t)
	}
	meta, err := admin.DescribeTopics(names)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, t := range meta {
		if t.Err != sarama.ErrNoError {
			return 0, fmt.Errorf("describe %s: %w", t.Name, t.Err)
		}
		for _, p := range t.Partitions {
			if p.Leader < 0 || len(p.Isr) < len(p.Replicas) {
				n++
			}
		}
	}
	return n, nil
}

func (c *Cluster) runningAddrs() []string {
	var out []string
	for _, n := range c.nodes {
		if n.Running() {
			out = append(out, n.Addr())
		}
	}
	return out
}

func probeConfig() *sarama.Config {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_6_0_0
	cfg.ClientID = "apachekafka-probe"
	cfg.Net.DialTimeout = 2 * time.Second
	cfg.Net.ReadTimeout = 5 * time.Second
	cfg.Metadata.Retry.Max = 1
	cfg.Metadata.Retry.Backoff = 100 * time.Millisecond
	return cfg
}

// config returns node n's server.properties.
func (c *Cluster) config(n *Node) map[string]string {
	replicas := strconv.Itoa(min(3, len(c.nodes)))
	minISR := strconv.Itoa(max(1, min(2, len(c.nodes)-1)))
	var voters []string
	for _, v := range c.nodes {
		voters = append(voters, fmt.Sprintf("%d@127.0.0.1:%d", v.ID, v.ports[portController]))
	}
	listeners := []string{
		fmt.Sprintf("PLAINTEXT://127.0.0.1:%d", n.ports[portPlaintext]),
		fmt.Sprintf("CONTROLLER://127.0.0.1:%d", n.ports[portController]),
	}
	protocols := []string{"PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"}
	cfg := map[string]string{
		"process.roles":                    "broker,controller",
		"node.id":                          strconv.Itoa(n.ID),
		"controller.quorum.voters":         strings.Join(voters, ","),
		"controller.listener.names":        "CONTROLLER",
		"inter.broker.listener.name":       "PLAINTEXT",
		"log.dirs":                         filepath.Join(n.dir, "data"),
		"default.replication.factor":       replicas,
		"min.insync.replicas":              minISR,
		"offsets.topic.replication.factor": replicas,
		// Fewer coordinator partitions than the default 50: a node starts
		// and takes over a coordinator faster.
		"offsets.topic.num.partitions":             "6",
		"transaction.state.log.replication.factor": replicas,
		"transaction.state.log.min.isr":            minISR,
		"transaction.state.log.num.partitions":     "6",
		// A transaction past its producer's transaction.timeout.ms is
		// aborted within a second, not within the default 10 s: the
		// tests of a producer that dies mid-transaction wait for it.
		"transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
		"share.coordinator.state.topic.replication.factor":            replicas,
		"share.coordinator.state.topic.min.isr":                       minISR,
		// Tests create their topics; a typo must not create one.
		"auto.create.topics.enable": "false",
		// A test's consumer group forms at once rather than after 3 s.
		"group.initial.rebalance.delay.ms": "0",
		// Two cores run everything: fewer threads than a production broker.
		"num.network.threads":            "2",
		"num.io.threads":                 "4",
		"num.replica.fetchers":           "1",
		"background.threads":             "4",
		"log.cleaner.threads":            "1",
		"log.cleaner.dedupe.buffer.size": strconv.Itoa(8 << 20),
	}
	if s := c.opts.Security; s != nil {
		listeners = append(listeners,
			fmt.Sprintf("SSL://127.0.0.1:%d", n.ports[portMutualTLS]),
			fmt.Sprintf("SASL_SSL://127.0.0.1:%d", n.ports[portSASLOverTLS]),
			fmt.Sprintf("SASL_PLAINTEXT://127.0.0.1:%d", n.ports[portSASLPlaintext]))
		protocols = append(protocols, "SSL:SSL", "SASL_SSL:SASL_SSL", "SASL_PLAINTEXT:SASL_PLAINTEXT")
		keystore := filepath.Join(n.dir, "keystore.pem")
		maps.Copy(cfg, map[string]string{
			"ssl.keystore.type":                     "PEM",
			"ssl.keystore.location":                 keystore,
			"ssl.truststore.type":                   "PEM",
			"ssl.truststore.location":               s.CAFile,
			"ssl.endpoint.identification.algorithm": "",
			"listener.name.ssl.ssl.client.auth":     "required",
			"sasl.enabled.mechanisms":               "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
		})
		for _, l := range []string{"sasl_ssl", "sasl_plaintext"} {
			plain := "org.apache.kafka.common.security.plain.PlainLoginModule required"
			if s.User != "" {
				plain += fmt.Sprintf(` user_%s="%s"`, s.User, s.Password)
			}
			cfg["listener.name."+l+".plain.sasl.jaas.config"] = plain + ";"
			for _, m := range []string{"scram-sha-256", "scram-sha-512"} {
				cfg["listener.name."+l+"."+m+".sasl.jaas.config"] = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
			}
		}
	}
	if s := c.opts.Security; s != nil && s.Authorizer {
		maps.Copy(cfg, map[string]string{
			"authorizer.class.name":          "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
			"allow.everyone.if.no.acl.found": "false",
			"super.users":                    strings.Join(append([]string{"User:ANONYMOUS"}, s.SuperUsers...), ";"),
		})
	}
	cfg["listeners"] = strings.Join(listeners, ",")
	var advertised []string
	for _, l := range listeners {
		if !strings.HasPrefix(l, "CONTROLLER:") {
			advertised = append(advertised, l)
		}
	}
	cfg["advertised.listeners"] = strings.Join(advertised, ",")
	cfg["listener.security.protocol.map"] = strings.Join(protocols, ",")
	maps.Copy(cfg, c.opts.Config)
	return cfg
}

// clusterID returns a random Kafka cluster id: 16 bytes, URL-safe base64,
// not starting with '-' (as Kafka's Uuid.randomUuid): kafka-storage format
// takes "--cluster-id -x..." for a missing argument, which failed one chaos
// run in 64.
func clusterID() string {
	b := make([]byte, 16)
	for {
		_, _ = rand.Read(b)
		if id := base64.RawURLEncoding.EncodeToString(b); id[0] != '-' {
			return id
		}
	}
}

// writeProperties writes a Java properties file, keys sorted.
func writeProperties(path string, props map[string]string) error {
	keys := make([]string, 0, len(props))
	for k := range props {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, escapeProperty(props[k]))
	}
	return os.WriteFile(path, []byte(b.String()), 0o600)
}

// escapeProperty escapes what a properties file reads specially.
func escapeProperty(v string) string {
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`).Replace(v)
}

// SetSCRAM creates (or replaces) user's SCRAM-SHA-256 and SCRAM-SHA-512
// credentials with the admin API, on the plaintext listener: sarama sends
// the salted hash, never the password. The brokers accept the login a
// moment later, once they have applied the change.
func (c *Cluster) SetSCRAM(user, password string) error {
	admin, err := sarama.NewClusterAdmin(c.runningAddrs(), probeConfig())
	if err != nil {
		return fmt.Errorf("kafka admin: %w", err)
	}
	defer admin.Close()
	// One credential of a user per request: the broker refuses two.
	for _, m := range []sarama.ScramMechanismType{sarama.SCRAM_MECHANISM_SHA_256, sarama.SCRAM_MECHANISM_SHA_512} {
		salt := make([]byte, 32)
		_, _ = rand.Read(salt)
		results, err := admin.UpsertUserScramCredentials([]sarama.AlterUserScramCredentialsUpsert{
			{Name: user, Mechanism: m, Iterations: 4096, Salt: salt, Password: []byte(password)}})
		if err != nil {
			return fmt.Errorf("set SCRAM credentials of %s: %w", user, err)
		}
		for _, r := range results {
			if r.ErrorCode != sarama.ErrNoError {
				msg := ""
				if r.ErrorMessage != nil {
					msg = ": " + *r.ErrorMessage
				}
				return fmt.Errorf("set SCRAM credentials of %s: %w%s", r.User, r.ErrorCode, msg)
			}
		}
	}
	return nil
}
