package main

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/cenkalti/backoff/v5"

	"example.com/billing/internal/config"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/kafkaacl"
)

// connectKafka connects to the brokers, waiting while none answers, until
// ctx ends.
func connectKafka(ctx context.Context, k config.Kafka, c config.Consumer, log *slog.Logger) (sarama.Client, error) {
	cfg, err := kafka.ConsumerConfig(k)
	if err != nil {
		return nil, err
	}
	if seedDesign {
		// sarama sends one request at a time per broker connection, so a
		// synchronous commit waits behind the fetch long-poll (up to
		// MaxWaitTime, 500 ms) when the coordinator leads the partitions
		// too. Polling briefly keeps that wait from dominating the
		// commit per message.
		cfg.Consumer.MaxWaitTime = 10 * time.Millisecond
	}
	retry := backoff.NewExponentialBackOff()
	retry.MaxInterval = 10 * time.Second
	for {
		client, err := awaitKafka(ctx, log, k.Brokers, "an answer to the first metadata request (connecting)", func() (sarama.Client, error) {
			return sarama.NewClient(k.Brokers, cfg)
		}, func(c sarama.Client) { _ = c.Close() })
		if err == nil || ctx.Err() != nil {
			return client, err
		}
		wait := retry.NextBackOff()
		log.Warn("kafka unreachable; waiting", "brokers", k.Brokers, "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// Reports while waiting for Kafka: the first after firstReport, then at
// doubling intervals up to maxReport.
const (
	firstReport = 5 * time.Second
	maxReport   = time.Minute
)

// awaitKafka runs step, a call into sarama, and returns its answer. sarama's
// calls take no context, and one can wait for minutes on a broker that
// accepts connections and never answers (each request up to
// Net.ReadTimeout, per broker, per retry), so awaitKafka says what it is
// waiting for, on which brokers, after firstReport and then with backoff:
// a hang is never silent. When ctx ends first it returns ctx's error at
// once; step finishes in the background, and release (when not nil) frees
// what it made.
func awaitKafka[T any](ctx context.Context, log *slog.Logger, brokers []string, what string, step func() (T, error), release func(T)) (T, error) {
	type answer struct {
		v   T
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		v, err := step()
		answered <- answer{v, err}
	}()
	began := time.Now()
	every := firstReport
	report := time.NewTimer(every)
	defer report.Stop()
	for {
		select {
		case a := <-answered:
			return a.v, a.err
		case <-ctx.Done():
			if release != nil {
				go func() {
					if a := <-answered; a.err == nil {
						release(a.v)
					}
				}()
			}
			var zero T
			return zero, ctx.Err()
		case <-report.C:
			log.Warn("waiting for Kafka: no answer yet", "brokers", brokers, "waiting_for", what, "waited", time.Since(began))
			every = min(2*every, maxReport)
			report.Reset(every)
		}
	}
}

// watchSession says, after firstReport and then with backoff, that the
// consumer is waiting for a group session while it has none: joining can
// wait on a broker that does not answer, or on a rebalance that does not
// end, and /readyz alone would not say why.
func watchSession(ctx context.Context, ready func() bool, log *slog.Logger, brokers []string, group string) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var since time.Time // when the session was lost; zero while there is one
	next, gap := firstReport, firstReport
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			switch {
			case ready():
				since, next, gap = time.Time{}, firstReport, firstReport
			case since.IsZero():
				since = now
			case now.Sub(since) >= next:
				log.Warn("waiting for Kafka: no consumer group session yet", "brokers", brokers, "group", group, "waited", now.Sub(since))
				gap = min(2*gap, maxReport)
				next += gap
			}
		}
	}
}

