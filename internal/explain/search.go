package explain

// The Kafka part of a story. billing stores no offsets, so each copy of an
// event is found by time: ListOffsets turns a time into the first offset
// at or after it on each partition, and a bounded read from there looks
// for the event id. The partition a key hashes to (billing's producers,
// sarama's FNV-1a) is read first; the others only when it holds nothing.
// Every search stops at its window's end (or, for the dead-letter topic,
// which is small and whose records keep their original timestamps, at the
// end offsets as of the search), after Limits.Messages messages, or when
// Limits.Timeout has passed for the whole story; it says which.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/gofrs/uuid/v5"

	"example.com/billing/internal/audit"
	"example.com/billing/internal/charge"
	"example.com/billing/internal/dlq"
	"example.com/billing/internal/dlq/reason"
	"example.com/billing/internal/order"
)

// Search is one bounded read of a topic, looking for an event's copies.
type Search struct {
	Topic string `json:"topic"`
	// For says what was looked for.
	For string `json:"for"`
	// Partitions are the partitions read, in the order read.
	Partitions []int32 `json:"partitions"`
	// From and To are the window of record timestamps read; To is nil
	// when the search read to the end offsets as of its start.
	From time.Time  `json:"from"`
	To   *time.Time `json:"to,omitempty"`
	// Read counts the messages read, Found those that were the event's.
	Read  int `json:"read"`
	Found int `json:"found"`
	// Stopped says why the search ended before its window did (the
	// message limit, the timeout), "" when it covered its window.
	Stopped string `json:"stopped,omitempty"`
	// Err is why it could not search, "" when it could.
	Err string `json:"error,omitempty"`
}

// Bounds of the searches' windows around what the records say.
const (
	// slack is allowed on either side of a recorded time: clocks differ
	// between a producer, the broker and billing.
	slack = time.Minute
	// publishedWithin is how long after an event's id was made it is looked
	// for on the order topic when billing never claimed it; with a claim,
	// until the claim.
	publishedWithin = 10 * time.Minute
	// relayedWithin is how long after its outcome was recorded an outcome
	// event is looked for on the outcome topic.
	relayedWithin = 10 * time.Minute
	// replayedWithin is how long after a replay began a message it
	// republished is looked for.
	replayedWithin = 30 * time.Minute
	// drained is how long a partition's read waits for a message before
	// it takes the partition as read to its end (a transaction's marker
	// or an open transaction ends it without a record).
	drained = 2 * time.Second
)

// errStopped ends a search early; Search.Stopped says why.
var errStopped = errors.New("search stopped")

// query is one search to make.
type query struct {
	topic, what string
	// first are the partitions read first; the others only when these
	// hold no match.
	first []int32
	// from and to bound the record timestamps read; to zero reads to the
	// end offsets.
	from, to time.Time
	match    func(*sarama.ConsumerMessage) bool
}

// search finds the events' copies on the topics and fills in st.
func (t *Teller) search(ctx context.Context, st *Story, rec *records) {
	ctx, cancel := context.WithTimeout(ctx, t.limits.Timeout)
	defer cancel()
	consumer, err := sarama.NewConsumerFromClient(t.kafka)
	if err != nil {
		st.Notes = append(st.Notes, "Kafka was not searched: "+err.Error())
		return
	}
	defer consumer.Close()
	s := &searcher{t: t, ctx: ctx, consumer: consumer, story: st}
	replays, err := audit.Since(ctx, t.db, s.earliest(st).Add(-slack))
	if err != nil {
		st.Notes = append(st.Notes, "the replays were not looked for: "+err.Error())
	}
	for i := range st.Events {
		ev := &st.Events[i]
		orderID := st.OrderID
		if orderID == 0 {
			orderID = rec.orderOf(ev.EventID)
		}
		s.event(ev, orderID, replays)
	}
}

// searcher runs a story's searches under one deadline.
type searcher struct {
	t        *Teller
	ctx      context.Context
	consumer sarama.Consumer
	story    *Story
}

// earliest is the earliest time the story's records name, from which
// the replays of its events are looked for.
func (s *searcher) earliest(st *Story) time.Time {
	at := time.Now()
	for _, ev := range st.Events {
		for _, t := range ev.times() {
			at = minTime(at, t)
		}
	}
	return at
}

