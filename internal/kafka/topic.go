package kafka

import (
	"fmt"
	"strconv"
	"time"

	"github.com/IBM/sarama"
)

// TopicLimits are the topic settings billing's guarantees depend on.
type TopicLimits struct {
	// Retention is how long the broker keeps messages (retention.ms);
	// Forever when retention.ms is -1.
	Retention time.Duration
	Forever   bool
	// MaxMessageBytes is the largest record batch the topic accepts.
	MaxMessageBytes int
}

// DescribeTopic reads topic's retention.ms and max.message.bytes through the
// admin API.
func DescribeTopic(admin sarama.ClusterAdmin, topic string) (TopicLimits, error) {
	results, err := admin.DescribeConfigs([]*sarama.ConfigResource{{
		Type:        sarama.TopicResource,
		Name:        topic,
		ConfigNames: []string{"retention.ms", "max.message.bytes"},
	}}, sarama.DescribeConfigsOptions{})
	if err != nil {
		return TopicLimits{}, fmt.Errorf("describe topic %s: %w", topic, err)
	}
	var lim TopicLimits
	for _, r := range results {
		if r.Name != topic {
			continue
		}
		if r.ErrorCode != sarama.ErrNoError {
			return TopicLimits{}, fmt.Errorf("describe topic %s: %w %s", topic, r.ErrorCode, r.ErrorMsg)
		}
		for _, e := range r.Configs {
			n, err := strconv.ParseInt(e.Value, 10, 64)
			if err != nil {
				return TopicLimits{}, fmt.Errorf("topic %s: %s=%q: %w", topic, e.Name, e.Value, err)
			}
			switch e.Name {
			case "retention.ms":
				lim.Forever = n < 0
				lim.Retention = time.Duration(n) * time.Millisecond
			case "max.message.bytes":
				lim.MaxMessageBytes = int(n)
			}
		}
	}
	return lim, nil
}

// Shortfall is how much longer the topic can redeliver a message than the
// dedup store, with retention keep, remembers it: 0 when it cannot.
func (l TopicLimits) Shortfall(keep time.Duration) (time.Duration, bool) {
	if l.Forever {
		return 0, true
	}
	return max(l.Retention-keep, 0), false
}
