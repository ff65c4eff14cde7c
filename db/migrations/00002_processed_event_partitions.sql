-- Bounded dedup storage: processed_event range-partitioned by the time inside
-- its UUID v7 event_id, plus a payload fingerprint.
--
-- The seed partitioned by processed_at with PRIMARY KEY (event_id,
-- processed_at): a duplicate arriving later gets a new processed_at, a new
-- key, lands in another partition and is not detected. A UUID v7's leading 48
-- bits are its creation time in milliseconds, so one day of event ids is one
-- contiguous key range: partitioning by event_id keeps PRIMARY KEY (event_id,
-- consumer_group) globally unique, and every copy of an event lands in the
-- same partition however late it comes. Expired days are removed by dropping
-- whole partitions, never by long DELETEs.

-- +goose Up

-- processed_event_bound returns the smallest UUID of the UTC day `day`: the
-- day's first millisecond in the 48 time bits, every other bit zero. UUIDs
-- compare bytewise, so [bound(d), bound(d + 1)) holds exactly the v7 ids
-- created on day d.
-- +goose StatementBegin
CREATE FUNCTION processed_event_bound(day date) RETURNS uuid
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT (lpad(to_hex((extract(epoch FROM day::timestamp) * 1000)::bigint), 12, '0')
            || '00000000000000000000')::uuid
$$;
-- +goose StatementEnd

-- ensure_processed_event_partition creates and attaches the partition of `day`
-- unless it is attached, and returns its name. It creates the table first and attaches it
-- afterwards: ATTACH PARTITION takes only a SHARE UPDATE EXCLUSIVE lock on the
-- parent, so inserts go on meanwhile.
-- +goose StatementBegin
CREATE FUNCTION ensure_processed_event_partition(day date) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    name text := 'processed_event_p' || to_char(day, 'YYYYMMDD');
BEGIN
    IF EXISTS (SELECT 1 FROM pg_inherits
               WHERE inhrelid = to_regclass(name) AND inhparent = 'processed_event'::regclass) THEN
        RETURN name;
    END IF;
    IF to_regclass(name) IS NULL THEN
        EXECUTE format('CREATE TABLE %I (LIKE processed_event INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', name);
        EXECUTE format('ALTER TABLE %I ADD PRIMARY KEY (event_id, consumer_group)', name);
    END IF;
    EXECUTE format('ALTER TABLE processed_event ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   name, processed_event_bound(day), processed_event_bound(day + 1));
    RETURN name;
END
$$;
-- +goose StatementEnd

ALTER TABLE processed_event RENAME TO processed_event_unpartitioned;
ALTER INDEX processed_event_pkey RENAME TO processed_event_unpartitioned_pkey;

CREATE TABLE processed_event (
    event_id       uuid        NOT NULL,
    consumer_group text        NOT NULL,
    -- SHA-256 of the event's canonical content; NULL for rows recorded
    -- before fingerprints existed (such a duplicate cannot be judged and is
    -- skipped as before).
    fingerprint    bytea       CHECK (octet_length(fingerprint) = 32),
    processed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event_id, consumer_group)
) PARTITION BY RANGE (event_id);

-- +goose StatementBegin
DO $$
DECLARE
    first_day date;
    today date := (now() AT TIME ZONE 'UTC')::date;
    d date;
BEGIN
    -- Only UUID v7 ids carry a time; the consumer never recorded anything
    -- else, and a row that would fit no partition must stop the migration
    -- rather than be lost.
    IF EXISTS (SELECT 1 FROM processed_event_unpartitioned WHERE substr(event_id::text, 15, 1) <> '7') THEN
        RAISE EXCEPTION 'processed_event holds event ids that are not UUID v7; cannot partition by their time';
    END IF;
    SELECT min(to_timestamp(('x' || lpad(replace(substr(event_id::text, 1, 13), '-', ''), 16, '0'))::bit(64)::bigint / 1000.0) AT TIME ZONE 'UTC')::date
      INTO first_day FROM processed_event_unpartitioned;
    -- The days of existing rows, and the week before today so that a late
    -- event of those days has a partition from the start.
    d := least(coalesce(first_day, today), today - 7);
    WHILE d <= today + 3 LOOP
        PERFORM ensure_processed_event_partition(d);
        d := d + 1;
    END LOOP;
END
$$;
-- +goose StatementEnd

INSERT INTO processed_event (event_id, consumer_group, processed_at)
SELECT event_id, consumer_group, processed_at FROM processed_event_unpartitioned;

DROP TABLE processed_event_unpartitioned;

-- +goose Down
ALTER TABLE processed_event RENAME TO processed_event_partitioned;
CREATE TABLE processed_event (
    event_id       uuid        NOT NULL,
    consumer_group text        NOT NULL,
    processed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event_id, consumer_group)
);
INSERT INTO processed_event (event_id, consumer_group, processed_at)
SELECT event_id, consumer_group, processed_at FROM processed_event_partitioned;
DROP TABLE processed_event_partitioned;
DROP FUNCTION ensure_processed_event_partition(date);
DROP FUNCTION processed_event_bound(date);
