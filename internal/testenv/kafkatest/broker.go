package kafkatest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/dev/embeddedkafka"
	"example.com/billing/internal/kafkaacl"
	"example.com/billing/internal/testenv/apachekafka"
	"example.com/billing/internal/testenv/testpki"
)

// Kinds of broker a test can run against, chosen by KAFKA_TEST_BROKER.
const (
	// Kfake is the embedded broker (franz-go's kfake): fast, in memory, one
	// per test.
	Kfake = "kfake"
	// Apache is a real Apache Kafka cluster in KRaft mode that the tests
	// start themselves from the jars Maven resolves (one per test binary,
	// shared by its tests, each of which gets topics and a group of its
	// own).
	Apache = "apache"
	// External is a cluster someone else runs, e.g. `docker compose up`:
	// KAFKA_TEST_BROKER=host:port[,host:port].
	External = "external"
)

// Broker is the Kafka a test talks to, with a topic, a dead-letter topic and
// a consumer group of the test's own.
type Broker struct {
	Kind  string
	Addrs []string // what KAFKA_BROKERS lists

	Topic, DLQTopic, OutcomeTopic, Group string

	// Creds are set for a broker from StartSecure.
	Creds Creds

	admin []string // plaintext addresses for admin calls
	dev   *embeddedkafka.Broker
}

// Creds are what a client presents to a secured listener.
type Creds struct {
	Listener                  apachekafka.Listener
	Mechanism                 string // SASL: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
	CAFile, CertFile, KeyFile string
	User, Password            string
}

// Addr is the brokers' addresses as KAFKA_BROKERS takes them.
func (b *Broker) Addr() string { return strings.Join(b.Addrs, ",") }

// Embedded returns the embedded broker, nil on any other kind.
func (b *Broker) Embedded() *embeddedkafka.Broker { return b.dev }

// Env is serve's Kafka environment for this broker: brokers, topics, group
// and, for a secured one, the KAFKA_TLS_* and KAFKA_SASL_* variables.
func (b *Broker) Env() map[string]string {
	env := map[string]string{
		"KAFKA_BROKERS":       b.Addr(),
		"KAFKA_TOPIC":         b.Topic,
		"KAFKA_DLQ_TOPIC":     b.DLQTopic,
		"KAFKA_OUTCOME_TOPIC": b.OutcomeTopic,
		"KAFKA_GROUP_ID":      b.Group,
	}
	maps.Copy(env, b.Creds.Env())
	return env
}

// Env is the KAFKA_TLS_* and KAFKA_SASL_* environment of c.
func (c Creds) Env() map[string]string {
	env := map[string]string{}
	switch c.Listener {
	case apachekafka.MutualTLS:
		env["KAFKA_TLS_ENABLED"] = "true"
		env["KAFKA_TLS_CA_FILE"] = c.CAFile
		env["KAFKA_TLS_CERT_FILE"] = c.CertFile
		env["KAFKA_TLS_KEY_FILE"] = c.KeyFile
	case apachekafka.SASLOverTLS:
		env["KAFKA_TLS_ENABLED"] = "true"
		env["KAFKA_TLS_CA_FILE"] = c.CAFile
		fallthrough
	case apachekafka.SASLPlaintext:
		env["KAFKA_SASL_MECHANISM"] = c.Mechanism
		env["KAFKA_SASL_USERNAME"] = c.User
		env["KAFKA_SASL_PASSWORD"] = c.Password
	}
	return env
}

// Option changes what Start creates.
type Option func(*topics)

type topics struct {
	partitions         int32
	configs, dlqConfig map[string]string
}

// TopicConfig sets configuration of the order topic (e.g. retention.ms).
func TopicConfig(kv map[string]string) Option {
	return func(o *topics) { maps.Copy(o.configs, kv) }
}

// DLQConfig sets configuration of the dead-letter topic.
func DLQConfig(kv map[string]string) Option {
	return func(o *topics) { maps.Copy(o.dlqConfig, kv) }
}

