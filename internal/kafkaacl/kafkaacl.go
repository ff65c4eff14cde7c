// Package kafkaacl is what billing's commands need from a Kafka cluster that
// authorizes every request (an authorizer with
// allow.everyone.if.no.acl.found=false): the exact ACLs of each command,
// and a check that asks the brokers which of them the client's principal
// lacks, so that a command says at start which permission is missing
// instead of failing on first use, days later, when the first invalid event
// has to be parked. docs/deployment.md, the Strimzi KafkaUsers of
// deploy/strimzi and cmd/billing's ACL test are all checked against these
// lists. It depends on sarama and the configuration alone, so that
// deploy/check can read the lists without the rest of billing.
package kafkaacl

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/IBM/sarama"

	"example.com/billing/internal/config"
)

// ACL is one permission a command needs: an operation on a resource, allowed
// to the command's principal from any host.
type ACL struct {
	Resource  sarama.AclResourceType // Topic or Group
	Pattern   sarama.AclResourcePatternType
	Name      string // the resource, or with Pattern Prefixed its prefix
	Operation sarama.AclOperation
	// Instance is the resource the command uses under a Prefixed name: the
	// one the brokers are asked about. Name itself for a Literal one.
	Instance string
	// Why the command needs it: the call that fails without it.
	Why string
}

// String names the permission for logs, errors and /readyz, e.g. "Write on
// Topic orders.confirmed.dlq" or "Read on Group prefix billing-dlq-replay".
func (a ACL) String() string {
	op, res := a.Operation, a.Resource
	prefix := ""
	if a.Pattern == sarama.AclPatternPrefixed {
		prefix = "prefix "
	}
	return fmt.Sprintf("%s on %s %s%s", op.String(), res.String(), prefix, a.Name)
}

// Explain is String with the reason the command needs it.
func (a ACL) Explain() string { return a.String() + ": " + a.Why }

func literal(res sarama.AclResourceType, name string, op sarama.AclOperation, why string) ACL {
	return ACL{Resource: res, Pattern: sarama.AclPatternLiteral, Name: name, Instance: name, Operation: op, Why: why}
}

// Serve are the permissions of `billing serve`. No cluster permission is
// among them: its two producers are idempotent, and since Kafka 2.8
// (KIP-679) Write on any topic allows InitProducerId, so IdempotentWrite on
// the cluster is not needed; no transactional id is used. Describe on the
// topics and the group is implied by Read and Write.
func Serve(k config.Kafka) []ACL {
	topic, group := sarama.AclResourceTopic, sarama.AclResourceGroup
	return []ACL{
		literal(topic, k.Topic, sarama.AclOperationRead,
			"fetch the order events and commit the group's offsets of them (Describe, implied: metadata, start and end offsets, lag)"),
		literal(topic, k.Topic, sarama.AclOperationDescribeConfigs,
			"read retention.ms at start: DEDUP_RETENTION must cover it, or serve refuses to start"),
		literal(group, k.GroupID, sarama.AclOperationRead,
			"join the consumer group, commit and fetch its offsets (Describe, implied: find its coordinator)"),
		literal(topic, k.DLQTopic, sarama.AclOperationWrite,
			"park messages in the dead-letter topic (idempotent producer)"),
		literal(topic, k.DLQTopic, sarama.AclOperationDescribeConfigs,
			"read the dead-letter topic's max.message.bytes: a message it cannot take is parked as a reference"),
		literal(topic, k.OutcomeTopic, sarama.AclOperationWrite,
			"publish the payment outcome events of the outbox (idempotent producer)"),
		literal(topic, k.OutcomeTopic, sarama.AclOperationDescribeConfigs,
			"read the outcome topic's max.message.bytes: an outcome larger than it is marked dead, not retried for ever"),
	}
}

