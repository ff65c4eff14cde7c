package kafkatest_test

import (
	"maps"
	"testing"

	"github.com/IBM/sarama"

	"example.com/billing/internal/config"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/testenv/apachekafka"
	"example.com/billing/internal/testenv/kafkatest"
)

func TestMain(m *testing.M) { kafkatest.Main(m) }

// The broker a test gets takes messages on its own topic and gives them
// back, whatever KAFKA_TEST_BROKER chose.
func TestStart_ProducesAndReads(t *testing.T) {
	b := kafkatest.Start(t, 3)
	client := kafkatest.Client(t, b.Addr())
	kafkatest.Produce(t, client, b.Topic,
		kafkatest.Message{Partition: 0, Key: []byte("1"), Value: []byte("a")},
		kafkatest.Message{Partition: 2, Key: []byte("2"), Value: []byte("b")})
	if got := kafkatest.ReadAll(t, client, b.Topic); len(got) != 2 {
		t.Fatalf("read %d messages, want 2", len(got))
	}
	if end := kafkatest.EndOffsets(t, client, b.DLQTopic); len(end) != 3 {
		t.Fatalf("dead-letter topic has %d partitions, want 3", len(end))
	}
}

// Each secured listener takes a client configured by billing's own code
// from the credentials the broker hands out, and refuses one without them.
func TestStartSecure_Listeners(t *testing.T) {
	cases := []struct {
		name      string
		listener  apachekafka.Listener
		mechanism string
	}{
		{"mutual TLS", apachekafka.MutualTLS, ""},
		{"SCRAM-SHA-512 over TLS", apachekafka.SASLOverTLS, "SCRAM-SHA-512"},
		{"SCRAM-SHA-256 over TLS", apachekafka.SASLOverTLS, "SCRAM-SHA-256"},
		{"PLAIN over TLS", apachekafka.SASLOverTLS, "PLAIN"},
		{"SCRAM-SHA-512 without TLS", apachekafka.SASLPlaintext, "SCRAM-SHA-512"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := kafkatest.StartSecure(t, c.listener, c.mechanism, 1)
			if err := connect(b.Env()); err != nil {
				t.Fatalf("with the credentials: %v", err)
			}
			without := b.Env()
			for k := range b.Creds.Env() {
				delete(without, k)
			}
			if c.listener == apachekafka.MutualTLS {
				maps.Copy(without, map[string]string{"KAFKA_TLS_ENABLED": "true", "KAFKA_TLS_CA_FILE": b.Creds.CAFile})
			}
			if c.listener == apachekafka.SASLOverTLS {
				maps.Copy(without, map[string]string{"KAFKA_TLS_ENABLED": "true", "KAFKA_TLS_CA_FILE": b.Creds.CAFile,
					"KAFKA_SASL_MECHANISM": c.mechanism, "KAFKA_SASL_USERNAME": b.Creds.User, "KAFKA_SASL_PASSWORD": "wrong"})
			}
			if err := connect(without); err == nil {
				t.Fatalf("connected without the credentials")
			}
		})
	}
}

func connect(env map[string]string) error {
	var k config.Kafka
	if err := config.Load(env, &k); err != nil {
		return err
	}
	cfg, err := kafka.NewConfig(k)
	if err != nil {
		return err
	}
	cfg.Metadata.Retry.Max = 0
	c, err := sarama.NewClient(k.Brokers, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Partitions(k.Topic)
	return err
}
