// Package dedup is the processed_event store: the record of which events a
// consumer group has already finished, keyed by the event's own id.
//
// Kafka delivers at least once, so the same event can arrive again after a
// crash, a rebalance or a DLQ replay. An offset is never the dedup key: it
// depends on the consumer group and changes on replay. The event id is.
//
// The table is range-partitioned by the time inside the UUID v7 event id
// (one partition per UTC day, see Retention and package daytable), so that
// every copy of an event lands in the same partition however late it comes,
// and expired days are dropped whole.
package dedup

import (
	"bytes"
	"context"
	"fmt"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"example.com/billing/internal/daytable"
)

// Verdict says whether an event is seen for the first time.
type Verdict int

const (
	// First: the claim inserted the record; the caller must do the work in
	// the same transaction.
	First Verdict = iota
	// Seen: the group already claimed this event with this payload (a
	// redelivery, a replay, a copy): not a new event.
	Seen
	// Mismatch: the group already finished an event with this id but a
	// different payload. Not a duplicate to skip silently: a producer bug or
	// tampering, for a human to look at.
	Mismatch
)

func (v Verdict) String() string {
	switch v {
	case First:
		return "first"
	case Seen:
		return "seen"
	case Mismatch:
		return "mismatch"
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// Entry is one event to claim.
type Entry struct {
	ID uuid.UUID
	// Fingerprint is a hash of the event's canonical content.
	Fingerprint [32]byte
}

// ClaimProtocol is what every claim records in processed_event.claimed_with:
// 2, claim → charge → settle (rows from before carry 1). The column has no
// default, so a binary of the earlier protocol, which charged inside the
// claim's transaction and does not name it, cannot claim anything against
// this schema (migration 00004 explains the rolling update it protects).
const ClaimProtocol = 2

// Store claims events for one consumer group.
type Store struct {
	group string
}

// NewStore returns the store of the consumer group group.
func NewStore(group string) *Store {
	return &Store{group: group}
}

// Claim records entries as processed inside tx and returns a verdict for
// each, in order. When an entry's day has no partition it returns a
// *daytable.MissingError. An id that appears twice in entries is First once, then
// Seen or Mismatch.
//
// The insert uses ON CONFLICT DO NOTHING on the primary key and RETURNING to
// learn which rows it really inserted: the rows sent say nothing, since a
// duplicate is sent like a first and only the conflict tells them apart.
// Under READ COMMITTED a concurrent transaction inserting the same id makes
// this statement wait for it and then see the conflict.
func (s *Store) Claim(ctx context.Context, tx *sqlx.Tx, entries []Entry) ([]Verdict, error) {
	const q = `
INSERT INTO processed_event (event_id, consumer_group, fingerprint, claimed_with)
SELECT id, $3, fp, $4 FROM unnest($1::uuid[], $2::bytea[]) AS e(id, fp)
ORDER BY id -- two batches sharing ids insert them in one order: no deadlock
ON CONFLICT DO NOTHING
RETURNING event_id`

	ids := make(pq.StringArray, len(entries))
	fps := make(pq.ByteaArray, len(entries))
	for i, e := range entries {
		ids[i] = e.ID.String()
		fps[i] = e.Fingerprint[:]
	}
	inserted, err := queryIDs(ctx, tx, q, ids, fps, s.group, ClaimProtocol)
	if err != nil {
		keys := make([]uuid.UUID, len(entries))
		for i, e := range entries {
			keys[i] = e.ID
		}
		return nil, Table.Missing(fmt.Errorf("insert processed_event: %w", err), keys)
	}

	// Every copy of an id this claim inserted is judged against the copy
	// that was inserted (its first); every copy of an id recorded before,
	// against that record.
	verdicts := make([]Verdict, len(entries))
	firstCopy := make(map[uuid.UUID][32]byte, len(entries))
	var earlier []uuid.UUID
	for i, e := range entries {
		if !inserted[e.ID] {
			earlier = append(earlier, e.ID)
			continue
		}
		if fp, ok := firstCopy[e.ID]; ok {
			verdicts[i] = compare(fp[:], e.Fingerprint)
			continue
		}
		firstCopy[e.ID] = e.Fingerprint
		verdicts[i] = First
	}
	if len(earlier) == 0 {
		return verdicts, nil
	}
	// A separate statement: under READ COMMITTED it sees the row of a
	// transaction that committed while the insert waited on it.
	recorded, err := s.fingerprints(ctx, tx, earlier)
	if err != nil {
		return nil, err
	}
	for i, e := range entries {
		if !inserted[e.ID] {
			verdicts[i] = compare(recorded[e.ID], e.Fingerprint)
		}
	}
	return verdicts, nil
}

// compare tells an arriving copy's fingerprint against the recorded one. A
// row recorded before fingerprints existed has none and cannot tell: a
// duplicate.
func compare(recorded []byte, arriving [32]byte) Verdict {
	if recorded == nil || bytes.Equal(recorded, arriving[:]) {
		return Seen
	}
	return Mismatch
}

func (s *Store) fingerprints(ctx context.Context, tx *sqlx.Tx, ids []uuid.UUID) (map[uuid.UUID][]byte, error) {
	const q = `
SELECT event_id, fingerprint FROM processed_event
WHERE event_id = ANY($1::uuid[]) AND consumer_group = $2`
	texts := make(pq.StringArray, len(ids))
	for i, id := range ids {
		texts[i] = id.String()
	}
	rows, err := tx.QueryContext(ctx, q, texts, s.group)
	if err != nil {
		return nil, fmt.Errorf("select processed_event: %w", err)
	}
	defer rows.Close()
	out := make(map[uuid.UUID][]byte, len(ids))
	for rows.Next() {
		var id uuid.UUID
		var fp []byte
		if err := rows.Scan(&id, &fp); err != nil {
			return nil, fmt.Errorf("scan processed_event: %w", err)
		}
		out[id] = fp
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("select processed_event: %w", err)
	}
	return out, nil
}

func queryIDs(ctx context.Context, tx *sqlx.Tx, q string, args ...any) (map[uuid.UUID]bool, error) {
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[uuid.UUID]bool)
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out[id] = true
	}
	return out, rows.Err()
}

// Table is processed_event, partitioned by the day of the event id.
const Table = daytable.Table("processed_event")
