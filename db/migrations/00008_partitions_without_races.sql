-- Day partitions without races, and an outbox that never writes into a day
-- retention dropped.
--
-- Several writers and maintainers creating the same day at once raced in
-- the catalog: CREATE TABLE of one name twice fails on pg_type's unique
-- index (23505), and the writer's transaction (a settle after the provider
-- answered) was rolled back. Outcomes of old order events went into their
-- order event's day of the outbox, which the writer re-created after
-- retention had dropped it; retention counted a day's unpublished rows and
-- then detached and dropped it, and a row committed in between went with
-- it.
--
-- An expand migration: the previous release runs on it unchanged (its
-- statements are the same; an outcome of a day without a partition lands
-- in the default partition where it failed before).

-- +goose Up
SET LOCAL lock_timeout = '5s';

-- ensure_day_partition as migration 7 made it, plus: one creator of a day
-- at a time, and an outbox day takes over the rows the default partition
-- holds for it.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ensure_day_partition(parent regclass, day date) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    nsp     name;
    rel     name;
    part    text;
    dropped date;
    lo      uuid := (lpad(to_hex((extract(epoch FROM day::timestamp) * 1000)::bigint), 12, '0') || '00000000000000000000')::uuid;
    hi      uuid := (lpad(to_hex((extract(epoch FROM (day + 1)::timestamp) * 1000)::bigint), 12, '0') || '00000000000000000000')::uuid;
BEGIN
    SELECT n.nspname, c.relname INTO nsp, rel
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = parent AND c.relkind = 'p' AND c.relpersistence = 'p' AND c.relname IN ('processed_event', 'outbox')
      AND pg_has_role(c.relowner, 'USAGE');
    IF NOT FOUND THEN
        RAISE EXCEPTION 'ensure_day_partition: % is not a day-partitioned table of billing''s', parent
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    part := rel || '_p' || to_char(day, 'YYYYMMDD');
    -- Creators of the same day queue here rather than race in the catalog;
    -- the lock is the transaction's, released once the partition is
    -- committed for the next one to find. The first key, 'part', keeps
    -- these apart from billing's other two-key locks (the orders', 'bill').
    PERFORM pg_advisory_xact_lock(x'70617274'::int, hashtext(nsp || '.' || part));
    IF rel = 'processed_event' THEN
        EXECUTE format('SELECT dropped_before FROM %I.processed_event_horizon', nsp) INTO dropped;
        IF day < dropped THEN
            RAISE EXCEPTION 'ensure_day_partition: processed_event forgot the days before % (retention dropped them); % is not created again', dropped, day;
        END IF;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
               WHERE i.inhparent = parent AND c.relname = part AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = nsp)) THEN
        RETURN part;
    END IF;
    IF to_regclass(format('%I.%I', nsp, part)) IS NULL THEN
        EXECUTE format('CREATE TABLE %I.%I (LIKE %I.%I INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)', nsp, part, nsp, rel);
    END IF;
    IF rel = 'outbox' THEN
        -- PostgreSQL refuses to attach a day whose rows the default
        -- partition holds: they move into the day first.
        EXECUTE format('WITH moved AS (DELETE FROM %I.outbox_default WHERE event_id >= %L AND event_id < %L RETURNING *) INSERT INTO %I.%I SELECT * FROM moved',
                       nsp, lo, hi, nsp, part);
    END IF;
    EXECUTE format('ALTER TABLE %I.%I ATTACH PARTITION %I.%I FOR VALUES FROM (%L) TO (%L)', nsp, rel, nsp, part, lo, hi);
    RETURN part;
END
$$;
-- +goose StatementEnd

-- The outbox's default partition: the outcome of an order event whose day
-- has no partition (older than the outbox's retention, or maintenance
-- behind) lands here rather than in a day the writer would create. Only
-- maintenance creates days; retention never drops this one, and removes
-- its published rows once they are as old as a day it drops.
CREATE TABLE outbox_default (LIKE outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES);
ALTER TABLE outbox ATTACH PARTITION outbox_default DEFAULT;

-- +goose Down
SET LOCAL lock_timeout = '5s';
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ensure_day_partition(parent regclass, day date) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    nsp     name;
    rel     name;
    part    text;
    dropped date;
    lo      uuid := (lpad(to_hex((extract(epoch FROM day::timestamp) * 1000)::bigint), 12, '0') || '00000000000000000000')::uuid;
    hi      uuid := (lpad(to_hex((extract(epoch FROM (day + 1)::timestamp) * 1000)::bigint), 12, '0') || '00000000000000000000')::uuid;
BEGIN
    SELECT n.nspname, c.relname INTO nsp, rel
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = parent AND c.relkind = 'p' AND c.relpersistence = 'p' AND c.relname IN ('processed_event', 'outbox')
      AND pg_has_role(c.relowner, 'USAGE');
    IF NOT FOUND THEN
        RAISE EXCEPTION 'ensure_day_partition: % is not a day-partitioned table of billing''s', parent
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF rel = 'processed_event' THEN
        EXECUTE format('SELECT dropped_before FROM %I.processed_event_horizon', nsp) INTO dropped;
        IF day < dropped THEN
            RAISE EXCEPTION 'ensure_day_partition: processed_event forgot the days before % (retention dropped them); % is not created again', dropped, day;
        END IF;
    END IF;
    part := rel || '_p' || to_char(day, 'YYYYMMDD');
    IF EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
               WHERE i.inhparent = parent AND c.relname = part AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = nsp)) THEN
        RETURN part;
    END IF;
    IF to_regclass(format('%I.%I', nsp, part)) IS NULL THEN
        EXECUTE format('CREATE TABLE %I.%I (LIKE %I.%I INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)', nsp, part, nsp, rel);
    END IF;
    EXECUTE format('ALTER TABLE %I.%I ATTACH PARTITION %I.%I FOR VALUES FROM (%L) TO (%L)', nsp, rel, nsp, part, lo, hi);
    RETURN part;
END
$$;
-- +goose StatementEnd
-- Rows of the default partition go back to days of their own (the
-- function above creates them as migration 7 did).
-- +goose StatementBegin
DO $$
DECLARE
    d date;
BEGIN
    ALTER TABLE outbox DETACH PARTITION outbox_default;
    FOR d IN SELECT DISTINCT (to_timestamp(('x' || lpad(replace(substr(event_id::text, 1, 13), '-', ''), 16, '0'))::bit(64)::bigint / 1000.0) AT TIME ZONE 'UTC')::date
             FROM outbox_default LOOP
        PERFORM ensure_day_partition('outbox'::regclass, d);
    END LOOP;
    INSERT INTO outbox SELECT * FROM outbox_default;
    DROP TABLE outbox_default;
END
$$;
-- +goose StatementEnd
