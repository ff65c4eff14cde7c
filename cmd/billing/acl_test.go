package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"

	"example.com/billing/internal/config"
	"example.com/billing/internal/dlq"
	"example.com/billing/internal/dlq/reason"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/kafkaacl"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/outbox"
	"example.com/billing/internal/testenv/apachekafka"
	"example.com/billing/internal/testenv/kafkatest"
	"example.com/billing/internal/testenv/wait"
)

// The ACLs of docs/deployment.md (kafkaacl.Serve, ReplayACLs, ProduceACLs)
// are exactly what each command needs, on Apache Kafka with its authorizer
// on and allow.everyone.if.no.acl.found=false: with them each command does
// its whole job, over SASL_SSL with SCRAM-SHA-512 as a user that has
// nothing else; without any one of them it stops before it takes, writes
// or commits anything, names the missing permission (resource and
// operation), and is not ready; and once the permission is granted again
// nothing was lost. The sub-tests share one node (the package's) and change
// the ACLs with the admin API between them.
func TestACLs_EachCommandNeedsExactlyItsList(t *testing.T) {
	// The order topic takes 1 MiB, the dead-letter topic 64 KiB: a large
	// invalid value is parked as a reference, which only a replay that may
	// read the order topic can resolve.
	h := newSecureHarness(t, apachekafka.SASLOverTLS, "SCRAM-SHA-512", kafkatest.DLQConfig(map[string]string{"max.message.bytes": "65536"}))
	if h.broker.Kind != kafkatest.Apache {
		t.Skipf("needs Apache Kafka's authorizer; %s authorizes nothing", h.broker.Kind)
	}
	a := &aclFixture{h: h, admin: h.broker.Admin(t)}

	// What serve parks and what the replay brings back.
	big := jsonOf(400_000, true)
	h.publish(0, "bad", []byte("{oops"))
	h.publish(0, "big", big)

	t.Run("serve", func(t *testing.T) { a.serve(t) })
	t.Run("dlq replay", func(t *testing.T) { a.replay(t, big) })
	t.Run("produce", func(t *testing.T) { a.produce(t) })
}

// aclFixture changes one user's ACLs on the test's broker.
type aclFixture struct {
	h     *harness
	admin sarama.ClusterAdmin
}

// user creates a SCRAM user, grants it acls and returns its Kafka
// environment and a client of its own for watching its permissions.
func (a *aclFixture) user(t *testing.T, name string, acls []kafkaacl.ACL) (map[string]string, sarama.Client) {
	t.Helper()
	creds := a.h.broker.AddSCRAMUser(t, name+"-"+a.h.broker.Group[len(a.h.broker.Group)-6:])
	env := a.h.broker.Env()
	maps.Copy(env, creds.Env())
	var k config.Kafka
	if err := config.Load(env, &k); err != nil {
		t.Fatal(err)
	}
	cfg, err := kafka.NewConfig(k)
	if err != nil {
		t.Fatal(err)
	}
	var client sarama.Client
	// A new SCRAM user can log in once the broker applied it.
	wait.For(t, 10*time.Second, "a SASL login of "+creds.User, func() bool {
		client, err = sarama.NewClient(k.Brokers, cfg)
		return err == nil
	})
	t.Cleanup(func() { client.Close() })
	for _, acl := range acls {
		a.grant(t, creds.User, acl)
	}
	a.effective(t, client, acls, nil)
	return env, client
}

func (a *aclFixture) grant(t *testing.T, user string, acl kafkaacl.ACL) {
	t.Helper()
	if err := kafkatest.Grant(a.admin, "User:"+user, acl); err != nil {
		t.Fatal(err)
	}
}

