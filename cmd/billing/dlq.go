package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"example.com/billing/internal/audit"
	"example.com/billing/internal/config"
	"example.com/billing/internal/dlq"
	"example.com/billing/internal/dlq/reason"
	"example.com/billing/internal/kafkaacl"
	"example.com/billing/internal/postgres"
)

const dlqUsage = `Usage: billing dlq <command> [flags]

Commands:
  replay   republish parked messages, unchanged, to the topic they came from

billing dlq replay -h describes its flags.
`

// dlqCmd dispatches the dead-letter topic's commands.
func dlqCmd(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, dlqUsage)
		return errors.New("dlq: a command is required")
	}
	switch args[0] {
	case "replay":
		return dlqReplayCmd(ctx, args[1:], environ, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, dlqUsage)
		return nil
	}
	fmt.Fprint(stderr, dlqUsage)
	return fmt.Errorf("dlq: unknown command %q", args[0])
}

const dlqReplayHelp = `
Republishes the messages parked in KAFKA_DLQ_TOPIC, unchanged (same key,
same value, so the same event ids), to the topic and partition they were
parked from (x-original-topic, else KAFKA_TOPIC), once the cause is fixed.
billing deduplicates them as it does any redelivery: an event that was
charged meanwhile is skipped, one that still fails is parked again.

The original headers are kept (trace context among them) except the
dead-letter ones; x-dlq-replayed-from: <dlq-partition>/<dlq-offset> is
added. Nothing but partition, offset, key and reason is printed: values may
hold customer data.

It is a batch job: it goes up to the dead-letter topic's end offsets as of
its start, then exits. Its progress is committed to a consumer group of its
own (--group) only after each republished message was acknowledged, so a
run that stopped is resumed by the next one with the same flags, and a
committed message is never republished. With --code the default group is
named after the reason code, so that the messages passed over stay there
for a replay of their own code. It reads the Kafka settings as serve does.

A replay changes money-relevant state (a replayed event may be charged):
before it republishes anything it records who (--by), why (--reason,
required but for a dry run) and what (the dead-letter ranges, --code,
--max, the group) in operator_action (DATABASE_URL), and marks every
message it republishes with the action's id (header
x-dlq-replay-action), which billing explain reads. When the record
fails, nothing is republished. billing audit lists the replays.`

// reasonCodes lists the x-dlq-reason codes billing writes.
func reasonCodes() string {
	codes := make([]string, len(reason.Codes))
	for i, c := range reason.Codes {
		codes[i] = string(c)
	}
	return strings.Join(codes, ", ")
}

// dlqConfig is what dlq replay reads from the environment: the broker,
// and the database where it records the operator's action.
type dlqConfig struct {
	Kafka    config.Kafka
	Database config.Database
	Log      config.Log
}

func (c *dlqConfig) Validate() error {
	return errors.Join(c.Kafka.Validate(), c.Database.Validate(), c.Log.Validate())
}

