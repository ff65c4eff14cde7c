-- The transactional outbox of payment outcome events, and one function for
-- every table partitioned by the day of a UUID v7 key.

-- +goose Up

-- uuid7_day_bound returns the smallest UUID of the UTC day `day`: the day's
-- first millisecond in the 48 time bits, every other bit zero. UUIDs compare
-- bytewise, so [bound(d), bound(d + 1)) holds exactly the v7 ids created on
-- day d.
-- +goose StatementBegin
CREATE FUNCTION uuid7_day_bound(day date) RETURNS uuid
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT (lpad(to_hex((extract(epoch FROM day::timestamp) * 1000)::bigint), 12, '0')
            || '00000000000000000000')::uuid
$$;
-- +goose StatementEnd

-- ensure_day_partition creates and attaches parent's partition of `day`,
-- named <parent>_pYYYYMMDD, unless it is attached, and returns its name. The
-- table copies the parent's columns, defaults, constraints and indexes and
-- is attached afterwards: ATTACH PARTITION takes only a SHARE UPDATE
-- EXCLUSIVE lock on the parent, so writes go on meanwhile.
-- +goose StatementBegin
CREATE FUNCTION ensure_day_partition(parent regclass, day date) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    name text := (SELECT relname FROM pg_class WHERE oid = parent) || '_p' || to_char(day, 'YYYYMMDD');
BEGIN
    IF EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass(name) AND inhparent = parent) THEN
        RETURN name;
    END IF;
    IF to_regclass(name) IS NULL THEN
        EXECUTE format('CREATE TABLE %I (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)', name, parent);
    END IF;
    EXECUTE format('ALTER TABLE %s ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   parent, name, uuid7_day_bound(day), uuid7_day_bound(day + 1));
    RETURN name;
END
$$;
-- +goose StatementEnd

-- processed_event's own functions (migration 2) now say the same once.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION processed_event_bound(day date) RETURNS uuid
LANGUAGE sql IMMUTABLE STRICT AS $$ SELECT uuid7_day_bound(day) $$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ensure_processed_event_partition(day date) RETURNS text
LANGUAGE sql AS $$ SELECT ensure_day_partition('processed_event'::regclass, day) $$;
-- +goose StatementEnd

-- outbox holds one row per payment outcome event, written in the same
-- transaction as the outcome it announces (the settle of a charge attempt,
-- or the parking of a decoded event), and published to KAFKA_OUTCOME_TOPIC
-- by the relay afterwards, at least once, in commit order per order.
CREATE SEQUENCE outbox_seq;
CREATE TABLE outbox (
    -- The outcome event's own id: a UUID v7 made when it was recorded, never
    -- changed on re-publication. The partition key: one partition a day.
    event_id     uuid        NOT NULL,
    -- Insert order. Per order it is commit order: one order's outcomes are
    -- recorded one after the other (an order's second event waits for the
    -- first one's attempt to settle), so the relay keeps it by publishing
    -- an order's rows in seq order, one at a time.
    seq          bigint      NOT NULL DEFAULT nextval('outbox_seq'),
    order_id     bigint      NOT NULL,          -- the Kafka key
    event_type   text        NOT NULL CHECK (event_type IN ('payment.succeeded.v1', 'payment.declined.v1', 'payment.failed.v1')),
    causation_id uuid        NOT NULL,          -- the order.confirmed.v1 event's id
    reason       text,                          -- payment.failed.v1: the DLQ reason code
    payload      bytea       NOT NULL,          -- the JSON value, exactly as published
    traceparent  text,                          -- continues the order event's trace
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz,                   -- NULL until the broker acknowledged it
    attempts     integer     NOT NULL DEFAULT 0,
    last_error   text,
    -- The relay cannot publish it as it is (an invalid or oversized value):
    -- it is skipped, counted in billing_outbox_dead and left for a human.
    dead         boolean     NOT NULL DEFAULT false,
    PRIMARY KEY (event_id)
) PARTITION BY RANGE (event_id);
ALTER SEQUENCE outbox_seq OWNED BY outbox.seq;
CREATE INDEX outbox_unpublished ON outbox (seq) WHERE published_at IS NULL AND NOT dead;
CREATE INDEX outbox_causation ON outbox (causation_id);

-- +goose StatementBegin
DO $$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
    d date := today - 1;
BEGIN
    WHILE d <= today + 3 LOOP
        PERFORM ensure_day_partition('outbox'::regclass, d);
        d := d + 1;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP TABLE outbox;
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ensure_processed_event_partition(day date) RETURNS text
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
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION processed_event_bound(day date) RETURNS uuid
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT (lpad(to_hex((extract(epoch FROM day::timestamp) * 1000)::bigint), 12, '0')
            || '00000000000000000000')::uuid
$$;
-- +goose StatementEnd
DROP FUNCTION ensure_day_partition(regclass, date);
DROP FUNCTION uuid7_day_bound(date);