// ReplayGroupPrefix starts the name of every consumer group `billing dlq
// replay` uses by default: <KAFKA_GROUP_ID>-dlq-replay, and
// <KAFKA_GROUP_ID>-dlq-replay-<code> with --code. One prefixed ACL
// covers them all.
func ReplayGroupPrefix(k config.Kafka) string { return k.GroupID + "-dlq-replay" }

// Replay are the permissions of `billing dlq replay` when it tracks its
// progress in group: Prefixed on ReplayGroupPrefix for the default groups,
// Literal for one given with --group outside it.
func Replay(k config.Kafka, group string) []ACL {
	topic := sarama.AclResourceTopic
	progress := literal(sarama.AclResourceGroup, group, sarama.AclOperationRead,
		"join the replay's own consumer group and commit its progress (Describe, implied: its committed offsets)")
	if prefix := ReplayGroupPrefix(k); strings.HasPrefix(group, prefix) {
		progress.Pattern, progress.Name = sarama.AclPatternPrefixed, prefix
		progress.Why += "; the prefix covers the per-code groups of --code"
	}
	return []ACL{
		literal(topic, k.DLQTopic, sarama.AclOperationRead, "read the parked messages"),
		progress,
		literal(topic, k.Topic, sarama.AclOperationWrite, "republish the parked messages to the order topic (idempotent producer)"),
		literal(topic, k.Topic, sarama.AclOperationRead,
			"fetch back the original of a message parked as a reference (reason oversize) from the order topic"),
	}
}

// Explain are the permissions of `billing explain`, which reads the three
// topics to find an event's copies (Describe, implied: metadata and
// ListOffsets) and joins no group.
func Explain(k config.Kafka) []ACL {
	topic := sarama.AclResourceTopic
	return []ACL{
		literal(topic, k.Topic, sarama.AclOperationRead, "find where an order event was read, its duplicates and replays"),
		literal(topic, k.DLQTopic, sarama.AclOperationRead, "find an event's parkings in the dead-letter topic"),
		literal(topic, k.OutcomeTopic, sarama.AclOperationRead, "find an event's published payment outcome events"),
	}
}

// Produce are the permissions of `billing produce`, the load generator
// for test environments.
func Produce(k config.Kafka) []ACL {
	return []ACL{literal(sarama.AclResourceTopic, k.Topic, sarama.AclOperationWrite, "publish order events (idempotent producer)")}
}

// Principal is the principal the brokers see for k, as far as billing knows
// it: User:<KAFKA_SASL_USERNAME> with SASL; with a client certificate
// alone, the broker derives it from the certificate's subject.
func Principal(k config.Kafka) string {
	switch {
	case k.SASLMechanism != "":
		return "User:" + k.SASLUsername
	case k.TLSCertFile != "":
		return "the client certificate's subject (KAFKA_TLS_CERT_FILE)"
	}
	return "User:ANONYMOUS"
}

// Missing asks the brokers which of acls the client's principal does not
// have, and returns them in the order given. It uses the authorized
// operations brokers report since Kafka 2.3 (KIP-430) for topics (in
// metadata) and groups (DescribeGroups), without touching either; a broker
// that reports none (older, or without an authorizer) is taken at its word
// that everything is allowed. A topic that does not exist is not a missing
// permission: the callers already wait for it or report it.
func Missing(client sarama.Client, acls []ACL) ([]ACL, error) {
	ops := map[string]int32{} // "<type>/<instance>" → authorized operations
	var topics, groups []string
	for _, a := range acls {
		switch a.Resource {
		case sarama.AclResourceTopic:
			topics = appendNew(topics, a.Instance)
		case sarama.AclResourceGroup:
			groups = appendNew(groups, a.Instance)
		default:
			return nil, fmt.Errorf("kafka permissions: cannot check %s", a)
		}
	}
	refused, err := topicOperations(client, topics, ops)
	if err != nil {
		return nil, err
	}
	for _, g := range groups {
		o, err := groupOperations(client, g)
		if err != nil {
			return nil, err
		}
		ops["group/"+g] = o
	}
	var missing []ACL
	for _, a := range acls {
		key := "topic/" + a.Instance
		if a.Resource == sarama.AclResourceGroup {
			key = "group/" + a.Instance
		}
		o, ok := ops[key]
		if ok && refused[a.Instance] && a.Resource == sarama.AclResourceTopic && a.Operation == sarama.AclOperationDescribeConfigs {
			// DescribeConfigs does not imply Describe: a principal refused
			// the topic's metadata may still read its configuration. Ask.
			allowed, err := mayDescribeConfigs(client, a.Instance)
			if err != nil {
				return nil, err
			}
			ok = !allowed
			o = 0
		}
		if ok && o != unknownOperations && o&(1<<uint(a.Operation)) == 0 {
			missing = append(missing, a)
		}
	}
	return missing, nil
}