func (a *aclFixture) revoke(t *testing.T, user string, acl kafkaacl.ACL) {
	t.Helper()
	principal, host := "User:"+user, "*"
	deleted, err := a.admin.DeleteACL(sarama.AclFilter{ResourceType: acl.Resource, ResourceName: &acl.Name,
		ResourcePatternTypeFilter: acl.Pattern, Principal: &principal, Host: &host,
		Operation: acl.Operation, PermissionType: sarama.AclPermissionAllow}, false)
	if err != nil || len(deleted) != 1 {
		t.Fatalf("revoke %s: %d deleted, %v", acl, len(deleted), err)
	}
}

// revokeForTest revokes acl of user until the test ends, when it grants it
// again, and waits each time until the broker applied it.
func (a *aclFixture) revokeForTest(t *testing.T, user string, client sarama.Client, acls []kafkaacl.ACL, acl kafkaacl.ACL) {
	t.Helper()
	a.revoke(t, user, acl)
	t.Cleanup(func() {
		a.grant(t, user, acl)
		a.effective(t, client, acls, nil)
	})
	a.effective(t, client, acls, []kafkaacl.ACL{acl})
}

// effective waits until the broker answers that the user lacks exactly
// missing of acls: ACLs reach the authorizer a moment after the admin call.
func (a *aclFixture) effective(t *testing.T, client sarama.Client, acls, missing []kafkaacl.ACL) {
	t.Helper()
	wait.For(t, 10*time.Second, "the broker to apply the ACL change", func() bool {
		got, err := kafkaacl.Missing(client, acls)
		return err == nil && slices.Equal(got, missing)
	})
}

// userOf is the SASL user of env.
func userOf(env map[string]string) string { return env["KAFKA_SASL_USERNAME"] }