// Start returns the test's broker, chosen by KAFKA_TEST_BROKER, with its
// order topic (partitions partitions) and dead-letter topic created.
func Start(t testing.TB, partitions int32, opts ...Option) *Broker {
	t.Helper()
	o := topics{partitions: partitions, configs: map[string]string{}, dlqConfig: map[string]string{}}
	for _, opt := range opts {
		opt(&o)
	}
	kind, addrs := Choose()
	b := &Broker{Kind: kind}
	b.name(t)
	switch kind {
	case Kfake:
		b.dev = startEmbedded(t, embeddedkafka.Options{})
		b.Addrs = []string{b.dev.Addr()}
	case Apache:
		c := sharedApache(t)
		b.Addrs = c.cluster.Addrs()
	case External:
		b.Addrs = addrs
	}
	b.admin = b.Addrs
	b.createTopics(t, o)
	return b
}

// StartSecure is Start for a broker that speaks TLS and/or requires SASL on
// listener l; mechanism names the SASL mechanism. Creds hold what a client
// must present. On an external cluster, whose credentials the tests do not
// know, the test is skipped.
func StartSecure(t testing.TB, l apachekafka.Listener, mechanism string, partitions int32, opts ...Option) *Broker {
	t.Helper()
	o := topics{partitions: partitions, configs: map[string]string{}, dlqConfig: map[string]string{}}
	for _, opt := range opts {
		opt(&o)
	}
	kind, _ := Choose()
	b := &Broker{Kind: kind}
	b.name(t)
	switch kind {
	case Kfake:
		pki, err := testpki.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		b.Creds = Creds{Listener: l, Mechanism: mechanism, CAFile: pki.CAFile, CertFile: pki.CertFile, KeyFile: pki.KeyFile,
			User: "billing", Password: "sasl-" + randomHex(8)}
		opts := embeddedkafka.Options{}
		if l == apachekafka.MutualTLS || l == apachekafka.SASLOverTLS {
			opts.TLS = pki.ServerTLS(l == apachekafka.MutualTLS)
		}
		if l == apachekafka.SASLOverTLS || l == apachekafka.SASLPlaintext {
			opts.SASL = []embeddedkafka.User{{Mechanism: mechanism, Name: b.Creds.User, Password: b.Creds.Password}}
		}
		b.dev = startEmbedded(t, opts)
		b.Addrs = []string{b.dev.Addr()}
		// The embedded broker has one listener: topics are created in
		// process, not through the admin API.
		b.createEmbedded(t, o)
		return b
	case Apache:
		c := sharedApache(t)
		b.Creds = Creds{Listener: l, Mechanism: mechanism, CAFile: c.pki.CAFile, CertFile: c.pki.CertFile, KeyFile: c.pki.KeyFile,
			User: c.user, Password: c.password}
		b.Addrs = c.cluster.AddrsOf(l)
		b.admin = c.cluster.Addrs()
	default:
		t.Skipf("KAFKA_TEST_BROKER=%s: the credentials of an external cluster's secured listeners are unknown to the tests", os.Getenv("KAFKA_TEST_BROKER"))
	}
	b.createTopics(t, o)
	return b
}

// Admin returns a cluster admin of b, closed when the test ends. On Apache
// Kafka it connects to the plaintext listener, whose principal
// (User:ANONYMOUS) is a super user: the test's own admin work, never
// billing's.
func (b *Broker) Admin(t testing.TB) sarama.ClusterAdmin {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(b.admin, config())
	if err != nil {
		t.Fatalf("kafka admin of %v: %v", b.admin, err)
	}
	t.Cleanup(func() { admin.Close() })
	return admin
}

// AddSCRAMUser creates a SCRAM user on b (Apache Kafka from StartSecure)
// with a random password, and returns b's credentials for it. On a cluster
// that authorizes requests it may do nothing until ACLs allow it.
func (b *Broker) AddSCRAMUser(t testing.TB, name string) Creds {
	t.Helper()
	if b.Kind != Apache || b.Creds.Listener == apachekafka.Plaintext {
		t.Fatalf("AddSCRAMUser needs a secured Apache Kafka broker (StartSecure); this one is %s", b.Kind)
	}
	password := "scram-" + randomHex(12)
	if err := sharedApache(t).cluster.SetSCRAM(name, password); err != nil {
		t.Fatal(err)
	}
	c := b.Creds
	c.User, c.Password = name, password
	return c
}

// name gives b a topic, dead-letter topic and group of the test's own.
func (b *Broker) name(t testing.TB) {
	slug := strings.Trim(nonTopicChars.ReplaceAllString(t.Name(), "-"), "-")
	if len(slug) > 80 {
		slug = slug[:80]
	}
	suffix := slug + "." + randomHex(3)
	b.Topic = Topic + "." + suffix
	b.DLQTopic = b.Topic + ".dlq"
	b.OutcomeTopic = OutcomeTopic + "." + suffix
	b.Group = Group + "." + suffix
}

