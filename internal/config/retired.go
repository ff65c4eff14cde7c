package config

import (
	"fmt"
	"maps"
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
	"KAFKA_COMMIT_EVERY_MESSAGE": "serve always saves each partition's position in the database before Kafka commits it, " +
		"and commits at once when a partition has nothing in flight; the seed design's commit per message is a benchmark build (-tags seeddesign)",
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

// renamed are variables released under an earlier name, by that name,
// with the name they have now. A deployment that sets the earlier name
// keeps working (Load reads it when the new name is not set); the process
// says so at start (Renamed).
var renamed = map[string]string{
	// It governs the outbox's partitions as well as processed_event's.
	"DEDUP_PARTITIONS_AHEAD": "PARTITIONS_AHEAD",
	// It schedules the outbox's retention as well as the dedup store's.
	"DEDUP_MAINTENANCE_INTERVAL": "PARTITION_MAINTENANCE_INTERVAL",
}

// withRenamed returns environ with the value of each earlier name set
// under the name it has now, unless that is set too, and which earlier
// name each such value came from (new name → earlier name), so that an
// error about it names what the operator wrote.
func withRenamed(environ map[string]string) (map[string]string, map[string]string) {
	var out, earlier map[string]string
	for old, now := range renamed {
		v, set := environ[old]
		if _, taken := environ[now]; !set || taken {
			continue
		}
		if out == nil {
			out, earlier = maps.Clone(environ), map[string]string{}
		}
		out[now], earlier[now] = v, old
	}
	if out == nil {
		return environ, nil
	}
	return out, earlier
}

// Renamed returns a notice for every earlier name of a variable set in
// environ, in name order.
func Renamed(environ map[string]string) []string {
	var out []string
	for old, now := range renamed {
		if _, set := environ[old]; !set {
			continue
		}
		if _, taken := environ[now]; taken {
			out = append(out, fmt.Sprintf("%s is set but ignored: %s, its new name, is set too; remove %s", old, now, old))
			continue
		}
		out = append(out, fmt.Sprintf("%s is an earlier name of %s and still read; rename it %s", old, now, now))
	}
	slices.SortFunc(out, strings.Compare)
	return out
}
