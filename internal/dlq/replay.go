package dlq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/config"
	"example.com/billing/internal/dlq/reason"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/kafkaacl"
)

// HeaderReplayedFrom marks a republished message with where it was parked:
// "<dlq-partition>/<dlq-offset>". It survives a second parking, so a
// message that fails again shows it was replayed before.
const HeaderReplayedFrom = "x-dlq-replayed-from"

// HeaderReplayAction marks a republished message with the operator action
// that ordered its replay (operator_action's id, which ReplayOptions.Begin
// returns): billing explain tells who replayed an event and why from it.
// Like every x-dlq- header, a later replay replaces it.
const HeaderReplayAction = "x-dlq-replay-action"

// replayConsumerConfig is the configuration of a replay's consumer group:
// from the oldest offset, committing only when told to.
func replayConsumerConfig(k config.Kafka) (*sarama.Config, error) {
	cfg, err := kafka.NewConfig(k)
	if err != nil {
		return nil, err
	}
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	// Offsets are committed explicitly, and only for messages whose
	// republishing was acknowledged.
	cfg.Consumer.Offsets.AutoCommit.Enable = false
	cfg.Consumer.Return.Errors = true
	// A broker answers a connection's requests in order, so a commit waits
	// behind a fetch that long-polls an exhausted partition; a batch job
	// that ends at the partitions' ends meets that at every end.
	cfg.Consumer.MaxWaitTime = 100 * time.Millisecond
	return cfg, nil
}

// replayProducerConfig is ProducerConfig's idempotent, acks=all producer
// that puts each message on the partition it names.
func replayProducerConfig(k config.Kafka) (*sarama.Config, error) {
	cfg, err := ProducerConfig(k)
	if err != nil {
		return nil, err
	}
	// A message goes back to the partition it was parked from, whatever
	// partitioner its producer used (sarama hashes keys with FNV-1a, the
	// Java client with murmur2): that keeps it behind the other events of
	// its key.
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	return cfg, nil
}

// ReplayOptions configure Replay.
type ReplayOptions struct {
	// DLQTopic is the dead-letter topic to replay.
	DLQTopic string
	// Topic receives a parked message that names no x-original-topic.
	Topic string
	// Group is the consumer group, on DLQTopic, that remembers how far
	// replays got. It must not be the service's own group.
	Group string
	// Reason, when set, replays only the messages whose x-dlq-reason code
	// (the part before ": ") equals it; the others are passed over and, in
	// Group, counted as done.
	Reason reason.Code
	// Max, when > 0, is the most messages republished; the run stops at
	// the first matching message beyond it, which a later run replays.
	Max int
	// DryRun lists what would be republished; it publishes and commits
	// nothing, and does not join Group.
	DryRun bool
	// OnMessage, when set, is told about each message republished (or that
	// would be), one call at a time.
	OnMessage func(Replayed)
	// Begin, when set, is called once a run (not a dry run) knows the
	// ranges it goes through, before it republishes anything: an error
	// ends the run with nothing republished. What it returns is written on
	// every message the run republishes (HeaderReplayAction, when not
	// ""). billing records the operator's action there, so that a replay
	// nobody can account for does not happen.
	Begin func(ranges map[int32]Range) (action string, err error)
}

// Range is the offsets [From, To) of a dead-letter partition a replay
// goes through: from its group's committed offset (or the oldest kept) to
// the end as of its start.
type Range struct {
	From int64 `json:"from"`
	To   int64 `json:"to"`
}

// ReplayCommand is the command of a replay's operator action.
const ReplayCommand = "dlq replay"

// Plan is what a replay records in its operator action before it
// republishes anything, and what billing explain reads back to tell which
// replay went through a parked message.
type Plan struct {
	DLQTopic string `json:"dlqTopic"`
	Group    string `json:"group"`
	Code     string `json:"code,omitempty"`
	Max      int    `json:"max,omitempty"`
	// Ranges are the dead-letter offsets it goes through, by partition;
	// the messages of another code are passed over.
	Ranges map[int32]Range `json:"ranges"`
}

// Covers reports whether the replay planned went through the message
// parked at offset of DLQ partition with reason (its x-dlq-reason).
func (p Plan) Covers(partition int32, offset int64, why string) bool {
	rg, ok := p.Ranges[partition]
	return ok && rg.From <= offset && offset < rg.To && (p.Code == "" || string(reason.Parse(why).Code) == p.Code)
}

