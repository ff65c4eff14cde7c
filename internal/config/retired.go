package config

import (
	"fmt"
	"slices"
	"strings"
)

// retired are variables earlier versions read and this one ignores, with
// what replaced them. A deployment that still sets one keeps working; the
// process says so at start (Retired), so that nobody tunes a knob that no
// longer turns anything.
var retired = map[string]string{
	"CONSUMER_LANES": "each key's next message goes to billing as soon as the one before it is finished, " +
		"so lanes no longer bound anything; MAX_IN_FLIGHT, PAYMENT_MAX_CONCURRENCY and PAYMENT_MAX_RPS do",
	"CONSUMER_BATCH_MAX": "claims and settles of all partitions share transactions as they come (group commit), " +
		"so a lane's batch no longer exists; DATABASE_MAX_CONNS sizes the writers",
}

// Retired returns a notice for every retired variable set in environ, in
// name order.
func Retired(environ map[string]string) []string {
	var out []string
	for name, why := range retired {
		if _, set := environ[name]; set {
			out = append(out, fmt.Sprintf("%s is set but no longer read: %s; remove it", name, why))
		}
	}
	slices.SortFunc(out, strings.Compare)
	return out
}