// logStart says where the consumer group starts reading. A group without
// committed offsets starts at the oldest offset of every partition: the
// whole topic is processed again. processed_event is per group, so its
// events are claimed again; an event whose charge attempt is settled is not
// sent to the provider again (outcome duplicate), but every invalid message
// is parked in the dead-letter topic once more. A new KAFKA_GROUP_ID next to an existing
// one is a decision to make knowingly.
func logStart(ctx context.Context, client sarama.Client, k config.Kafka, log *slog.Logger) {
	// A busy coordinator is worth a short wait for this line, not the start.
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	committed, err := kafka.CommittedOffsets(ctx, client, k.GroupID, k.Topic)
	if err != nil {
		log.Warn("cannot read the consumer group's committed offsets", "group", k.GroupID, "err", err)
		return
	}
	var fresh []int32
	var reprocess int64
	for p, offset := range committed {
		if offset >= 0 {
			continue
		}
		fresh = append(fresh, p)
		oldest, err1 := client.GetOffset(k.Topic, p, sarama.OffsetOldest)
		newest, err2 := client.GetOffset(k.Topic, p, sarama.OffsetNewest)
		if err1 == nil && err2 == nil {
			reprocess += newest - oldest
		}
	}
	slices.Sort(fresh)
	switch {
	case len(fresh) == 0:
		log.Info("consumer group resumes from its committed offsets", "group", k.GroupID, "topic", k.Topic)
	case len(fresh) == len(committed) && reprocess == 0:
		log.Info("new consumer group: it starts from the oldest offset of the topic, which holds no message", "group", k.GroupID, "topic", k.Topic)
	case len(fresh) == len(committed):
		log.Warn("new consumer group: it starts from the oldest offset, so every message on the topic is processed; if another group processed them already, orders already charged are not charged again, but invalid messages are parked in the dead-letter topic again",
			"group", k.GroupID, "topic", k.Topic, "messages", reprocess)
	default:
		log.Info("consumer group resumes from its committed offsets; partitions without one start from their oldest offset",
			"group", k.GroupID, "topic", k.Topic, "from_oldest", fresh, "messages", reprocess)
	}
}

// permissions is what serve knows of its principal's Kafka permissions: the
// ones it lacks, for /readyz.
type permissions struct {
	mu      sync.Mutex
	missing []string
}

// Missing names the permissions found missing by the last check.
func (p *permissions) Missing() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.missing)
}

// set records the last check's answer and reports whether it changed.
func (p *permissions) set(missing []kafkaacl.ACL) bool {
	names := make([]string, len(missing))
	for i, a := range missing {
		names[i] = a.String()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	changed := !slices.Equal(names, p.missing)
	p.missing = names
	return changed
}

// aclRecheck is how often serve asks again, once running, whether its
// principal still has every permission: an ACL removed under a running
// service makes it unready within this, rather than at the first message
// that needs it.
const aclRecheck = 30 * time.Second

// awaitACLs asks the brokers whether serve's principal has every
// permission in acls, and waits, with backoff and an error log naming each
// missing one and why serve needs it, until it has: nothing is consumed
// before, so a missing ACL loses nothing and parks nothing. An ACL granted
// meanwhile is picked up without a restart.
func awaitACLs(ctx context.Context, log *slog.Logger, client sarama.Client, k config.Kafka, acls []kafkaacl.ACL, p *permissions) error {
	retry := backoff.NewExponentialBackOff()
	retry.InitialInterval = time.Second
	retry.MaxInterval = aclRecheck
	for {
		missing, err := awaitKafka(ctx, log, k.Brokers, "the answer to which ACLs this client has", func() ([]kafkaacl.ACL, error) {
			return kafkaacl.Missing(client, acls)
		}, nil)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wait := retry.NextBackOff()
		switch {
		case err != nil:
			// A broker away (a restart, a coordinator moving): ask again
			// soon, as the consumer joins again, not after a backoff grown
			// while waiting for an ACL.
			wait = min(wait, 2*time.Second)
			log.Warn("cannot ask the brokers for this client's ACLs; retrying", "err", err, "retry_in", wait)
		case len(missing) == 0:
			p.set(nil)
			log.Info("kafka ACLs: the client has every permission serve needs", "principal", kafkaacl.Principal(k), "acls", len(acls))
			return nil
		default:
			p.set(missing)
			log.Error("kafka ACLs missing: serve consumes nothing until they are granted (docs/deployment.md#kafka-acls)",
				"principal", kafkaacl.Principal(k), "missing", describeACLs(missing), "retry_in", wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// watchACLs asks again every aclRecheck until ctx ends, and says when a
// permission went missing or came back.
func watchACLs(ctx context.Context, log *slog.Logger, client sarama.Client, k config.Kafka, acls []kafkaacl.ACL, p *permissions) {
	tick := time.NewTicker(aclRecheck)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		missing, err := kafkaacl.Missing(client, acls)
		switch {
		case err != nil:
			log.Debug("cannot ask the brokers for this client's ACLs", "err", err)
		case !p.set(missing):
		case len(missing) == 0:
			log.Info("kafka ACLs: the client has every permission serve needs again", "principal", kafkaacl.Principal(k))
		default:
			log.Error("kafka ACLs missing: what needs them fails until they are granted (docs/deployment.md#kafka-acls)",
				"principal", kafkaacl.Principal(k), "missing", describeACLs(missing))
		}
	}
}

// describeACLs names each ACL with the reason it is needed.
func describeACLs(acls []kafkaacl.ACL) []string {
	out := make([]string, len(acls))
	for i, a := range acls {
		out[i] = a.Explain()
	}
	return out
}