// Replayed describes one parked message that was (or would be) republished.
// It carries no value: values may hold customer data.
type Replayed struct {
	DLQPartition int32
	DLQOffset    int64
	Key          []byte
	Reason       string // the x-dlq-reason header
	Topic        string // where it goes
	Partition    int32
	// Gone, for a message parked as a reference (reason oversize), says
	// why its original could not be fetched back from the source topic:
	// it was not republished.
	Gone string
}

// ReplayReport is the outcome of a replay.
type ReplayReport struct {
	Group string `json:"group"`
	// Replayed counts messages republished and acknowledged (in a dry run:
	// that would be).
	Replayed int `json:"replayed"`
	// Skipped counts messages passed over for another reason code.
	Skipped int `json:"skipped"`
	// Gone counts references (reason oversize) whose original the source
	// topic no longer holds: they cannot be replayed, and are passed over.
	Gone int `json:"gone"`
	// MaxReached: the run stopped at Max with matching messages left.
	MaxReached bool `json:"maxReached"`
	// Pending is, per DLQ partition, the messages between the group's
	// committed offset and the end offset as of the start: what this run
	// had to go through.
	Pending map[int32]int64 `json:"pending"`
	DryRun  bool            `json:"dryRun"`
}

// Replay republishes the messages parked in opts.DLQTopic, unchanged (same
// key, same value, so the same event ids, which billing deduplicates), to
// the topic and partition they were parked from, after an operator fixed
// what made them fail.
//
// It is a batch job: it goes through each partition from Group's committed
// offset up to the partition's end offset as of the start, then returns.
// Messages parked meanwhile, such as a replayed message that fails again,
// are left for a later run. Progress is committed to Group only after the
// broker acknowledged the republished message, so a run that stops (an
// error, a crash, Ctrl-C) is resumed by the next one and a committed
// message is never republished twice; a message acknowledged but not yet
// committed when the run died is republished again, and billing skips it
// as a duplicate. Group membership keeps two concurrent runs apart.
//
// Headers are kept, trace context among them, except the dead-letter ones
// (x-dlq-*, x-original-*, x-consumer-group); HeaderReplayedFrom is added.
//
// The brokers, TLS and SASL settings come from k.
func Replay(ctx context.Context, k config.Kafka, opts ReplayOptions, log *slog.Logger) (ReplayReport, error) {
	rep := ReplayReport{Group: opts.Group, DryRun: opts.DryRun, Pending: map[int32]int64{}}
	if opts.DLQTopic == "" || opts.Topic == "" || opts.Group == "" {
		return rep, errors.New("dlq replay: DLQ topic, topic and group are required")
	}
	cfg, err := replayConsumerConfig(k)
	if err != nil {
		return rep, err
	}
	client, err := sarama.NewClient(k.Brokers, cfg)
	if err != nil {
		return rep, fmt.Errorf("dlq replay: connect to %s: %w", strings.Join(k.Brokers, ","), err)
	}
	defer client.Close()
	// Every permission the replay needs, before it reads or writes
	// anything (a dry run too: it tells whether the real run would pass).
	if err := kafkaacl.Require(client, k, kafkaacl.Replay(k, opts.Group)); err != nil {
		return rep, fmt.Errorf("dlq replay: %w", err)
	}
	r := &replayer{client: client, kafka: k, opts: opts, log: log, partitions: map[string]int32{}}
	ranges, err := r.ranges(ctx)
	if err != nil {
		return rep, err
	}
	for p, rg := range ranges {
		rep.Pending[p] = rg.end - rg.start
	}
	if len(ranges) == 0 {
		log.Info("nothing to replay", "dlq_topic", opts.DLQTopic, "group", opts.Group)
		return rep, nil
	}
	if opts.DryRun {
		err = r.dryRun(ctx, ranges)
	} else {
		if err := r.begin(ranges); err != nil {
			return rep, err
		}
		err = r.run(ctx, ranges)
	}
	r.mu.Lock()
	rep.Replayed, rep.Skipped, rep.Gone, rep.MaxReached = r.replayed, r.skipped, r.gone, r.maxReached
	r.mu.Unlock()
	return rep, err
}