// dlqReplayCmd republishes parked messages.
func dlqReplayCmd(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	var cfg dlqConfig
	fs := newFlagSet("dlq replay", about{synopsis: "[flags]", description: dlqReplayHelp, env: &cfg,
		example: `KAFKA_BROKERS=kafka-1:9092 DATABASE_URL=... billing dlq replay --code provider-rejected --reason "INC-42: the provider's fix is deployed"`})
	only := fs.String("code", "", "replay only the messages whose x-dlq-reason code is this: "+reasonCodes()+" (default: all)")
	dryRun := fs.Bool("dry-run", false, "list what would be replayed; publish, commit and record nothing")
	maxN := fs.Int("max", 0, "republish at most this many messages, then stop (0: no limit); a later run goes on")
	group := fs.String("group", "", "consumer group that tracks the replay's progress (default: <KAFKA_GROUP_ID>-dlq-replay, and -<code> with --code)")
	op := operatorFlags(fs, dlq.ReplayCommand)
	if help, err := parseSubcommandFlags(fs, args, stdout); help || err != nil {
		return err
	}
	if *only != "" && !slices.Contains(reason.Codes, reason.Code(*only)) {
		return fmt.Errorf("dlq replay: --code %q is not a reason code; use one of %s", *only, reasonCodes())
	}
	if *only == "" && slices.Contains(reason.Codes, reason.Code(*op.reason)) {
		// --reason named the code to replay before it said why: such a
		// command line would now replay every code.
		return fmt.Errorf("dlq replay: --reason %q is a reason code: --code %s replays the messages parked for it, --reason says why you replay them", *op.reason, *op.reason)
	}
	if *maxN < 0 {
		return errors.New("dlq replay: --max must not be negative")
	}
	if !*dryRun {
		if err := op.check(); err != nil {
			return err
		}
	}
	if err := config.Load(environ, &cfg); err != nil {
		return err
	}
	if *group == "" {
		*group = kafkaacl.ReplayGroupPrefix(cfg.Kafka)
		if *only != "" {
			*group += "-" + *only
		}
	}
	if *group == cfg.Kafka.GroupID {
		// Joining serve's group with another topic would upset its
		// assignment, and its offsets are those of the order topic.
		return fmt.Errorf("dlq replay: --group must not be KAFKA_GROUP_ID (%s), the service's own group", cfg.Kafka.GroupID)
	}
	log := newLogger(stderr, cfg.Log)
	log.Info("dlq replay starting", "version", version, "kafka", cfg.Kafka, "group", *group,
		"code", *only, "dry_run", *dryRun, "max", *maxN, "by", *op.by, "why", *op.reason)

	db, err := postgres.Open(cfg.Database.URL, 1)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer db.Close()

	verb := "replayed"
	if *dryRun {
		verb = "would replay"
	}
	var action audit.Action
	rep, err := dlq.Replay(ctx, cfg.Kafka, dlq.ReplayOptions{
		DLQTopic: cfg.Kafka.DLQTopic,
		Topic:    cfg.Kafka.Topic,
		Group:    *group,
		Reason:   reason.Code(*only),
		Max:      *maxN,
		DryRun:   *dryRun,
		OnMessage: func(r dlq.Replayed) {
			if r.Gone != "" {
				fmt.Fprintf(stdout, "cannot replay %s/%d@%d key=%q reason=%q: %s; passed over\n",
					cfg.Kafka.DLQTopic, r.DLQPartition, r.DLQOffset, r.Key, r.Reason, r.Gone)
				return
			}
			fmt.Fprintf(stdout, "%s %s/%d@%d key=%q -> %s/%d reason=%q\n",
				verb, cfg.Kafka.DLQTopic, r.DLQPartition, r.DLQOffset, r.Key, r.Topic, r.Partition, r.Reason)
		},
		Begin: func(ranges map[int32]dlq.Range) (string, error) {
			var err error
			action, err = op.record(ctx, db, cfg.Kafka.DLQTopic, dlq.Plan{DLQTopic: cfg.Kafka.DLQTopic, Group: *group, Code: *only, Max: *maxN, Ranges: ranges})
			if err != nil {
				if postgres.IsConfigError(err) {
					return "", fmt.Errorf("DATABASE_URL: %w", err)
				}
				return "", err
			}
			log.Info("operator action recorded", "action", action.ID, "by", action.By, "reason", action.Reason)
			return strconv.FormatInt(action.ID, 10), nil
		},
	}, log)
	summary := fmt.Sprintf("%s %d, passed over %d with another reason, from %s (group %s)",
		verb, rep.Replayed, rep.Skipped, cfg.Kafka.DLQTopic, *group)
	if action.ID != 0 {
		summary += fmt.Sprintf("; operator action %d (by %s)", action.ID, action.By)
	}
	if rep.Gone > 0 {
		summary += fmt.Sprintf("; %d parked as references (oversize) could not be replayed: their originals are gone from %s", rep.Gone, cfg.Kafka.Topic)
	}
	switch {
	case err != nil && errors.Is(err, context.Canceled):
		fmt.Fprintln(stdout, summary)
		return errors.New("dlq replay: interrupted; what was republished is committed, run it again to go on")
	case err != nil:
		fmt.Fprintln(stdout, summary)
		return err // named "dlq replay: ..." already
	}
	if rep.MaxReached {
		summary += fmt.Sprintf("; stopped at --max %d, run again for the rest", *maxN)
	}
	if *dryRun {
		summary = "dry run: " + summary + "; nothing was published or committed"
	}
	fmt.Fprintln(stdout, summary)
	log.Info("dlq replay finished", "replayed", rep.Replayed, "skipped", rep.Skipped, "gone", rep.Gone, "max_reached", rep.MaxReached, "dry_run", rep.DryRun)
	return nil
}
