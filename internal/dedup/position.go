package dedup

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// Positions keeps the consumer group's position in each partition in the
// database beside the records of what it processed (consumer_position,
// migration 6): the next offset to consume, every message below it
// finished and its effects committed here. The consumer saves a position
// before Kafka may commit it, so Kafka's committed offset never passes the
// database's position unless the database lost commits (a failover to an
// asynchronous standby, a restored backup); Save tells when it did.
type Positions struct {
	db    *sqlx.DB
	group string
}

// NewPositions returns the positions of group in db.
func NewPositions(db *sqlx.DB, group string) *Positions {
	return &Positions{db: db, group: group}
}

// Save raises each partition's position of topic to the given offset (it
// never lowers one: a member whose partition moved on writes late, and an
// offset reset to replay is met by deduplication) and returns the
// positions the database held before, absent for a partition it had none
// of.
func (s *Positions) Save(ctx context.Context, topic string, offsets map[int32]int64) (map[int32]int64, error) {
	if len(offsets) == 0 {
		return nil, nil
	}
	// One statement, one round trip: its two parts share one snapshot, so
	// before reads the positions as they were, and the upsert locks the
	// rows it raises. Each partition's committer saves its own position
	// (several at once only at a session's end), so savers lock rows in
	// partition order and cannot deadlock.
	parts := slices.Sorted(maps.Keys(offsets))
	next := make(pq.Int64Array, len(parts))
	for i, p := range parts {
		next[i] = offsets[p]
	}
	const save = `
WITH before AS (
    SELECT partition, next_offset FROM consumer_position
    WHERE consumer_group = $1 AND topic = $2 AND partition = ANY($3::int4[])
), raised AS (
    INSERT INTO consumer_position (consumer_group, topic, partition, next_offset)
    SELECT $1, $2, p, o FROM unnest($3::int4[], $4::int8[]) AS u(p, o)
    ORDER BY p
    ON CONFLICT (consumer_group, topic, partition) DO UPDATE
    SET next_offset = GREATEST(consumer_position.next_offset, EXCLUDED.next_offset), updated_at = now()
)
SELECT partition, next_offset FROM before`
	var rows []struct {
		Partition int32 `db:"partition"`
		Next      int64 `db:"next_offset"`
	}
	err := sqlx.SelectContext(ctx, s.db, &rows, save, s.group, topic, pq.Int32Array(parts), next)
	if err != nil {
		return nil, fmt.Errorf("save consumer positions: %w", err)
	}
	before := make(map[int32]int64, len(rows))
	for _, r := range rows {
		before[r.Partition] = r.Next
	}
	return before, nil
}
