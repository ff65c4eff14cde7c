//go:build upgradetest

package schema

import (
	"io/fs"

	"example.com/billing/db/migrations"
	"example.com/billing/db/migrations/next"
)

// Oldest, in the chaos suite's next release (the tag upgradetest, never
// shipped): it writes the column its expand migration adds
// (db/migrations/next).
const Oldest = 10001

// embedded are the next release's migrations: billing's and those of
// db/migrations/next.
func embedded() fs.FS { return next.With(migrations.FS) }