// replayRange is a partition's messages [start, end) to go through.
type replayRange struct{ start, end int64 }

type replayer struct {
	client sarama.Client // the consumer's; the producer has its own
	kafka  config.Kafka
	opts   ReplayOptions
	log    *slog.Logger
	// action is what ReplayOptions.Begin returned: HeaderReplayAction's
	// value on every republished message, "" for none.
	action string

	mu         sync.Mutex // guards the fields below
	partitions map[string]int32
	replayed   int
	skipped    int
	gone       int
	maxReached bool
}

// ranges returns, for every DLQ partition with messages left for Group, the
// range from the committed offset (or the oldest kept) to the end offset
// now.
func (r *replayer) ranges(ctx context.Context) (map[int32]replayRange, error) {
	topic := r.opts.DLQTopic
	ends, err := kafka.EndOffsets(r.client, topic)
	if err != nil {
		return nil, fmt.Errorf("dlq replay: %w", err)
	}
	committed, err := kafka.CommittedOffsets(ctx, r.client, r.opts.Group, topic)
	if err != nil {
		return nil, fmt.Errorf("dlq replay: %w", err)
	}
	out := map[int32]replayRange{}
	for p, end := range ends {
		oldest, err := r.client.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			return nil, fmt.Errorf("dlq replay: oldest offset of %s/%d: %w", topic, p, err)
		}
		// Messages deleted by retention before they were replayed are gone;
		// the consumer group then starts from the oldest one kept.
		start := max(committed[p], oldest)
		if start < end {
			out[p] = replayRange{start: start, end: end}
		}
	}
	return out, nil
}

// begin calls ReplayOptions.Begin, if set, with the ranges of the run.
func (r *replayer) begin(ranges map[int32]replayRange) error {
	if r.opts.Begin == nil {
		return nil
	}
	plan := make(map[int32]Range, len(ranges))
	for p, rg := range ranges {
		plan[p] = Range{From: rg.start, To: rg.end}
	}
	action, err := r.opts.Begin(plan)
	if err != nil {
		return fmt.Errorf("dlq replay: nothing republished: %w", err)
	}
	r.action = action
	return nil
}

// verdict is what to do with one parked message.
type verdict int

const (
	replaySkip verdict = iota // another reason: pass over it
	replayTake                // republish it
	replayStop                // Max reached: leave it and stop
)

// judge decides about m, and counts it.
func (r *replayer) judge(m *sarama.ConsumerMessage) verdict {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.opts.Reason != "" && reason.Parse(Header(m.Headers, HeaderReason)).Code != r.opts.Reason {
		r.skipped++
		return replaySkip
	}
	if r.opts.Max > 0 && r.replayed >= r.opts.Max {
		r.maxReached = true
		return replayStop
	}
	// Counted before the broker acknowledges: a failure ends the run, and
	// then the count includes one message that may not have made it.
	r.replayed++
	return replayTake
}

// uncount takes back judge's count of a message that was not republished.
func (r *replayer) uncount() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.replayed--
}

// countGone moves judge's count of a reference whose original is gone.
func (r *replayer) countGone() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.replayed--
	r.gone++
}

func (r *replayer) report(d Replayed) {
	if r.opts.OnMessage == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.opts.OnMessage(d)
}

// destination is where m goes back to: x-original-topic (or opts.Topic) and
// x-original-partition when the topic still has it, else the key's hash.
func (r *replayer) destination(m *sarama.ConsumerMessage) (string, int32, error) {
	topic := Header(m.Headers, HeaderOriginalTopic)
	if topic == "" {
		topic = r.opts.Topic
	}
	if topic == r.opts.DLQTopic {
		return "", 0, fmt.Errorf("dlq replay: %s/%d@%d names the dead-letter topic itself as its origin", m.Topic, m.Partition, m.Offset)
	}
	n, err := r.partitionCount(topic)
	if err != nil {
		return "", 0, err
	}
	if p, err := strconv.ParseInt(Header(m.Headers, HeaderOriginalPartition), 10, 32); err == nil && p >= 0 && int32(p) < n {
		return topic, int32(p), nil
	}
	// Without a usable original partition, place it as a producer would.
	pm := &sarama.ProducerMessage{Topic: topic}
	if m.Key != nil {
		pm.Key = sarama.ByteEncoder(m.Key)
	}
	p, err := sarama.NewHashPartitioner(topic).Partition(pm, n)
	if err != nil {
		return "", 0, fmt.Errorf("dlq replay: partition for %s: %w", topic, err)
	}
	return topic, p, nil
}

