// Package kafka is billing's adapter to Apache Kafka through sarama: the
// sarama configuration of billing's consumer and producers (TLS, SASL),
// what billing reads of topics and offsets (ends, committed offsets, how
// far transaction markers go), and the trace context carried in record
// headers. It runs nothing itself: the consumer group member that feeds
// events to billing (package consumer) and the dead-letter writer (package
// dlq) are built on it, and serve configures the outcome relay's producer
// (package outbox) with it.
package kafka

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"time"

	"github.com/IBM/sarama"
	"github.com/xdg-go/scram"

	"example.com/billing/internal/config"
)

// NewConfig returns the sarama configuration shared by billing's consumer,
// dead-letter producer, admin calls and the produce tool: broker version,
// client id, TLS and SASL from k.
func NewConfig(k config.Kafka) (*sarama.Config, error) {
	cfg := sarama.NewConfig()
	v, err := sarama.ParseKafkaVersion(k.Version)
	if err != nil {
		return nil, fmt.Errorf("KAFKA_VERSION: %w", err)
	}
	cfg.Version = v
	cfg.ClientID = k.ClientID
	// Every consumer billing runs reads committed records only: a record
	// of a transaction its producer aborted never happened, and must never
	// be charged, recorded or parked. Not a setting: a payment service has
	// no use for records that may be rolled back (docs/events.md). Plain
	// producers see no difference.
	cfg.Consumer.IsolationLevel = sarama.ReadCommitted
	// Topics are created by their owners (deploy, devkafka), never by a
	// typo in a consumer's configuration.
	cfg.Metadata.AllowAutoTopicCreation = false
	// A broker that accepts connections and never answers must not hold a
	// metadata request for minutes. Without a Metadata.Timeout sarama tries
	// every broker Metadata.Retry.Max+1 times, each time waiting up to
	// Net.ReadTimeout (30 s): 2 minutes for one broker, 6 for three, before
	// its caller hears of a failure. With it, no new attempt starts past the
	// timeout, so a refresh fails after about one ReadTimeout and the caller
	// reports it and retries. ReadTimeout itself stays: a JoinGroup answer
	// can legitimately take that long. Dialling is a TCP (and TLS)
	// handshake, for which 10 s is plenty; a broker that never accepts is
	// then reported three times sooner.
	cfg.Metadata.Timeout = 15 * time.Second
	cfg.Net.DialTimeout = 10 * time.Second

	if k.TLSEnabled {
		tlsCfg, err := tlsConfig(k)
		if err != nil {
			return nil, err
		}
		cfg.Net.TLS.Enable = true
		cfg.Net.TLS.Config = tlsCfg
	}
	if k.SASLMechanism != "" {
		cfg.Net.SASL.Enable = true
		cfg.Net.SASL.Handshake = true
		cfg.Net.SASL.User = k.SASLUsername
		cfg.Net.SASL.Password = k.SASLPassword
		switch k.SASLMechanism {
		case sarama.SASLTypePlaintext:
			cfg.Net.SASL.Mechanism = sarama.SASLTypePlaintext
		case sarama.SASLTypeSCRAMSHA256:
			cfg.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA256
			cfg.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: scram.SHA256} }
		case sarama.SASLTypeSCRAMSHA512:
			cfg.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA512
			cfg.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: scram.SHA512} }
		default:
			return nil, fmt.Errorf("KAFKA_SASL_MECHANISM: unsupported %q", k.SASLMechanism)
		}
	}
	return cfg, nil
}

// ConsumerConfig adds the consumer group settings to NewConfig's.
func ConsumerConfig(k config.Kafka) (*sarama.Config, error) {
	cfg, err := NewConfig(k)
	if err != nil {
		return nil, err
	}
	// A new group starts from the oldest offset: the events published before
	// billing first ran must be charged too.
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	// sarama commits the *marked* offsets once a second and when a session
	// ends; billing marks a message only after its transaction committed or
	// its DLQ write was acknowledged, and never past an unfinished one.
	cfg.Consumer.Offsets.AutoCommit.Enable = true
	cfg.Consumer.Offsets.AutoCommit.Interval = time.Second
	cfg.Consumer.Return.Errors = true
	// Fetch in small bites, not sarama's 1 MiB per partition: what a fetch
	// brought stays in memory, decoded, until billing has taken it, paused
	// or not, and large fetches are most of the live heap when the provider
	// is slow (BENCHMARKS.md measures it). 16 KiB is still a few hundred
	// events of a few hundred bytes; a larger batch is still fetched whole
	// (Fetch.Max is 0).
	cfg.Consumer.Fetch.Default = 16 << 10
	cfg.Consumer.Fetch.MaxBytes = 2 << 20
	// Cooperative-sticky: a rebalance moves only the partitions that must
	// move, the others keep being processed.
	cfg.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyCooperativeSticky()}
	if k.InstanceID != "" {
		// Static membership: a restarted pod with the same id gets its
		// partitions back without a rebalance, if it returns within the
		// session timeout.
		cfg.Consumer.Group.InstanceId = k.InstanceID
		cfg.Consumer.Group.Session.Timeout = 45 * time.Second
		cfg.Consumer.Group.Heartbeat.Interval = 3 * time.Second
	}
	return cfg, nil
}