// mayDescribeConfigs reports whether the principal may read topic's
// configuration, by reading one setting of it.
func mayDescribeConfigs(client sarama.Client, topic string) (bool, error) {
	// The admin shares the client; closing it would close the client.
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return false, fmt.Errorf("kafka permissions: %w", err)
	}
	results, err := admin.DescribeConfigs([]*sarama.ConfigResource{{Type: sarama.TopicResource, Name: topic, ConfigNames: []string{"retention.ms"}}},
		sarama.DescribeConfigsOptions{})
	if err != nil {
		return false, fmt.Errorf("kafka permissions: describe topic %s: %w", topic, err)
	}
	for _, r := range results {
		if r.Name == topic && errors.Is(r.ErrorCode, sarama.ErrTopicAuthorizationFailed) {
			return false, nil
		}
	}
	// Another refusal (the topic does not exist) is not a permission's.
	return true, nil
}

// MissingError names the permissions a principal lacks.
type MissingError struct {
	Principal string
	Missing   []ACL
}

func (e *MissingError) Error() string {
	why := make([]string, len(e.Missing))
	for i, a := range e.Missing {
		why[i] = a.Explain()
	}
	return fmt.Sprintf("kafka ACLs missing for %s (docs/deployment.md#kafka-acls): %s", e.Principal, strings.Join(why, "; "))
}

// Require returns a *MissingError naming every permission of acls
// that the client's principal (configured by k) lacks, nil when it has
// them all: for the one-shot commands, which stop at once rather than wait.
func Require(client sarama.Client, k config.Kafka, acls []ACL) error {
	missing, err := Missing(client, acls)
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		return &MissingError{Principal: Principal(k), Missing: missing}
	}
	return nil
}

// unknownOperations is the value of an authorized-operations field the
// broker did not fill in.
const unknownOperations = math.MinInt32

func appendNew(list []string, s string) []string {
	for _, x := range list {
		if x == s {
			return list
		}
	}
	return append(list, s)
}

// topicOperations records the authorized operations of topics in ops and
// returns the topics whose metadata the principal was refused (it may not
// Describe them, so neither Read nor Write them), nothing for one that
// does not exist.
func topicOperations(client sarama.Client, topics []string, ops map[string]int32) (map[string]bool, error) {
	refused := map[string]bool{}
	if len(topics) == 0 {
		return refused, nil
	}
	req := sarama.NewMetadataRequest(client.Config().Version, topics)
	if req.Version < 8 {
		return refused, nil // KAFKA_VERSION older than 2.3: the broker would not say
	}
	req.IncludeTopicAuthorizedOperations = true
	resp, err := askAnyBroker(client, req)
	if err != nil {
		return nil, fmt.Errorf("kafka permissions: metadata of %s: %w", strings.Join(topics, ", "), err)
	}
	for _, t := range resp.Topics {
		switch {
		case errors.Is(t.Err, sarama.ErrTopicAuthorizationFailed):
			ops["topic/"+t.Name] = 0
			refused[t.Name] = true
		case t.Err == sarama.ErrNoError:
			ops["topic/"+t.Name] = t.TopicAuthorizedOperations
		}
	}
	return refused, nil
}

