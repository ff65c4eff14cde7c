// Package embeddedkafka runs an embedded Kafka-protocol broker for local runs,
// the demo and the tests, and reads a small topic whole (ReadTopic) for
// the demo's summary and the tests' checks.
//
// It is franz-go's kfake: a Kafka protocol implementation in Go that sarama
// reaches over real TCP, exactly as it reaches Apache Kafka. It is a
// development broker, not Apache Kafka: one process, no replication, no
// quotas, listening on 127.0.0.1 only, and in memory unless a data directory
// is given.
package embeddedkafka

import (
	"crypto/tls"
	"fmt"
	"net"
	"strconv"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Options configure a Broker.
type Options struct {
	// Port to listen on, on 127.0.0.1; 0 picks a free one.
	Port int
	// Topics to create, when missing, with Partitions partitions each.
	Topics     []string
	Partitions int32
	// TopicConfigs apply to the topics created here (e.g. retention.ms).
	TopicConfigs map[string]string
	// DataDir persists topics, messages and committed offsets across
	// restarts; "" keeps everything in memory.
	DataDir string
	// TLS, when set, makes the broker speak TLS only.
	TLS *tls.Config
	// SASL users by mechanism ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512");
	// when any is set, clients must authenticate.
	SASL []User
}

// User is a SASL identity the broker accepts.
type User struct {
	Mechanism string
	Name      string
	Password  string
}

// Broker is a running embedded broker.
type Broker struct {
	cluster *kfake.Cluster
}

// Start starts a broker and creates the missing topics.
func Start(opts Options) (*Broker, error) {
	kopts := []kfake.Opt{kfake.NumBrokers(1), kfake.Ports(opts.Port)}
	if opts.DataDir != "" {
		kopts = append(kopts, kfake.DataDir(opts.DataDir))
	}
	if opts.TLS != nil {
		kopts = append(kopts, kfake.TLS(opts.TLS))
	}
	if len(opts.SASL) > 0 {
		kopts = append(kopts, kfake.EnableSASL())
		for _, u := range opts.SASL {
			kopts = append(kopts, kfake.Superuser(u.Mechanism, u.Name, u.Password))
		}
	}
	cluster, err := kfake.NewCluster(kopts...)
	if err != nil {
		return nil, fmt.Errorf("start embedded broker: %w", err)
	}
	b := &Broker{cluster: cluster}
	for _, t := range opts.Topics {
		if err := b.CreateTopic(t, opts.Partitions, opts.TopicConfigs); err != nil {
			cluster.Close()
			return nil, err
		}
	}
	return b, nil
}

// CreateTopic creates topic unless it exists (a restart with a data dir).
func (b *Broker) CreateTopic(topic string, partitions int32, configs map[string]string) error {
	if b.cluster.TopicInfo(topic) != nil {
		return nil
	}
	if err := b.cluster.CreateTopic(topic, partitions, configs); err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	return nil
}

// Addr is the broker's host:port.
func (b *Broker) Addr() string { return b.cluster.ListenAddrs()[0] }

// Port is the broker's port.
func (b *Broker) Port() int {
	_, p, _ := net.SplitHostPort(b.Addr())
	n, _ := strconv.Atoi(p)
	return n
}

// Cluster exposes kfake, for tests that inject broker faults.
func (b *Broker) Cluster() *kfake.Cluster { return b.cluster }

// Close stops the broker, flushing its data dir if it has one.
func (b *Broker) Close() { b.cluster.Close() }
