package dlq

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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
	"example.com/billing/internal/kafka"
)

// HeaderReplayedFrom marks a republished message with where it was parked:
// "<dlq-partition>/<dlq-offset>". It survives a second parking, so a
// message that fails again shows it was replayed before.
const HeaderReplayedFrom = "x-dlq-replayed-from"

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
	Reason string
	// Max, when > 0, is the most messages republished; the run stops at
	// the first matching message beyond it, which a later run replays.
	Max int
	// DryRun lists what would be republished; it publishes and commits
	// nothing, and does not join Group.
	DryRun bool
	// OnMessage, when set, is told about each message republished (or that
	// would be), one call at a time.
	OnMessage func(Replayed)
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
	r := &replayer{client: client, kafka: k, opts: opts, log: log, partitions: map[string]int32{}}
	ranges, err := r.ranges()
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
func (r *replayer) ranges() (map[int32]replayRange, error) {
	topic := r.opts.DLQTopic
	ends, err := kafka.EndOffsets(r.client, topic)
	if err != nil {
		return nil, fmt.Errorf("dlq replay: %w", err)
	}
	committed, err := kafka.CommittedOffsets(r.client, r.opts.Group, topic)
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
	if r.opts.Reason != "" && ReasonCode(kafka.Header(m.Headers, HeaderReason)) != r.opts.Reason {
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

// ReasonCode is the stable code at the start of an x-dlq-reason value, e.g.
// "provider-rejected" of "provider-rejected: idempotency key reused".
func ReasonCode(reason string) string {
	code, _, _ := strings.Cut(reason, ":")
	return strings.TrimSpace(code)
}

// destination is where m goes back to: x-original-topic (or opts.Topic) and
// x-original-partition when the topic still has it, else the key's hash.
func (r *replayer) destination(m *sarama.ConsumerMessage) (string, int32, error) {
	topic := kafka.Header(m.Headers, HeaderOriginalTopic)
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
	if p, err := strconv.ParseInt(kafka.Header(m.Headers, HeaderOriginalPartition), 10, 32); err == nil && p >= 0 && int32(p) < n {
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
// the source topic, and parked the reference; otherwise both are m.
func republished(body, parked *sarama.ConsumerMessage, topic string, partition int32) *sarama.ProducerMessage {
	headers := append(keptHeaders(body.Headers, isReplayDropped, 1), sarama.RecordHeader{
		Key:   []byte(HeaderReplayedFrom),
		Value: []byte(strconv.FormatInt(int64(parked.Partition), 10) + "/" + strconv.FormatInt(parked.Offset, 10)),
	})
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
				r.report(Replayed{DLQPartition: p, DLQOffset: m.Offset, Key: m.Key, Reason: kafka.Header(m.Headers, HeaderReason), Topic: topic, Partition: partition})
			}
			if m.Offset+1 >= rg.end {
				return nil
			}
		}
	}
}

// run replays the ranges as a member of Group, until every partition is
// done, Max is reached, or something fails.
func (r *replayer) run(ctx context.Context, ranges map[int32]replayRange) error {
	// The producer has a client of its own, so that a republish never
	// waits behind the consumer's fetches on a shared connection.
	pcfg, err := replayProducerConfig(r.kafka)
	if err != nil {
		return err
	}
	producer, err := sarama.NewSyncProducer(r.kafka.Brokers, pcfg)
	if err != nil {
		return fmt.Errorf("dlq replay: producer: %w", err)
	}
	defer producer.Close()
	group, err := sarama.NewConsumerGroupFromClient(r.opts.Group, r.client)
	if err != nil {
		return fmt.Errorf("dlq replay: consumer group %s: %w", r.opts.Group, err)
	}
	var wg sync.WaitGroup
	defer func() {
		// Closing the group leaves it and ends group.Errors().
		_ = group.Close()
		wg.Wait()
	}()

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	h := &replayHandler{r: r, producer: producer, ranges: ranges, done: map[int32]bool{}, progress: make(chan struct{}, 1), fail: cancel}

	wg.Go(func() {
		for err := range group.Errors() {
			r.log.Warn("replay consumer group error", "group", r.opts.Group, "err", err)
		}
	})
	wg.Go(func() { h.watch(ctx, cancel) })

	for ctx.Err() == nil {
		// A session ends on a rebalance (another replay joined or left);
		// join again and go on from the committed offsets.
		if err := group.Consume(ctx, []string{r.opts.DLQTopic}, h); err != nil && ctx.Err() == nil {
			if errors.Is(err, sarama.ErrClosedConsumerGroup) {
				return fmt.Errorf("dlq replay: consumer group %s: %w", r.opts.Group, err)
			}
			r.log.Warn("replay consumer group session failed; joining again", "group", r.opts.Group, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errReplayFinished), errors.Is(cause, errReplayMaxReached):
	case cause != nil:
		return cause
	}
	// The commits are the replay's memory; make sure they arrived.
	committed, err := kafka.CommittedOffsets(r.client, r.opts.Group, r.opts.DLQTopic)
	if err != nil {
		return fmt.Errorf("dlq replay: %w", err)
	}
	for p, rg := range ranges {
		if h.isDone(p) && committed[p] < rg.end {
			return fmt.Errorf("dlq replay: group %s committed %s/%d up to %d, not %d: a rerun republishes the rest again (billing skips them as duplicates)",
				r.opts.Group, r.opts.DLQTopic, p, committed[p], rg.end)
		}
	}
	return nil
}

var (
	errReplayFinished   = errors.New("replay finished")
	errReplayMaxReached = errors.New("replay reached --max")
)

// replayHandler is the consumer group handler of a replay.
type replayHandler struct {
	r        *replayer
	producer sarama.SyncProducer
	ranges   map[int32]replayRange
	fail     context.CancelCauseFunc
	progress chan struct{} // a partition got done

	mu   sync.Mutex
	done map[int32]bool // partitions replayed up to their end and committed
}

func (h *replayHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *replayHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *replayHandler) isDone(p int32) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.done[p]
}

// allDone reports whether every partition is done, here or, judging by the
// committed offsets (nil: not read), by another member of the group.
func (h *replayHandler) allDone(committed map[int32]int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for p, rg := range h.ranges {
		if c, ok := committed[p]; ok && c >= rg.end {
			h.done[p] = true
		}
		if !h.done[p] {
			return false
		}
	}
	return true
}

// watch ends the run once every partition is done.
func (h *replayHandler) watch(ctx context.Context, cancel context.CancelCauseFunc) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.progress:
		case <-tick.C:
		}
		var committed map[int32]int64
		if !h.allDone(nil) {
			// Partitions another replay holds: their committed offsets say
			// whether it finished them.
			c, err := kafka.CommittedOffsets(h.r.client, h.r.opts.Group, h.r.opts.DLQTopic)
			if err != nil {
				h.r.log.Warn("replay: cannot read the group's offsets", "err", err)
				continue
			}
			committed = c
		}
		if h.allDone(committed) {
			cancel(errReplayFinished)
			return
		}
	}
}

