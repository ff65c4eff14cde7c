package kafkaacl_test

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"example.com/billing/internal/config"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/kafkaacl"
	"example.com/billing/internal/testenv/apachekafka"
	"example.com/billing/internal/testenv/kafkatest"
	"example.com/billing/internal/testenv/wait"
)

// TestMain stops the Apache Kafka cluster the tests shared, if they
// started one (see kafkatest.Start).
func TestMain(m *testing.M) { kafkatest.Main(m) }

// Missing tells, for a principal of an authorizing cluster, exactly the
// permissions of a list it lacks: all of them for a user without any ACL,
// then one fewer for every ACL granted, none at the end. It names a group
// nobody has joined yet, as serve's group is before its first start.
func TestMissing_NamesWhatThePrincipalLacks(t *testing.T) {
	b := kafkatest.StartSecure(t, apachekafka.SASLOverTLS, "SCRAM-SHA-512", 1)
	if b.Kind != kafkatest.Apache {
		t.Skipf("on %s nothing authorizes requests: every ACL is there", b.Kind)
	}
	creds := b.AddSCRAMUser(t, "acl-probe-"+b.Group[len(b.Group)-6:])
	env := b.Env()
	maps.Copy(env, creds.Env())
	var k config.Kafka
	if err := config.Load(env, &k); err != nil {
		t.Fatal(err)
	}
	acls := kafkaacl.Serve(k)
	admin := b.Admin(t)

	client := clientOf(t, k)
	missing := func() []string {
		m, err := kafkaacl.Missing(client, acls)
		if err != nil {
			t.Fatalf("Missing: %v", err)
		}
		var names []string
		for _, a := range m {
			names = append(names, a.String())
		}
		return names
	}
	var want []string
	for _, a := range acls {
		want = append(want, a.String())
	}
	if got := missing(); !slices.Equal(got, want) {
		t.Fatalf("a user without ACLs misses %q, want all of %q", got, want)
	}
	for i, a := range acls {
		if err := kafkatest.Grant(admin, "User:"+creds.User, a); err != nil {
			t.Fatal(err)
		}
		// An ACL reaches the brokers' authorizers through the metadata
		// log, a moment after CreateACLs answers.
		wait.For(t, 10*time.Second, "granted "+a.String(), func() bool { return slices.Equal(missing(), want[i+1:]) })
	}
}

// clientOf connects as billing's code does from k.
func clientOf(t *testing.T, k config.Kafka) sarama.Client {
	t.Helper()
	cfg, err := kafka.NewConfig(k)
	if err != nil {
		t.Fatal(err)
	}
	var client sarama.Client
	// A new SCRAM user is known to the brokers a moment after it is made.
	wait.For(t, 10*time.Second, "a SASL login of the new user", func() bool {
		client, err = sarama.NewClient(k.Brokers, cfg)
		return err == nil
	})
	t.Cleanup(func() { client.Close() })
	return client
}

// The group's coordinator moved (its broker was restarted or failed over):
// the broker the client remembered refuses the question, and the next
// question, as serve's retries ask it, goes to the coordinator found anew
// instead of being refused forever.
func TestMissing_FindsTheGroupsCoordinatorAgainOnceItMoved(t *testing.T) {
	t.Parallel()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders.confirmed"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	var k config.Kafka
	if err := config.Load(map[string]string{"KAFKA_BROKERS": strings.Join(cluster.ListenAddrs(), ",")}, &k); err != nil {
		t.Fatal(err)
	}
	var acls []kafkaacl.ACL
	for _, a := range kafkaacl.Serve(k) {
		if a.Resource == sarama.AclResourceGroup {
			acls = append(acls, a)
		}
	}
	client := clientOf(t, k)
	if _, err := kafkaacl.Missing(client, acls); err != nil { // the client now knows the coordinator
		t.Fatal(err)
	}

	var mu sync.Mutex
	askedAgain := false
	cluster.ControlKey(int16(kmsg.FindCoordinator), func(kmsg.Request) (kmsg.Response, error, bool) {
		mu.Lock()
		defer mu.Unlock()
		askedAgain = true
		return nil, nil, false // observed, answered as usual
	})
	cluster.ControlKey(int16(kmsg.DescribeGroups), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		mu.Lock()
		defer mu.Unlock()
		if askedAgain {
			return nil, nil, false // asked of the coordinator found anew: answered
		}
		r := req.(*kmsg.DescribeGroupsRequest)
		resp := r.ResponseKind().(*kmsg.DescribeGroupsResponse)
		for _, g := range r.Groups {
			rg := kmsg.NewDescribeGroupsResponseGroup()
			rg.Group, rg.ErrorCode = g, kerr.NotCoordinator.Code
			resp.Groups = append(resp.Groups, rg)
		}
		return resp, nil, true
	})

	if _, err := kafkaacl.Missing(client, acls); !errors.Is(err, sarama.ErrNotCoordinatorForConsumer) {
		t.Fatalf("asked right after the move: %v, want the refusal of a broker that is no longer the coordinator", err)
	}
	if missing, err := kafkaacl.Missing(client, acls); err != nil || len(missing) != 0 {
		t.Fatalf("asked again: %v, %v; want the answer of the new coordinator", missing, err)
	}
}