func (a *aclFixture) serve(t *testing.T) {
	h := a.h
	var k config.Kafka
	if err := config.Load(h.broker.Env(), &k); err != nil {
		t.Fatal(err)
	}
	acls := kafkaacl.Serve(k)
	userEnv, client := a.user(t, "billing", acls)
	env := h.environWith(userEnv)

	// With exactly its ACLs: charged, dead-lettered (whole and as a
	// reference) and announced on the outcome topic.
	ev, value := event(t, 1, 1000, "EUR")
	h.publish(0, "1", value)
	s := h.serve(env)
	h.waitCaughtUp()
	parked := kafkatest.ReadAll(t, h.client, h.broker.DLQTopic)
	if len(parked) != 2 || !strings.HasPrefix(kafkatest.Header(parked[1], dlq.HeaderReason), "oversize: ") {
		t.Fatalf("dead-letter topic holds %d messages, want the invalid one whole and the large one as a reference", len(parked))
	}
	wait.For(t, 20*time.Second, "the outcome event of order 1", func() bool { return h.published() == 1 })
	if out := kafkatest.ReadAll(t, h.client, h.broker.OutcomeTopic); len(out) != 1 || !bytes.Contains(out[0].Value, []byte(outbox.Succeeded)) ||
		!bytes.Contains(out[0].Value, []byte(ev.ID.String())) {
		t.Fatalf("outcome topic holds %d events, want the payment.succeeded.v1 of order 1", len(out))
	}
	s.stop(t)

	// Without any one of them: not ready, the permission named, nothing
	// consumed or committed while an event waits.
	for i, acl := range acls {
		t.Run(acl.String(), func(t *testing.T) {
			a.revokeForTest(t, userOf(env), client, acls, acl)
			_, value := event(t, int64(10+i), 1000, "EUR")
			h.publish(0, strconv.Itoa(10+i), value)
			before := kafkatest.Committed(t, h.client, h.broker.Group, h.broker.Topic)
			requests := h.psp.Stats().Requests

			env := h.environWith(env, "HTTP_ADDR", freeAddr(t))
			b := startServe(t, env)
			wantMissing := []string{"consumer group session", "kafka ACL: " + acl.String()}
			wait.For(t, 20*time.Second, "/readyz naming "+acl.String(), func() bool {
				code, body := get(env["HTTP_ADDR"], "/readyz")
				return code == http.StatusServiceUnavailable && slices.Equal(readyzMissing(t, body), wantMissing)
			})
			wait.For(t, 10*time.Second, "an error log naming "+acl.String(), func() bool {
				return slices.Equal(missingLogged(t, b.logs.String()), []string{acl.Explain()})
			})
			staysUnreadyNaming(t, env["HTTP_ADDR"], wantMissing, time.Second)
			b.stop(t)
			if got := kafkatest.Committed(t, h.client, h.broker.Group, h.broker.Topic); !maps.Equal(got, before) {
				t.Errorf("committed offsets moved from %v to %v without %s", before, got, acl)
			}
			if got := h.psp.Stats().Requests; got != requests {
				t.Errorf("the provider got %d requests without %s", got-requests, acl)
			}
			if n := groupMembers(t, h); n != 0 {
				t.Errorf("the group has %d members without %s", n, acl)
			}
			// Not only the check at start: the very call serve makes
			// with this permission is refused without it.
			if err := callNeeding(t, env, client, acl); !isDenied(err) {
				t.Errorf("without %s, serve's call that needs it returned %v, want an authorization error", acl, err)
			}
		})
	}

	// Revoked while serving: the first use fails, names the permission
	// and holds the message; granted again, it goes through.
	t.Run("Write on the dead-letter topic revoked while serving", func(t *testing.T) {
		s := h.serve(h.environWith(env, "HTTP_ADDR", freeAddr(t)))
		h.waitCaughtUp() // the events of the sub-tests above, each charged now
		dlqWrite := acls[3]
		if dlqWrite.Name != h.broker.DLQTopic || dlqWrite.Resource != sarama.AclResourceTopic || dlqWrite.Operation != sarama.AclOperationWrite {
			t.Fatalf("acls[3] is %s, not Write on the dead-letter topic", dlqWrite)
		}
		a.revoke(t, userOf(env), dlqWrite)
		a.effective(t, client, acls, []kafkaacl.ACL{dlqWrite})
		end := kafkatest.EndOffsets(t, h.client, h.broker.Topic)[0]
		h.publish(0, "bad-2", []byte("{not json"))
		_, value := event(t, 20, 1000, "EUR")
		h.publish(0, "20", value)
		s.waitLog(t, "(missing ACL: "+dlqWrite.String()+")")
		wait.For(t, 20*time.Second, "order 20, behind the held message, charged", func() bool {
			return h.count(`SELECT count(*) FROM charge WHERE order_id = 20 AND status = 'succeeded'`) == 1
		})
		if got := kafkatest.Committed(t, h.client, h.broker.Group, h.broker.Topic)[0]; got > end {
			t.Fatalf("committed offset %d passed the message that could not be parked (offset %d)", got, end)
		}
		a.grant(t, userOf(env), dlqWrite)
		h.waitCaughtUp()
		s.stop(t)
	})

	// Nothing was lost: every event published while a permission was
	// missing was charged once afterwards.
	for i := range acls {
		if got := h.count(`SELECT count(*) FROM charge WHERE order_id = $1 AND status = 'succeeded'`, 10+i); got != 1 {
			t.Errorf("order %d, published while %s was missing: %d succeeded charges, want 1", 10+i, acls[i], got)
		}
	}
}