// times are the times ev's records name: its id's, its claims', its
// attempt's creation and settle, its waiting's and its outcomes'.
func (ev *Event) times() []time.Time {
	var out []time.Time
	if ev.Created != nil {
		out = append(out, *ev.Created)
	}
	for _, c := range ev.Claims {
		out = append(out, c.ProcessedAt)
	}
	if a := ev.Attempt; a != nil {
		out = append(out, a.CreatedAt)
		if a.SettledAt != nil {
			out = append(out, *a.SettledAt)
		}
	}
	if ev.Waiting != nil {
		out = append(out, ev.Waiting.CreatedAt)
	}
	for _, o := range ev.Outcomes {
		out = append(out, o.OccurredAt)
	}
	return out
}

// event finds ev's copies: its parkings, its reads (first deliveries,
// duplicates, replays) and its published outcomes.
func (s *searcher) event(ev *Event, orderID int64, replays []audit.Action) {
	times := ev.times()
	if len(times) == 0 {
		s.story.Notes = append(s.story.Notes, fmt.Sprintf("event %s: its id holds no time (not a UUID v7) and billing recorded nothing of it: Kafka was not searched", ev.EventID))
		return
	}
	from := slices.MinFunc(times, time.Time.Compare).Add(-slack)
	id := []byte(ev.EventID.String())
	key := ""
	if orderID != 0 {
		key = strconv.FormatInt(orderID, 10)
	}
	topics := s.t.topics

	// The dead-letter topic first: a parking names where its message was
	// read.
	for _, m := range s.find(query{topic: topics.DLQ, what: "parkings of event " + ev.EventID.String(), first: s.hashed(topics.DLQ, key),
		from: from, match: func(m *sarama.ConsumerMessage) bool { return bytes.Contains(m.Value, id) }}) {
		ev.Parkings = append(ev.Parkings, parkingOf(m))
	}

	// The order topic: the first delivery and its duplicates, from the
	// id's time until the claim (or publishedWithin after), in the
	// partitions the parkings name first.
	claimed := ev.Created
	for _, c := range ev.Claims {
		if claimed == nil || c.ProcessedAt.After(*claimed) {
			claimed = &c.ProcessedAt
		}
	}
	to := from.Add(slack + publishedWithin)
	if len(ev.Claims) > 0 {
		to = claimed.Add(slack)
	}
	first := s.hashed(topics.Orders, key)
	for _, p := range ev.Parkings {
		if part, ok := originalPartition(p, topics.Orders); ok {
			first = append([]int32{part}, first...)
		}
	}
	matches := func(m *sarama.ConsumerMessage) bool { return isEvent(m, ev.EventID, id) }
	for _, m := range s.find(query{topic: topics.Orders, what: "event " + ev.EventID.String(), first: first, from: from, to: to, match: matches}) {
		ev.addRead(readOf(m))
	}
	// A parking names its message exactly: read it, wherever the window
	// ended.
	for _, p := range ev.Parkings {
		if m := s.at(p, topics.Orders); m != nil && matches(m) {
			ev.addRead(readOf(m))
		}
	}

	// The replays that went through one of its parkings republished it
	// after the replay began.
	for _, a := range replays {
		part, ok := s.replayed(a, ev.Parkings, topics.Orders)
		if !ok {
			continue
		}
		for _, m := range s.find(query{topic: topics.Orders, what: fmt.Sprintf("event %s republished by operator action %d", ev.EventID, a.ID),
			first: []int32{part}, from: a.At.Add(-slack), to: a.At.Add(replayedWithin), match: matches}) {
			ev.addRead(readOf(m))
		}
	}

	s.outcomes(ev, key, id)
}

// outcomes finds ev's outcome events on the outcome topic, after each time
// an outcome may have been recorded.
func (s *searcher) outcomes(ev *Event, key string, id []byte) {
	if !ev.outcomeExpected() {
		return
	}
	var windows [][2]time.Time
	for _, t := range ev.times() {
		windows = append(windows, [2]time.Time{t.Add(-slack), t.Add(relayedWithin)})
	}
	slices.SortFunc(windows, func(a, b [2]time.Time) int { return a[0].Compare(b[0]) })
	merged := windows[:1]
	for _, w := range windows[1:] {
		last := &merged[len(merged)-1]
		if !w[0].After(last[1]) {
			last[1] = maxTime(last[1], w[1])
			continue
		}
		merged = append(merged, w)
	}
	topic := s.t.topics.Outcomes
	for _, w := range merged {
		for _, m := range s.find(query{topic: topic, what: "outcome events of event " + ev.EventID.String(), first: s.hashed(topic, key),
			from: w[0], to: w[1], match: func(m *sarama.ConsumerMessage) bool { return bytes.Contains(m.Value, id) }}) {
			o, cause, err := outcomeOf(m.Value)
			if err != nil || cause != ev.EventID {
				continue // another event's outcome that names this one
			}
			r := readOf(m)
			o.State, o.Read = Published, &r
			ev.addOutcome(o)
		}
	}
}

