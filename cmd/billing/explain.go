package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/config"
	"example.com/billing/internal/explain"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/kafkaacl"
	"example.com/billing/internal/postgres"
)

const explainHelp = `
Tells one order event's whole story, or every event of an order, from the
database and Kafka: where the event was read (topic, partition, offset,
when), its claim in processed_event, its charge attempt with the
provider's answers and ids (status, amounts, requests, last error, decline
code, created, settled), whether it waits for its order's payment in
progress, its payment outcome events (recorded, published on
KAFKA_OUTCOME_TOPIC, or dead), its parkings in KAFKA_DLQ_TOPIC with their
reasons, the replays that republished it, the provider's notifications
billing kept, and the operator actions on it. It changes nothing.

billing stores no offsets: each copy is found by time. The time in the
event's UUID v7 id, its claim and its settle are turned into offsets by
ListOffsets on each partition, and a bounded read from there looks for the
event id: the order topic from the id's time to the claim (10 minutes
when it was never claimed), the dead-letter topic from the id's time to
its end, the outcome topic for 10 minutes after each time an outcome may
have been recorded, and the order topic for 30 minutes after each replay
that went through one of its parkings. The partition the order id hashes
to is read first. Every search stops at --max-messages, and all of them
at --timeout; the output says what each covered, and when it found nothing
within its bounds.

An order id explains each event billing recorded for it: its attempts
(declined and rejected ones since --since), its waiting events, their
outcomes. An event of it that left no row naming the order (a duplicate of
an order charged already, one parked before its claim) is explained by its
own id. Human text by default, --json for tools.`

// explainConfig is what explain reads from the environment.
type explainConfig struct {
	Kafka    config.Kafka
	Database config.Database
	Provider string `env:"PAYMENT_PROVIDER" envDefault:"contract" notEmpty:"true" help:"the provider whose notifications billing kept (adyen's, in notified_payment), shown with the attempts"`
	Log      config.Log
}

func (c *explainConfig) Validate() error {
	return errors.Join(c.Kafka.Validate(), c.Database.Validate(), c.Log.Validate())
}

// explainCmd tells an event's or an order's story.
func explainCmd(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	var cfg explainConfig
	fs := newFlagSet("explain", about{synopsis: "<eventId or orderId> [--json] [flags]", description: explainHelp, env: &cfg,
		example: "KAFKA_BROKERS=kafka-1:9092 DATABASE_URL=... billing explain 4711"})
	asJSON := fs.Bool("json", false, "print JSON for tools instead of text")
	useKafka := fs.Bool("kafka", true, "search the topics (false: the database alone)")
	maxMessages := fs.Int("max-messages", 50000, "the most messages one search reads, its partitions together")
	timeout := fs.Duration("timeout", 30*time.Second, "how long all the Kafka searches may take together")
	since := fs.Duration("since", 30*24*time.Hour, "how far back an order's declined and rejected attempts are looked for (its succeeded and open ones always are)")
	subject, help, err := parseWithArgument(fs, args, stdout)
	if help || err != nil {
		return err
	}
	if *maxMessages < 1 || *timeout <= 0 || *since <= 0 {
		return errors.New("explain: --max-messages, --timeout and --since must be positive")
	}
	if err := config.Load(environ, &cfg); err != nil {
		return err
	}
	log := newLogger(stderr, cfg.Log)
	db, err := postgres.Open(cfg.Database.URL, 2)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer db.Close()

	var client sarama.Client
	var notes []string
	if *useKafka {
		var why string
		client, why = explainClient(cfg.Kafka)
		if client != nil {
			defer client.Close()
		} else {
			notes = append(notes, why)
			log.Warn("explaining from the database alone", "why", why)
		}
	}
	teller := explain.NewTeller(db, client, explain.Topics{Orders: cfg.Kafka.Topic, DLQ: cfg.Kafka.DLQTopic, Outcomes: cfg.Kafka.OutcomeTopic},
		cfg.Provider, explain.Limits{Messages: *maxMessages, Timeout: *timeout, Declined: *since})
	st, err := teller.Tell(ctx, subject)
	if err != nil {
		if postgres.IsConfigError(err) {
			return fmt.Errorf("DATABASE_URL: %w", err)
		}
		return fmt.Errorf("explain: %w", err)
	}
	st.Notes = append(notes, st.Notes...)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	return explain.WriteText(stdout, st)
}

// explainClient connects to the brokers for explain's searches, and checks
// that it may read the three topics; nil, with why, when it cannot: the
// story is then told from the database alone.
func explainClient(k config.Kafka) (sarama.Client, string) {
	cfg, err := kafka.NewConfig(k)
	if err != nil {
		return nil, "Kafka was not searched: " + err.Error()
	}
	cfg.Consumer.Return.Errors = true
	// A search ends at a partition's end: a fetch need not wait long for
	// records that are not coming.
	cfg.Consumer.MaxWaitTime = 100 * time.Millisecond
	client, err := sarama.NewClient(k.Brokers, cfg)
	if err != nil {
		return nil, fmt.Sprintf("Kafka was not searched: connect to %s: %v", strings.Join(k.Brokers, ","), err)
	}
	if err := kafkaacl.Require(client, k, kafkaacl.Explain(k)); err != nil {
		client.Close()
		return nil, "Kafka was not searched: " + err.Error()
	}
	return client, ""
}