func (a *aclFixture) replay(t *testing.T, big []byte) {
	h := a.h
	var k config.Kafka
	if err := config.Load(h.broker.Env(), &k); err != nil {
		t.Fatal(err)
	}
	group := kafkaacl.ReplayGroupPrefix(k)
	acls := kafkaacl.Replay(k, group)
	env, client := a.user(t, "billing-dlq-replay", acls)
	env["DATABASE_URL"] = h.dsn // where the replay records who ordered it
	topicEnd := kafkatest.EndOffsets(t, h.client, h.broker.Topic)

	for _, acl := range acls {
		t.Run(acl.String(), func(t *testing.T) {
			a.revokeForTest(t, userOf(env), client, acls, acl)
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), []string{"billing", "dlq", "replay", "--reason", "a test replays"}, env, nil, &stdout, &stderr)
			var missing *kafkaacl.MissingError
			if err == nil || !strings.Contains(err.Error(), acl.Explain()) || !errors.As(err, &missing) || !slices.Equal(missing.Missing, []kafkaacl.ACL{acl}) {
				t.Fatalf("dlq replay without %s returned %v, want an error naming it alone", acl, err)
			}
			if got := kafkatest.EndOffsets(t, h.client, h.broker.Topic); !maps.Equal(got, topicEnd) {
				t.Errorf("order topic's end offsets moved from %v to %v", topicEnd, got)
			}
			if got := kafkatest.Committed(t, h.client, group, h.broker.DLQTopic); got[0] != -1 {
				t.Errorf("replay group committed %v", got)
			}
			if err := callNeeding(t, env, client, acl); !isDenied(err) {
				t.Errorf("without %s, the replay's call that needs it returned %v, want an authorization error", acl, err)
			}
		})
	}

	// With exactly its ACLs: every parked message back on the order topic,
	// the reference as its whole original.
	parked := len(kafkatest.ReadAll(t, h.client, h.broker.DLQTopic))
	if out := dlqReplay(t, env); !strings.Contains(out, fmt.Sprintf("replayed %d,", parked)) {
		t.Fatalf("replay output lacks 'replayed %d,':\n%s", parked, out)
	}
	replayed := 0
	for _, m := range kafkatest.ReadAll(t, h.client, h.broker.Topic) {
		if kafkatest.Header(m, dlq.HeaderReplayedFrom) != "" && bytes.Equal(m.Value, big) {
			replayed++
		}
	}
	if replayed != 1 {
		t.Errorf("the order topic holds %d replayed copies of the reference's original, want 1", replayed)
	}
}

func (a *aclFixture) produce(t *testing.T) {
	needsDeveloperBuild(t, "produce")
	h := a.h
	var k config.Kafka
	if err := config.Load(h.broker.Env(), &k); err != nil {
		t.Fatal(err)
	}
	acls := kafkaacl.Produce(k)
	env, client := a.user(t, "billing-produce", acls)
	end := kafkatest.EndOffsets(t, h.client, h.broker.Topic)[0]
	args := []string{"billing", "produce", "--count", "3", "--first-order", "900"}

	a.revoke(t, userOf(env), acls[0])
	a.effective(t, client, acls, acls)
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), args, env, nil, &stdout, &stderr); err == nil || !strings.Contains(err.Error(), acls[0].Explain()) {
		t.Fatalf("produce without %s returned %v, want an error naming it", acls[0], err)
	}
	if got := kafkatest.EndOffsets(t, h.client, h.broker.Topic)[0]; got != end {
		t.Fatalf("produce without its ACL wrote %d messages", got-end)
	}
	a.grant(t, userOf(env), acls[0])
	a.effective(t, client, acls, nil)
	if err := run(context.Background(), args, env, nil, &stdout, &stderr); err != nil {
		t.Fatalf("produce with its ACL: %v\n%s", err, stderr.String())
	}
	if got := kafkatest.EndOffsets(t, h.client, h.broker.Topic)[0]; got != end+3 {
		t.Fatalf("produce with its ACL wrote %d messages, want 3", got-end)
	}
}

