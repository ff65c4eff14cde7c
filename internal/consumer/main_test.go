package consumer_test

import (
	"testing"

	"example.com/billing/internal/testenv/dbtest"
	"example.com/billing/internal/testenv/kafkatest"
)

// TestMain stops what the tests shared, if they started it: the Apache
// Kafka cluster (see kafkatest.Start) and the PostgreSQL server (when none
// answered, see dbtest).
func TestMain(m *testing.M) { kafkatest.Main(dbtest.WithServer(m)) }