// outcomeExpected says whether ev may have outcome events: a settled
// attempt, an outcome recorded, a parking for a reason whose failure is
// announced.
func (ev *Event) outcomeExpected() bool {
	if len(ev.Outcomes) > 0 || (ev.Attempt != nil && !charge.Open(ev.Attempt.Status)) {
		return true
	}
	for _, p := range ev.Parkings {
		switch reason.Parse(p.Reason).Code {
		case reason.StaleEvent, reason.PayloadMismatch, reason.NoPaymentMethod, reason.ProviderRejected:
			return true
		}
	}
	return false
}

// find runs q and returns the matching messages: q's first partitions,
// then, when they hold none, the others. Its Search joins the story.
func (s *searcher) find(q query) []*sarama.ConsumerMessage {
	rep := Search{Topic: q.topic, For: q.what, From: q.from.UTC(), Partitions: []int32{}}
	if !q.to.IsZero() {
		to := q.to.UTC()
		rep.To = &to
	}
	defer func() { s.story.Searches = append(s.story.Searches, rep) }()
	if err := s.ctx.Err(); err != nil {
		rep.Stopped = "timeout: not searched"
		return nil
	}
	all, err := s.t.kafka.Partitions(q.topic)
	if err != nil {
		rep.Err = err.Error()
		return nil
	}
	var first []int32
	for _, p := range q.first {
		if slices.Contains(all, p) && !slices.Contains(first, p) {
			first = append(first, p)
		}
	}
	var found []*sarama.ConsumerMessage
	budget := s.t.limits.Messages
	for _, round := range [][]int32{first, slices.DeleteFunc(slices.Clone(all), func(p int32) bool { return slices.Contains(first, p) })} {
		if len(found) > 0 {
			break
		}
		for _, p := range round {
			rep.Partitions = append(rep.Partitions, p)
			got, err := s.read(q, p, &rep.Read, &budget)
			found = append(found, got...)
			if err != nil {
				if errors.Is(err, errStopped) {
					rep.Stopped = stoppedWhy(s.ctx, s.t.limits.Messages)
				} else {
					rep.Err = err.Error()
				}
				rep.Found = len(found)
				return found
			}
		}
	}
	rep.Found = len(found)
	return found
}

func stoppedWhy(ctx context.Context, limit int) string {
	if ctx.Err() != nil {
		return "timeout"
	}
	return fmt.Sprintf("message limit %d reached", limit)
}

// read reads partition p of q's topic from q.from to q.to (or its end
// offset as of now), counting the messages in *read and taking them from
// *budget, and returns the matching ones. It returns errStopped when the
// budget or the deadline ran out.
func (s *searcher) read(q query, p int32, read, budget *int) ([]*sarama.ConsumerMessage, error) {
	start, err := s.t.kafka.GetOffset(q.topic, p, q.from.UnixMilli())
	if err != nil {
		return nil, fmt.Errorf("offset of %s/%d at %s: %w", q.topic, p, q.from.Format(time.RFC3339), err)
	}
	end, err := s.t.kafka.GetOffset(q.topic, p, sarama.OffsetNewest)
	if err != nil {
		return nil, fmt.Errorf("end offset of %s/%d: %w", q.topic, p, err)
	}
	if start < 0 || start >= end { // no record at or after q.from
		return nil, nil
	}
	pc, err := s.consumer.ConsumePartition(q.topic, p, start)
	if err != nil {
		return nil, fmt.Errorf("read %s/%d from %d: %w", q.topic, p, start, err)
	}
	defer pc.Close()
	var found []*sarama.ConsumerMessage
	idle := time.NewTimer(drained)
	defer idle.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return found, errStopped
		case <-idle.C:
			return found, nil
		case err := <-pc.Errors():
			return found, fmt.Errorf("read %s/%d: %w", q.topic, p, err)
		case m := <-pc.Messages():
			idle.Reset(drained)
			if m.Offset >= end || (!q.to.IsZero() && m.Timestamp.After(q.to)) {
				return found, nil
			}
			*read++
			*budget--
			if q.match(m) {
				found = append(found, m)
			}
			if m.Offset+1 >= end {
				return found, nil
			}
			if *budget <= 0 {
				return found, errStopped
			}
		}
	}
}

