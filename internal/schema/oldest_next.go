//go:build upgradetest

package schema

// Oldest, in the chaos suite's next release (the tag upgradetest, never
// shipped): it writes the column its expand migration adds
// (db/migrations/next).
const Oldest = 10001
