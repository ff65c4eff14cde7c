package check

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"example.com/billing/internal/config"
	"example.com/billing/internal/kafkaacl"
)

// Strimzi's KafkaTopic and KafkaUser (kafka.strimzi.io/v1beta2) are not in
// k8s.io/api, and Strimzi publishes no Go types for them. These structs
// hold the fields of the CRDs' schemas that deploy/strimzi can use, so
// that the strict decode of decodeStrict fails on a misspelt or misplaced
// field as the API server's schema validation would. What the schema
// requires or restricts to a set of values is checked below.

type kafkaTopic struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		TopicName  string         `json:"topicName,omitempty"`
		Partitions int32          `json:"partitions"`
		Replicas   int32          `json:"replicas"`
		Config     map[string]any `json:"config,omitempty"`
	} `json:"spec"`
}

type kafkaUser struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Authentication struct {
			Type     string `json:"type"` // tls, tls-external, scram-sha-512
			Password *struct {
				ValueFrom struct {
					SecretKeyRef *corev1.SecretKeySelector `json:"secretKeyRef"`
				} `json:"valueFrom"`
			} `json:"password,omitempty"`
		} `json:"authentication"`
		Authorization struct {
			Type string       `json:"type"` // simple
			ACLs []strimziACL `json:"acls"`
		} `json:"authorization"`
		Quotas map[string]any `json:"quotas,omitempty"`
	} `json:"spec"`
}

type strimziACL struct {
	Type     string `json:"type,omitempty"` // allow (the default) or deny
	Resource struct {
		Type        string `json:"type"` // topic, group, cluster, transactionalId
		Name        string `json:"name,omitempty"`
		PatternType string `json:"patternType,omitempty"` // literal (the default) or prefix
	} `json:"resource"`
	Host       string   `json:"host,omitempty"`
	Operations []string `json:"operations"`
}

const strimziDir = "deploy/strimzi"

// strimziObjects renders deploy/strimzi with kustomize and returns its
// topics and users, by name.
func strimziObjects(t *testing.T) (map[string]*kafkaTopic, map[string]*kafkaUser) {
	t.Helper()
	r := build(t, strimziDir)
	topics, users := map[string]*kafkaTopic{}, map[string]*kafkaUser{}
	for _, o := range r.objects {
		var meta metav1.Object
		switch o := o.(type) {
		case *kafkaTopic:
			topics[o.Name], meta = o, o
		case *kafkaUser:
			users[o.Name], meta = o, o
		default:
			t.Errorf("%s renders a %T: only KafkaTopics and KafkaUsers belong there", strimziDir, o)
			continue
		}
		// The Topic and User Operators act only on resources labelled with
		// their Kafka cluster.
		if meta.GetLabels()["strimzi.io/cluster"] == "" {
			t.Errorf("%s: %s has no strimzi.io/cluster label", strimziDir, meta.GetName())
		}
	}
	return topics, users
}

// defaultKafka is billing's Kafka configuration with nothing set: the names
// deploy/strimzi must use.
func defaultKafka(t *testing.T) config.Kafka {
	t.Helper()
	var k config.Kafka
	if err := config.Load(map[string]string{}, &k); err != nil {
		t.Fatal(err)
	}
	return k
}

// The topics are billing's (its default names), replicated so that acks=all
// survives a broker, and set as billing's start-up checks require: the order
// topic keeps messages no longer than DEDUP_RETENTION remembers them, and the
// dead-letter topic takes messages as large as the order topic does.
func TestStrimzi_TopicsAreTheOnesBillingUses(t *testing.T) {
	topics, _ := strimziObjects(t)
	k := defaultKafka(t)
	want := []string{k.Topic, k.DLQTopic, k.OutcomeTopic}
	if got := slices.Sorted(maps.Keys(topics)); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Fatalf("%s defines topics %q, want %q", strimziDir, got, want)
	}
	intConfig := func(tp *kafkaTopic, key string) int64 {
		v, ok := tp.Spec.Config[key]
		if !ok {
			t.Errorf("topic %s sets no %s", tp.Name, key)
			return 0
		}
		// YAML numbers arrive as JSON's float64; Strimzi takes strings too.
		switch v := v.(type) {
		case float64:
			if v == float64(int64(v)) {
				return int64(v)
			}
		case string:
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				return n
			}
		}
		t.Errorf("topic %s: %s=%v is not an integer", tp.Name, key, v)
		return 0
	}
	for _, tp := range topics {
		if tp.Spec.TopicName != "" && tp.Spec.TopicName != tp.Name {
			t.Errorf("topic %s is named %s on the broker", tp.Name, tp.Spec.TopicName)
		}
		if tp.Spec.Partitions < 1 || tp.Spec.Replicas < 3 {
			t.Errorf("topic %s: %d partitions, %d replicas; want at least 1 and 3", tp.Name, tp.Spec.Partitions, tp.Spec.Replicas)
		}
		if isr := intConfig(tp, "min.insync.replicas"); isr < 2 || isr >= int64(tp.Spec.Replicas) {
			t.Errorf("topic %s: min.insync.replicas %d with %d replicas; want 2 or more and one broker to spare", tp.Name, isr, tp.Spec.Replicas)
		}
	}
	var serve config.Serve
	if err := config.Load(map[string]string{"DATABASE_URL": "postgres://x@db/billing", "PAYMENT_BASE_URL": "https://psp.example.com"}, &serve); err != nil {
		t.Fatal(err)
	}
	if keep := time.Duration(intConfig(topics[k.Topic], "retention.ms")) * time.Millisecond; keep <= 0 || keep > serve.Dedup.Retention {
		t.Errorf("topic %s keeps messages %s, DEDUP_RETENTION remembers them %s: serve would refuse to start", k.Topic, keep, serve.Dedup.Retention)
	}
	if src, dlq := intConfig(topics[k.Topic], "max.message.bytes"), intConfig(topics[k.DLQTopic], "max.message.bytes"); dlq < src {
		t.Errorf("topic %s takes %d bytes, its dead-letter topic %d: large invalid messages could only be parked as references", k.Topic, src, dlq)
	}
}