// askAnyBroker sends req to the brokers the client knows, one after the
// other, each on a connection of its own (so that a broker that fails does
// not disturb the connections the client's consumers and producers share),
// and returns the first answer.
func askAnyBroker(client sarama.Client, req *sarama.MetadataRequest) (*sarama.MetadataResponse, error) {
	var errs []error
	for _, known := range client.Brokers() {
		b := sarama.NewBroker(known.Addr())
		if err := b.Open(client.Config()); err != nil {
			errs = append(errs, err)
			continue
		}
		resp, err := b.GetMetadata(req)
		_ = b.Close()
		if err == nil {
			return resp, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", known.Addr(), err))
	}
	if len(errs) == 0 {
		return nil, errors.New("no broker known")
	}
	return nil, errors.Join(errs...)
}

// groupOperations returns the principal's authorized operations on group:
// none when it may not even find the group's coordinator.
func groupOperations(client sarama.Client, group string) (int32, error) {
	if !client.Config().Version.IsAtLeast(sarama.V2_3_0_0) {
		return unknownOperations, nil
	}
	coordinator, err := client.Coordinator(group)
	if errors.Is(err, sarama.ErrGroupAuthorizationFailed) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("kafka permissions: coordinator of group %s: %w", group, err)
	}
	resp, err := coordinator.DescribeGroups(&sarama.DescribeGroupsRequest{Version: 3, Groups: []string{group}, IncludeAuthorizedOperations: true})
	if err != nil {
		return 0, fmt.Errorf("kafka permissions: describe group %s: %w", group, errors.Join(err, refreshCoordinator(client, group)))
	}
	for _, g := range resp.Groups {
		if g.GroupId != group {
			continue
		}
		switch {
		case errors.Is(g.Err, sarama.ErrGroupAuthorizationFailed):
			return 0, nil
		case errors.Is(g.Err, sarama.ErrNotCoordinatorForConsumer), errors.Is(g.Err, sarama.ErrConsumerCoordinatorNotAvailable):
			return 0, fmt.Errorf("kafka permissions: describe group %s: %w", group, errors.Join(g.Err, refreshCoordinator(client, group)))
		case g.Err != sarama.ErrNoError && !errors.Is(g.Err, sarama.ErrGroupIDNotFound):
			return 0, fmt.Errorf("kafka permissions: describe group %s: %w", group, g.Err)
		}
		return g.AuthorizedOperations, nil
	}
	return unknownOperations, nil
}

// refreshCoordinator forgets the client's coordinator of group and asks the
// brokers for it again. The client caches a group's coordinator, and only
// its consumer group refreshes the cache when a request is refused; once
// the coordinator moved (its broker restarted or failed over), asking the
// cached one again is refused forever. The next question goes to the new
// one. Its error, if any, goes with the refusal.
func refreshCoordinator(client sarama.Client, group string) error {
	if err := client.RefreshCoordinator(group); err != nil {
		return fmt.Errorf("finding its coordinator again: %w", err)
	}
	return nil
}

// NameDenied adds to err, when a broker refused a request for lack of a
// permission, the ACL the request needed, so that the log line says what to
// grant: topicACL when a topic was refused, groupACL when a group was. Any
// other error is returned as it is.
func NameDenied(err error, topicACL, groupACL string) error {
	switch {
	case errors.Is(err, sarama.ErrTopicAuthorizationFailed) && topicACL != "":
		return fmt.Errorf("%w (missing ACL: %s)", err, topicACL)
	case errors.Is(err, sarama.ErrGroupAuthorizationFailed) && groupACL != "":
		return fmt.Errorf("%w (missing ACL: %s)", err, groupACL)
	case errors.Is(err, sarama.ErrClusterAuthorizationFailed) && topicACL != "":
		// An idempotent producer's InitProducerId needs Write on some
		// topic (or IdempotentWrite on the cluster).
		return fmt.Errorf("%w (missing ACL: %s)", err, topicACL)
	}
	return err
}