// finish marks partition p done up to its end and commits.
func (h *replayHandler) finish(sess sarama.ConsumerGroupSession, p int32) {
	sess.MarkOffset(h.r.opts.DLQTopic, p, h.ranges[p].end, "")
	sess.Commit()
	h.mu.Lock()
	h.done[p] = true
	h.mu.Unlock()
	select {
	case h.progress <- struct{}{}:
	default:
	}
}

// commitEvery bounds the messages acknowledged but not committed, which a
// crash would make the next run republish.
const commitEvery = 100

// ConsumeClaim republishes one partition's messages up to its end offset
// as of the start. It does not return when done: in sarama, a handler that
// returns ends the session for every partition.
func (h *replayHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	p := claim.Partition()
	rg, ok := h.ranges[p]
	// Marks are made only after an acknowledgement, so whatever is marked
	// may be committed when the claim ends, however it ends.
	defer sess.Commit()
	if !ok || h.isDone(p) {
		<-sess.Context().Done()
		return nil
	}
	if off := claim.InitialOffset(); off >= rg.end {
		h.finish(sess, p)
		<-sess.Context().Done()
		return nil
	}
	uncommitted := 0
	for {
		var m *sarama.ConsumerMessage
		select {
		case <-sess.Context().Done():
			return nil
		case m, ok = <-claim.Messages():
			if !ok {
				return nil
			}
		}
		if m.Offset >= rg.end {
			h.finish(sess, p)
			<-sess.Context().Done()
			return nil
		}
		switch h.r.judge(m) {
		case replayStop:
			h.fail(errReplayMaxReached)
			return nil
		case replayTake:
			if err := h.republish(sess.Context(), m); err != nil {
				h.r.uncount()
				h.fail(err)
				return nil
			}
		}
		sess.MarkMessage(m, "")
		uncommitted++
		if m.Offset+1 >= rg.end {
			h.finish(sess, p)
			<-sess.Context().Done()
			return nil
		}
		// Commit in batches, and whenever the fetched messages run out.
		if uncommitted >= commitEvery || len(claim.Messages()) == 0 {
			sess.Commit()
			uncommitted = 0
		}
	}
}