// ProducerConfig adds the settings of an idempotent producer that waits for
// all in-sync replicas: a retried send is written once, and an acknowledged
// one survives the loss of a broker.
func ProducerConfig(k config.Kafka) (*sarama.Config, error) {
	cfg, err := NewConfig(k)
	if err != nil {
		return nil, err
	}
	cfg.Producer.Idempotent = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Net.MaxOpenRequests = 1 // required by the idempotent producer
	cfg.Producer.Return.Successes = true
	cfg.Producer.Return.Errors = true
	cfg.Producer.Retry.Max = 10
	cfg.Producer.Retry.Backoff = 250 * time.Millisecond
	cfg.Producer.Compression = sarama.CompressionZSTD
	cfg.Producer.Partitioner = sarama.NewHashPartitioner
	return cfg, nil
}

// ZstdLevel is the zstd level of the messages billing itself writes (the
// dead-letter and outcome producers): the fastest. At sarama's default
// level an encoder keeps 1.6 MB of tables, and 18 MB once it has
// compressed one batch larger than its 128 KiB block (a history of twice
// its 8 MiB window); at the fastest, 0.6 MB, and 8.6 MB past its 64 KiB
// block. sarama keeps up to GOMAXPROCS idle encoders per level for the life
// of the process. Outcome events compress as well (30 KB of them: 5.4×,
// against 5.2× at the default level; klauspost/compress v1.20.4).
const ZstdLevel = 1

// OutcomeBatchBytes bounds a batch of the outcome producer, uncompressed
// (sarama's Producer.MaxMessageBytes bounds a partition's batch as well as
// a record): below zstd's fastest block, so that its encoders never grow a
// history (see ZstdLevel). A relay round of 500 outcomes of ~400 bytes to
// a topic of one or two partitions is larger; it is sent in more batches.
const OutcomeBatchBytes = 60 << 10

// OutcomeProducerConfig is ProducerConfig for the outbox relay's payment
// outcome events: zstd at ZstdLevel, batches within OutcomeBatchBytes. A
// record larger than that is refused by the producer; the relay takes no
// value that large (serve bounds Relay.MaxBytes by it).
func OutcomeProducerConfig(k config.Kafka) (*sarama.Config, error) {
	cfg, err := ProducerConfig(k)
	if err != nil {
		return nil, err
	}
	cfg.Producer.CompressionLevel = ZstdLevel
	cfg.Producer.MaxMessageBytes = OutcomeBatchBytes
	return cfg, nil
}

func tlsConfig(k config.Kafka) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if k.TLSCAFile != "" {
		pem, err := os.ReadFile(k.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("KAFKA_TLS_CA_FILE: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("KAFKA_TLS_CA_FILE: no PEM certificate in %s", k.TLSCAFile)
		}
		cfg.RootCAs = pool
	}
	if k.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(k.TLSCertFile, k.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("KAFKA_TLS_CERT_FILE/KAFKA_TLS_KEY_FILE: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// scramClient adapts xdg-go/scram to sarama's SCRAMClient.
type scramClient struct {
	hash scram.HashGeneratorFcn
	conv *scram.ClientConversation
}

func (s *scramClient) Begin(user, password, authzID string) error {
	c, err := s.hash.NewClient(user, password, authzID)
	if err != nil {
		return err
	}
	s.conv = c.NewConversation()
	return nil
}

func (s *scramClient) Step(challenge string) (string, error) { return s.conv.Step(challenge) }
func (s *scramClient) Done() bool                            { return s.conv.Done() }
