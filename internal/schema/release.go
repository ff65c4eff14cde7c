//go:build !upgradetest

package schema

import (
	"io/fs"

	"example.com/billing/db/migrations"
)

// Oldest is the oldest schema this release runs on: the newest migration
// its code needs. On an older schema serve refuses to start (every event
// would fail on a missing table or column) and readiness says so. It is
// raised when the code starts using what a migration adds; while the
// newest migrations are expand ones the code does not use yet, it stays
// below the newest (Version), so that this release also runs where they
// are not applied.
const Oldest = 16

// embedded are the migrations this release carries: billing's. The chaos
// suite's next release carries more (release_next.go).
func embedded() fs.FS { return migrations.FS }