// republish sends m back and returns once the broker acknowledged it. A
// reference is resolved first: its original is republished, or, when the
// source topic no longer holds it, reported as gone and passed over.
func (h *replayHandler) republish(ctx context.Context, m *sarama.ConsumerMessage) error {
	topic, partition, err := h.r.destination(m)
	if err != nil {
		return err
	}
	reason := kafka.Header(m.Headers, HeaderReason)
	body := m
	if isReference(m) {
		original, err := h.r.original(ctx, m)
		var gone *goneError
		if errors.As(err, &gone) {
			h.r.countGone()
			h.r.log.Error("cannot replay a message parked as a reference: its original is gone", "dlq_partition", m.Partition,
				"dlq_offset", m.Offset, "err", err)
			h.r.report(Replayed{DLQPartition: m.Partition, DLQOffset: m.Offset, Key: m.Key, Reason: reason, Topic: topic, Partition: partition, Gone: gone.Error()})
			return nil
		}
		if err != nil {
			return err
		}
		body = original
	}
	if _, _, err := h.producer.SendMessage(republished(body, m, topic, partition)); err != nil {
		return fmt.Errorf("dlq replay: republish %s/%d@%d to %s/%d: %w", m.Topic, m.Partition, m.Offset, topic, partition, err)
	}
	h.r.log.Info("replayed", "dlq_partition", m.Partition, "dlq_offset", m.Offset, "key", string(m.Key),
		"reason", reason, "topic", topic, "partition", partition)
	h.r.report(Replayed{DLQPartition: m.Partition, DLQOffset: m.Offset, Key: m.Key, Reason: reason, Topic: topic, Partition: partition})
	return nil
}

// isReference reports whether m stands for an original too large to park
// (Writer.Park's reference).
func isReference(m *sarama.ConsumerMessage) bool {
	return ReasonCode(kafka.Header(m.Headers, HeaderReason)) == CodeOversize && kafka.Header(m.Headers, HeaderOriginalSHA256) != ""
}

// goneError says why a reference's original cannot be fetched back.
type goneError struct{ msg string }

func (e *goneError) Error() string { return e.msg }

// original fetches the message reference ref stands for from the source
// topic, at the partition and offset it names, and checks its size and
// SHA-256. It is gone when retention (or compaction) removed it.
func (r *replayer) original(ctx context.Context, ref *sarama.ConsumerMessage) (*sarama.ConsumerMessage, error) {
	topic := kafka.Header(ref.Headers, HeaderOriginalTopic)
	part, perr := strconv.ParseInt(kafka.Header(ref.Headers, HeaderOriginalPartition), 10, 32)
	off, oerr := strconv.ParseInt(kafka.Header(ref.Headers, HeaderOriginalOffset), 10, 64)
	if topic == "" || perr != nil || oerr != nil {
		return nil, &goneError{fmt.Sprintf("reference %s/%d@%d does not name its original's topic, partition and offset", ref.Topic, ref.Partition, ref.Offset)}
	}
	where := fmt.Sprintf("%s/%d@%d", topic, part, off)
	oldest, err := r.client.GetOffset(topic, int32(part), sarama.OffsetOldest)
	if err != nil {
		return nil, fmt.Errorf("dlq replay: oldest offset of %s/%d: %w", topic, part, err)
	}
	if off < oldest {
		return nil, &goneError{fmt.Sprintf("%s is gone: the topic's retention removed it (the partition now starts at offset %d)", where, oldest)}
	}
	consumer, err := sarama.NewConsumerFromClient(r.client)
	if err != nil {
		return nil, fmt.Errorf("dlq replay: %w", err)
	}
	defer consumer.Close()
	pc, err := consumer.ConsumePartition(topic, int32(part), off)
	if errors.Is(err, sarama.ErrOffsetOutOfRange) {
		return nil, &goneError{fmt.Sprintf("%s is gone: the topic no longer holds that offset", where)}
	}
	if err != nil {
		return nil, fmt.Errorf("dlq replay: read %s: %w", where, err)
	}
	defer pc.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	select {
	case m := <-pc.Messages():
		sum := sha256.Sum256(m.Value)
		if m.Offset != off || strconv.Itoa(len(m.Value)) != kafka.Header(ref.Headers, HeaderOriginalSize) ||
			hex.EncodeToString(sum[:]) != kafka.Header(ref.Headers, HeaderOriginalSHA256) {
			return nil, &goneError{fmt.Sprintf("%s is gone: the topic holds another message there now (offset %d, %d bytes, other SHA-256)", where, m.Offset, len(m.Value))}
		}
		return m, nil
	case cerr := <-pc.Errors():
		return nil, fmt.Errorf("dlq replay: read %s: %w", where, cerr)
	case <-ctx.Done():
		return nil, fmt.Errorf("dlq replay: read %s: %w", where, context.Cause(ctx))
	}
}

func sortedPartitions(ranges map[int32]replayRange) []int32 {
	return slices.Sorted(maps.Keys(ranges))
}
