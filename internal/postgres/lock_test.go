package postgres_test

import (
	"testing"

	"github.com/pressly/goose/v3/lock"

	"example.com/billing/internal/postgres"
)

// Pinned: goose's default, so that a goose upgrade cannot change which
// row of goose_lock serializes migrate runs.
func TestLockMigrations_IsGoosesDefault(t *testing.T) {
	t.Parallel()
	if postgres.LockMigrations != lock.DefaultLockID {
		t.Errorf("LockMigrations = %d, goose's default is %d", postgres.LockMigrations, lock.DefaultLockID)
	}
}