var nonTopicChars = regexp.MustCompile(`[^a-zA-Z0-9._-]+`)

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func startEmbedded(t testing.TB, opts embeddedkafka.Options) *embeddedkafka.Broker {
	t.Helper()
	d, err := embeddedkafka.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

func (b *Broker) createEmbedded(t testing.TB, o topics) {
	t.Helper()
	if err := b.dev.CreateTopic(b.Topic, o.partitions, o.configs); err != nil {
		t.Fatal(err)
	}
	if err := b.dev.CreateTopic(b.DLQTopic, o.partitions, o.dlqConfig); err != nil {
		t.Fatal(err)
	}
	if err := b.dev.CreateTopic(b.OutcomeTopic, o.partitions, nil); err != nil {
		t.Fatal(err)
	}
}

// CreateTopic creates one more topic on b (the embedded broker in process,
// the others through the admin API) and waits until every partition has a
// leader. On a shared cluster it is deleted when the test ends.
func (b *Broker) CreateTopic(t testing.TB, name string, partitions int32, configs map[string]string) {
	t.Helper()
	if b.dev != nil {
		if err := b.dev.CreateTopic(name, partitions, configs); err != nil {
			t.Fatal(err)
		}
		return
	}
	cfg := config()
	admin, err := sarama.NewClusterAdmin(b.admin, cfg)
	if err != nil {
		t.Fatalf("kafka admin of %v: %v", b.admin, err)
	}
	defer admin.Close()
	brokers, _, err := admin.DescribeCluster()
	if err != nil {
		t.Fatalf("describe cluster: %v", err)
	}
	entries := map[string]*string{}
	for k, v := range configs {
		entries[k] = &v
	}
	detail := &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: int16(min(3, len(brokers))), ConfigEntries: entries}
	if err := admin.CreateTopic(name, detail, false); err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
	t.Cleanup(func() {
		admin, err := sarama.NewClusterAdmin(b.admin, config())
		if err != nil {
			return
		}
		defer admin.Close()
		_ = admin.DeleteTopic(name)
	})
	waitLeaders(t, b.admin, name, partitions)
}

func (b *Broker) createTopics(t testing.TB, o topics) {
	t.Helper()
	if b.dev != nil {
		b.createEmbedded(t, o)
		return
	}
	b.CreateTopic(t, b.Topic, o.partitions, o.configs)
	b.CreateTopic(t, b.DLQTopic, o.partitions, o.dlqConfig)
	b.CreateTopic(t, b.OutcomeTopic, o.partitions, nil)
}

// waitLeaders waits until topic's metadata shows partitions partitions,
// each with a leader: a new topic's metadata reaches the brokers shortly
// after CreateTopic returns.
func waitLeaders(t testing.TB, addrs []string, topic string, partitions int32) {
	t.Helper()
	client, err := sarama.NewClient(addrs, config())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := client.RefreshMetadata(topic)
		var parts []int32
		if err == nil {
			parts, err = client.Partitions(topic)
		}
		if err == nil && int32(len(parts)) == partitions {
			led := 0
			for _, p := range parts {
				if l, err := client.Leader(topic, p); err == nil && l != nil {
					led++
				}
			}
			if led == len(parts) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("topic %s: partitions without a leader after 30s (%v)", topic, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Choose returns the kind of broker KAFKA_TEST_BROKER asks for and, for an
// external one, its addresses. Unset, it is Apache where Java and Maven are
// on PATH, else Kfake, said once on stderr; under CI=true it is always
// Apache, so that a machine that cannot run it fails rather than skips.
func Choose() (kind string, addrs []string) {
	switch v := strings.TrimSpace(os.Getenv("KAFKA_TEST_BROKER")); {
	case v == Kfake:
		return Kfake, nil
	case v == Apache:
		return Apache, nil
	case strings.Contains(v, ":"):
		return External, strings.Split(v, ",")
	case v != "":
		fmt.Fprintf(os.Stderr, "kafkatest: KAFKA_TEST_BROKER=%q is not kfake, apache or host:port\n", v)
		os.Exit(2)
	}
	if os.Getenv("CI") == "true" {
		return Apache, nil
	}
	if err := apachekafka.Available(); err != nil {
		fallbackOnce.Do(func() {
			fmt.Fprintf(os.Stderr, "kafkatest: %v: the tests use the embedded kfake broker (KAFKA_TEST_BROKER=apache to insist)\n", err)
		})
		return Kfake, nil
	}
	return Apache, nil
}

var fallbackOnce sync.Once

// apacheCluster is the Apache Kafka cluster shared by one test binary.
type apacheCluster struct {
	cluster        *apachekafka.Cluster
	dir            string
	pki            *testpki.PKI
	user, password string
}

var shared struct {
	once sync.Once
	c    *apacheCluster
	err  error
}

// sharedApache starts this test binary's Apache Kafka cluster on first use
// and fails t when it cannot.
func sharedApache(t testing.TB) *apacheCluster {
	t.Helper()
	shared.once.Do(func() { shared.c, shared.err = startApache() })
	if shared.err != nil {
		t.Fatalf("Apache Kafka (KAFKA_TEST_BROKER=kfake runs on the embedded broker instead): %v", shared.err)
	}
	c := shared.c
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Apache Kafka's logs (in %s):\n%s", c.dir, c.cluster.LogTail(30))
		}
	})
	return c
}

