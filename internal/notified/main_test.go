package notified_test

import (
	"testing"

	"example.com/billing/internal/testenv/dbtest"
)

// TestMain stops the PostgreSQL server the tests started, if none answered
// (see dbtest).
func TestMain(m *testing.M) { dbtest.Main(m) }