func (r *replayer) partitionCount(topic string) (int32, error) {
	r.mu.Lock()
	n, ok := r.partitions[topic]
	r.mu.Unlock()
	if ok {
		return n, nil
	}
	parts, err := r.client.Partitions(topic)
	if err != nil {
		return 0, fmt.Errorf("dlq replay: partitions of %s: %w", topic, err)
	}
	r.mu.Lock()
	r.partitions[topic] = int32(len(parts))
	r.mu.Unlock()
	return int32(len(parts)), nil
}

// republished returns the message to publish for m: key and value as they
// are, the original headers without the dead-letter ones, and where it was
// parked. The timestamp is left for the producer to set: the republished
// record is new, and an old timestamp could put it under retention at once.
//
// For a reference (reason oversize) body is the original fetched back from
// the source topic, and parked the reference; otherwise both are m. action,
// when not "", is HeaderReplayAction's value.
func republished(body, parked *sarama.ConsumerMessage, topic string, partition int32, action string) *sarama.ProducerMessage {
	headers := append(keptHeaders(body.Headers, isReplayDropped, 2), sarama.RecordHeader{
		Key:   []byte(HeaderReplayedFrom),
		Value: []byte(strconv.FormatInt(int64(parked.Partition), 10) + "/" + strconv.FormatInt(parked.Offset, 10)),
	})
	if action != "" {
		headers = append(headers, sarama.RecordHeader{Key: []byte(HeaderReplayAction), Value: []byte(action)})
	}
	pm := &sarama.ProducerMessage{Topic: topic, Partition: partition, Headers: headers}
	setBody(pm, body.Key, body.Value)
	return pm
}

// isReplayDropped names the headers a republished message loses: every
// dead-letter one, x-dlq-replayed-from of an earlier replay among them.
func isReplayDropped(k string) bool { return isDLQHeader(k) || strings.HasPrefix(k, "x-dlq-") }

// dryRun reads the ranges with a plain consumer, outside the group, and
// reports what a replay would republish.
func (r *replayer) dryRun(ctx context.Context, ranges map[int32]replayRange) error {
	consumer, err := sarama.NewConsumerFromClient(r.client)
	if err != nil {
		return fmt.Errorf("dlq replay: consumer: %w", err)
	}
	defer consumer.Close()
	for _, p := range sortedPartitions(ranges) {
		if err := r.dryRunPartition(ctx, consumer, p, ranges[p]); err != nil || r.maxReached {
			return err
		}
	}
	return nil
}

func (r *replayer) dryRunPartition(ctx context.Context, consumer sarama.Consumer, p int32, rg replayRange) error {
	pc, err := consumer.ConsumePartition(r.opts.DLQTopic, p, rg.start)
	if err != nil {
		return fmt.Errorf("dlq replay: read %s/%d from %d: %w", r.opts.DLQTopic, p, rg.start, err)
	}
	defer pc.Close()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case cerr := <-pc.Errors():
			return fmt.Errorf("dlq replay: read %s/%d: %w", r.opts.DLQTopic, p, cerr)
		case m := <-pc.Messages():
			if m.Offset >= rg.end {
				return nil
			}
			switch r.judge(m) {
			case replayStop:
				return nil
			case replayTake:
				topic, partition, err := r.destination(m)
				if err != nil {
					return err
				}
				r.report(Replayed{DLQPartition: p, DLQOffset: m.Offset, Key: m.Key, Reason: Header(m.Headers, HeaderReason), Topic: topic, Partition: partition})
			}
			if m.Offset+1 >= rg.end {
				return nil
			}
		}
	}
}

var (
	errReplayFinished   = errors.New("replay finished")
	errReplayMaxReached = errors.New("replay reached --max")
)

func sortedPartitions(ranges map[int32]replayRange) []int32 {
	return slices.Sorted(maps.Keys(ranges))
}