// callNeeding makes, as the user of client (with env's settings), the call
// of billing that needs acl (see kafkaacl.Serve and ReplayACLs), with
// billing's own code where it has one, and returns its error.
func callNeeding(t *testing.T, env map[string]string, client sarama.Client, acl kafkaacl.ACL) error {
	t.Helper()
	var k config.Kafka
	if err := config.Load(env, &k); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	switch {
	case acl.Operation == sarama.AclOperationDescribeConfigs:
		// Not closed: that would close the client.
		admin, err := sarama.NewClusterAdminFromClient(client)
		if err != nil {
			t.Fatal(err)
		}
		_, err = kafka.DescribeTopic(admin, acl.Name)
		return err
	case acl.Resource == sarama.AclResourceGroup:
		group, err := sarama.NewConsumerGroupFromClient(acl.Instance, client)
		if err != nil {
			t.Fatal(err)
		}
		defer group.Close()
		return group.Consume(ctx, []string{k.Topic}, nopHandler{})
	case acl.Operation == sarama.AclOperationRead:
		return fetchFirst(ctx, t, k, acl.Name)
	}
	// Write: billing's idempotent producer, which asks for a producer id
	// (refused when the principal may write no topic at all) and sends.
	cfg, err := kafka.ProducerConfig(k)
	if err != nil {
		t.Fatal(err)
	}
	p, err := sarama.NewSyncProducer(k.Brokers, cfg)
	if err != nil {
		return err
	}
	if acl.Name == k.DLQTopic {
		w := dlq.NewWriter(p, k.DLQTopic, k.GroupID, 0, metrics.New(prometheus.NewRegistry()))
		defer w.Close() // and its producer
		_, err := w.Park(&sarama.ConsumerMessage{Topic: k.Topic, Value: []byte("{oops")}, reason.Reason{Code: reason.InvalidEvent, Detail: "test"})
		return err
	}
	defer p.Close()
	_, _, err = p.SendMessage(&sarama.ProducerMessage{Topic: acl.Name, Value: sarama.StringEncoder("{}")})
	return err
}

// fetchFirst fetches the first message of partition 0 of topic, with k's
// settings and fetch errors returned, as serve's consumer and the replay's
// reading of a reference's original do.
func fetchFirst(ctx context.Context, t *testing.T, k config.Kafka, topic string) error {
	t.Helper()
	cfg, err := kafka.NewConfig(k)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Consumer.Return.Errors = true
	consumer, err := sarama.NewConsumer(k.Brokers, cfg)
	if err != nil {
		return err
	}
	defer consumer.Close()
	pc, err := consumer.ConsumePartition(topic, 0, sarama.OffsetOldest)
	if err != nil {
		return err
	}
	defer pc.Close()
	select {
	case <-pc.Messages():
		return nil
	case err := <-pc.Errors():
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// isDenied reports whether err is a broker's refusal for lack of a
// permission. Cluster authorization is among them: an idempotent producer
// whose principal may write no topic at all is refused its producer id.
func isDenied(err error) bool {
	return errors.Is(err, sarama.ErrTopicAuthorizationFailed) || errors.Is(err, sarama.ErrGroupAuthorizationFailed) ||
		errors.Is(err, sarama.ErrClusterAuthorizationFailed)
}

type nopHandler struct{}

func (nopHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (nopHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (nopHandler) ConsumeClaim(sarama.ConsumerGroupSession, sarama.ConsumerGroupClaim) error {
	return nil
}

// readyzMissing is the "missing" list of a /readyz body.
func readyzMissing(t *testing.T, body string) []string {
	t.Helper()
	var b struct {
		Missing []string `json:"missing"`
	}
	if err := json.Unmarshal([]byte(body), &b); err != nil {
		t.Fatalf("/readyz body %q: %v", body, err)
	}
	return b.Missing
}

// missingLogged is the "missing" list of the last "kafka ACLs missing" log
// line of serve's JSON logs.
func missingLogged(t *testing.T, logs string) []string {
	t.Helper()
	var last []string
	for _, line := range strings.Split(logs, "\n") {
		var l struct {
			Msg     string   `json:"msg"`
			Missing []string `json:"missing"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && strings.HasPrefix(l.Msg, "kafka ACLs missing") {
			last = l.Missing
		}
	}
	return last
}

// staysUnreadyNaming requires /readyz to answer 503 with exactly missing
// for the whole of d.
func staysUnreadyNaming(t *testing.T, addr string, missing []string, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		code, body := get(addr, "/readyz")
		if code != http.StatusServiceUnavailable || !slices.Equal(readyzMissing(t, body), missing) {
			t.Fatalf("/readyz = %d %s, want 503 missing %q", code, body, missing)
		}
	}
}