// The KafkaUsers authenticate with SCRAM-SHA-512 from a password in a
// Secret, and their ACLs are exactly the ones billing checks at start and
// docs/deployment.md lists: serve's for billing, the replay's (default
// groups) for billing-dlq-replay, explain's for billing-explain; only
// allow rules, from any host.
func TestStrimzi_UsersHaveExactlyBillingsACLs(t *testing.T) {
	_, users := strimziObjects(t)
	k := defaultKafka(t)
	want := map[string][]kafkaacl.ACL{
		"billing":            kafkaacl.Serve(k),
		"billing-dlq-replay": kafkaacl.Replay(k, kafkaacl.ReplayGroupPrefix(k)),
		"billing-explain":    kafkaacl.Explain(k),
	}
	if got := slices.Sorted(maps.Keys(users)); !slices.Equal(got, slices.Sorted(maps.Keys(want))) {
		t.Fatalf("%s defines users %q, want %q", strimziDir, got, slices.Sorted(maps.Keys(want)))
	}
	for name, u := range users {
		auth := u.Spec.Authentication
		if auth.Type != "scram-sha-512" {
			t.Errorf("user %s authenticates with %q, want scram-sha-512", name, auth.Type)
		}
		if auth.Password == nil || auth.Password.ValueFrom.SecretKeyRef == nil ||
			auth.Password.ValueFrom.SecretKeyRef.Name == "" || auth.Password.ValueFrom.SecretKeyRef.Key == "" {
			t.Errorf("user %s: its password must come from a Secret (password.valueFrom.secretKeyRef)", name)
		}
		if u.Spec.Authorization.Type != "simple" {
			t.Errorf("user %s: authorization type %q, want simple", name, u.Spec.Authorization.Type)
		}
		got := strimziACLs(t, name, u.Spec.Authorization.ACLs)
		var exp []string
		for _, a := range want[name] {
			exp = append(exp, aclKey(a.Resource, a.Pattern, a.Name, a.Operation))
		}
		slices.Sort(exp)
		if !slices.Equal(got, exp) {
			t.Errorf("user %s has the ACLs\n  %s\nbilling needs exactly\n  %s", name, strings.Join(got, "\n  "), strings.Join(exp, "\n  "))
		}
	}
}

// strimziACLs flattens a user's rules to one key per operation, sorted,
// failing on what the CRD would refuse or billing never grants.
func strimziACLs(t *testing.T, user string, rules []strimziACL) []string {
	t.Helper()
	var out []string
	for i, r := range rules {
		if r.Type != "" && r.Type != "allow" {
			t.Errorf("user %s, rule %d: type %q; billing's rules only allow", user, i, r.Type)
		}
		if r.Host != "" && r.Host != "*" {
			t.Errorf("user %s, rule %d: host %q; billing's pods have no fixed address", user, i, r.Host)
		}
		var res sarama.AclResourceType
		if err := res.UnmarshalText([]byte(r.Resource.Type)); err != nil || r.Resource.Type != strings.ToLower(r.Resource.Type[:1])+r.Resource.Type[1:] {
			t.Errorf("user %s, rule %d: resource type %q is not one of Strimzi's", user, i, r.Resource.Type)
		}
		pattern := sarama.AclPatternLiteral
		switch r.Resource.PatternType {
		case "", "literal":
		case "prefix":
			pattern = sarama.AclPatternPrefixed
		default:
			t.Errorf("user %s, rule %d: patternType %q, want literal or prefix", user, i, r.Resource.PatternType)
		}
		if len(r.Operations) == 0 {
			t.Errorf("user %s, rule %d: no operations", user, i)
		}
		for _, o := range r.Operations {
			var op sarama.AclOperation
			if err := op.UnmarshalText([]byte(o)); err != nil || op.String() != o {
				t.Errorf("user %s, rule %d: operation %q is not a Kafka ACL operation as Strimzi spells them", user, i, o)
			}
			out = append(out, aclKey(res, pattern, r.Resource.Name, op))
		}
	}
	slices.Sort(out)
	return out
}

func aclKey(res sarama.AclResourceType, pattern sarama.AclResourcePatternType, name string, op sarama.AclOperation) string {
	return fmt.Sprintf("%s on %s %s %s", op.String(), res.String(), pattern.String(), name)
}
