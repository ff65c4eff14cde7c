package dlq_test

import (
	"testing"

	"example.com/billing/internal/testenv/kafkatest"
)

// TestMain stops the Apache Kafka cluster the tests shared, if they
// started one (see kafkatest.Start).
func TestMain(m *testing.M) { kafkatest.Main(m) }
