//go:build upgradetest

package charge

// The chaos suite's next release (the tag upgradetest, never shipped) also
// says which release recorded each attempt, in the column its expand
// migration adds (db/migrations/next).
const nextColumns, nextValues = ", recorded_by", ", 'the next release'"