func startApache() (*apacheCluster, error) {
	started := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	jars, err := apachekafka.PinnedJars(ctx)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "billing-kafka-")
	if err != nil {
		return nil, err
	}
	pki, err := testpki.New(dir)
	if err != nil {
		return nil, err
	}
	c := &apacheCluster{dir: dir, pki: pki, user: "billing", password: "sasl-" + randomHex(8)}
	c.cluster, err = apachekafka.Start(ctx, apachekafka.Options{
		Nodes: 1, Dir: dir, Jars: jars,
		// The authorizer is on, as on a production cluster: the tests'
		// own users (SASL "billing", the client certificate's CN=billing)
		// are super users like the plaintext listener's ANONYMOUS, and a
		// test that wants a principal with exactly billing's ACLs makes
		// one (AddSCRAMUser) and grants them.
		Security: &apachekafka.Security{CAFile: pki.CAFile, CertFile: pki.ServerCertFile, KeyFile: pki.ServerKeyFile,
			User: c.user, Password: c.password,
			Authorizer: true, SuperUsers: []string{"User:" + c.user, "User:CN=billing"}},
	})
	if err != nil {
		return nil, fmt.Errorf("%w (files in %s)", err, dir)
	}
	fmt.Fprintf(os.Stderr, "kafkatest: Apache Kafka (1 node, KRaft) on %s, started in %s; files in %s\n",
		strings.Join(c.cluster.Addrs(), ","), time.Since(started).Round(100*time.Millisecond), dir)
	return c, nil
}

// Main runs a package's tests and then stops the Apache Kafka cluster they
// shared, if they started one. Its files are removed unless a test failed.
// Use it from TestMain: `func TestMain(m *testing.M) { kafkatest.Main(m) }`;
// m may also be another package's wrapper of *testing.M
// (dbtest.WithServer).
func Main(m interface{ Run() int }) {
	code := m.Run()
	if c := shared.c; c != nil {
		c.cluster.Close()
		if code == 0 {
			os.RemoveAll(c.dir)
		} else {
			fmt.Fprintf(os.Stderr, "kafkatest: Apache Kafka's files and logs kept in %s\n", c.dir)
		}
	}
	os.Exit(code)
}

// Grant allows principal acls, from any host, with the admin API (an
// admin of b's plaintext listener, as Admin returns). ACLs reach the
// brokers' authorizers a moment after it returns.
func Grant(admin sarama.ClusterAdmin, principal string, acls ...kafkaacl.ACL) error {
	var bindings []*sarama.ResourceAcls
	for _, a := range acls {
		bindings = append(bindings, &sarama.ResourceAcls{
			Resource: sarama.Resource{ResourceType: a.Resource, ResourceName: a.Name, ResourcePatternType: a.Pattern},
			Acls:     []*sarama.Acl{{Principal: principal, Host: "*", Operation: a.Operation, PermissionType: sarama.AclPermissionAllow}},
		})
	}
	if err := admin.CreateACLs(bindings); err != nil {
		return fmt.Errorf("grant %s its ACLs: %w", principal, err)
	}
	return nil
}