// at reads the message parking p names on the order topic, nil when it is
// gone (retention) or cannot be read.
func (s *searcher) at(p Parking, orders string) *sarama.ConsumerMessage {
	part, ok := originalPartition(p, orders)
	if !ok || s.ctx.Err() != nil {
		return nil
	}
	_, offset, _ := strings.Cut(p.Original, "@")
	off, err := strconv.ParseInt(offset, 10, 64)
	if err != nil {
		return nil
	}
	pc, err := s.consumer.ConsumePartition(orders, part, off)
	if err != nil {
		s.story.Notes = append(s.story.Notes, fmt.Sprintf("the message parked from %s could not be read there: %v", p.Original, err))
		return nil
	}
	defer pc.Close()
	select {
	case m := <-pc.Messages():
		if m.Offset == off {
			return m
		}
	case <-pc.Errors():
	case <-time.After(drained):
	case <-s.ctx.Done():
	}
	return nil
}

// replayed says whether the replay a republished one of parkings (its
// range covers the parking's offset, and its code, if any, the parking's
// reason), and to which partition of the order topic.
func (s *searcher) replayed(a audit.Action, parkings []Parking, orders string) (int32, bool) {
	var plan dlq.Plan
	if a.Command != dlq.ReplayCommand || json.Unmarshal(a.Details, &plan) != nil {
		return 0, false
	}
	for _, p := range parkings {
		if !plan.Covers(p.Partition, p.Offset, p.Reason) {
			continue
		}
		if part, ok := originalPartition(p, orders); ok {
			return part, true
		}
	}
	return 0, false
}

// hashed is the partition of topic that key hashes to with billing's
// producers' partitioner; none when the key is unknown.
func (s *searcher) hashed(topic, key string) []int32 {
	if key == "" {
		return nil
	}
	parts, err := s.t.kafka.Partitions(topic)
	if err != nil || len(parts) == 0 {
		return nil
	}
	p, err := sarama.NewHashPartitioner(topic).Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(key)}, int32(len(parts)))
	if err != nil {
		return nil
	}
	return []int32{p}
}

// isEvent reports whether m is the order event id: its value names id and,
// when it decodes, is that event (an invalid event is recognised by its
// id alone).
func isEvent(m *sarama.ConsumerMessage, id uuid.UUID, text []byte) bool {
	if !bytes.Contains(m.Value, text) {
		return false
	}
	ev, err := order.Parse(m.Value)
	return err != nil || ev.ID == id
}

// readOf describes m.
func readOf(m *sarama.ConsumerMessage) Read {
	r := Read{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Timestamp: m.Timestamp.UTC(), Key: string(m.Key),
		ReplayedFrom: dlq.Header(m.Headers, dlq.HeaderReplayedFrom)}
	if ev, err := order.Parse(m.Value); err == nil {
		r.OrderID = ev.OrderID
	}
	r.ReplayAction, _ = strconv.ParseInt(dlq.Header(m.Headers, dlq.HeaderReplayAction), 10, 64)
	return r
}

// parkingOf describes the parked message m.
func parkingOf(m *sarama.ConsumerMessage) Parking {
	h := func(k string) string { return dlq.Header(m.Headers, k) }
	return Parking{Read: readOf(m), Reason: h(dlq.HeaderReason), Group: h(dlq.HeaderConsumerGroup),
		Original: h(dlq.HeaderOriginalTopic) + "/" + h(dlq.HeaderOriginalPartition) + "@" + h(dlq.HeaderOriginalOffset)}
}

// originalPartition is the partition of the order topic p was parked from.
func originalPartition(p Parking, orders string) (int32, bool) {
	topic, rest, ok := strings.Cut(p.Original, "/")
	part, _, _ := strings.Cut(rest, "@")
	n, err := strconv.ParseInt(part, 10, 32)
	return int32(n), ok && err == nil && topic == orders
}

// addRead adds r to ev's reads once, in offset order.
func (ev *Event) addRead(r Read) {
	for _, have := range ev.Reads {
		if have.Topic == r.Topic && have.Partition == r.Partition && have.Offset == r.Offset {
			return
		}
	}
	ev.Reads = append(ev.Reads, r)
	slices.SortFunc(ev.Reads, func(a, b Read) int {
		if a.Partition != b.Partition {
			return int(a.Partition - b.Partition)
		}
		return int(a.Offset - b.Offset)
	})
}

// addOutcome adds the published o to ev's outcomes, over the same one in
// the outbox (published since it was read).
func (ev *Event) addOutcome(o Outcome) {
	byID := map[uuid.UUID]Outcome{}
	for _, have := range ev.Outcomes {
		byID[have.EventID] = have
	}
	if have, ok := byID[o.EventID]; ok && have.State == Published {
		return
	}
	byID[o.EventID] = o
	ev.Outcomes = slices.SortedFunc(maps.Values(byID), func(a, b Outcome) int { return a.OccurredAt.Compare(b.OccurredAt) })
}
