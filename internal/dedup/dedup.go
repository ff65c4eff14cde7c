// Package dedup is the processed_event store: the record of which events a
// consumer group has already finished, keyed by the event's own id.
//
// Kafka delivers at least once, so the same event can arrive again after a
// crash, a rebalance or a DLQ replay. An offset is never the dedup key: it
// depends on the consumer group and changes on replay. The event id is.
package dedup

import (
	"context"
	"fmt"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// Verdict says whether an event is seen for the first time.
type Verdict int

const (
	// First: the claim inserted the record; the caller must do the work in
	// the same transaction.
	First Verdict = iota
	// Duplicate: the group already finished this event; do nothing.
	Duplicate
)

func (v Verdict) String() string {
	switch v {
	case First:
		return "first"
	case Duplicate:
		return "duplicate"
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// Store claims events for one consumer group.
type Store struct {
	group string
}

// NewStore returns the store of the consumer group group.
func NewStore(group string) *Store {
	return &Store{group: group}
}

// Claim records ids as processed inside tx and returns a verdict for each,
// in order. An id that appears twice in ids is First once and then Duplicate.
//
// The insert uses ON CONFLICT DO NOTHING on the primary key and RETURNING to
// learn which rows it really inserted (rows affected, not what was sent: the
// seed's TypeORM check looked at the ids it sent and never saw a duplicate).
// Under READ COMMITTED a concurrent transaction inserting the same id makes
// this statement wait for it, then see the conflict.
func (s *Store) Claim(ctx context.Context, tx *sqlx.Tx, ids []uuid.UUID) ([]Verdict, error) {
	const q = `
INSERT INTO processed_event (event_id, consumer_group)
SELECT id, $2 FROM unnest($1::uuid[]) AS id
ON CONFLICT DO NOTHING
RETURNING event_id`

	texts := make(pq.StringArray, len(ids))
	for i, id := range ids {
		texts[i] = id.String()
	}
	rows, err := tx.QueryContext(ctx, q, texts, s.group)
	if err != nil {
		return nil, fmt.Errorf("insert processed_event: %w", err)
	}
	defer rows.Close()
	inserted := make(map[uuid.UUID]bool, len(ids))
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("scan processed_event: %w", err)
		}
		inserted[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("insert processed_event: %w", err)
	}

	verdicts := make([]Verdict, len(ids))
	for i, id := range ids {
		if inserted[id] {
			verdicts[i] = First
			delete(inserted, id) // a second copy in the same batch is a duplicate
		} else {
			verdicts[i] = Duplicate
		}
	}
	return verdicts, nil
}
