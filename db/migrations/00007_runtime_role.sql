-- Least privilege: `billing serve` can run as a role that reads and writes
-- billing's rows and nothing else, while the role that runs `billing
-- migrate` (and `billing maintain`) owns the schema.
--
-- billing_runtime is a group role without login; the operator grants it to
-- the login role serve uses (GRANT billing_runtime TO billing_app). It holds
-- exactly the privileges below: no DDL, no TRUNCATE, no DELETE; it cannot
-- drop or alter a table (only an owner can), and it cannot create one
-- (PostgreSQL 15 gives PUBLIC no CREATE on schema public; revoke it on 14).
-- Every later migration that adds a table grants billing_runtime what serve
-- needs of it (db/migrations/roles_test.go lists them and fails otherwise).
--
-- Partitions: processed_event and outbox get a partition a day. Only the
-- owner of a partitioned table may create its partitions, so
-- ensure_day_partition becomes SECURITY DEFINER: it runs as the owner, for
-- those two tables only, with a fixed search_path, and billing_runtime may
-- call it; serve creates a missing day's partition through it (today's, when
-- maintenance has not run). Dropping expired days (DETACH ... CONCURRENTLY,
-- which cannot run inside a function, then DROP) stays the owner's: serve
-- running as billing_runtime leaves it to `billing maintain`, run as the
-- owner. A runtime role that could drop a day of processed_event could make
-- its events look new, and have them charged again.
--
-- The role is created here when the migrating role may create roles (a
-- superuser, as in the tests and the demo, or CREATEROLE); otherwise a
-- superuser creates it once per cluster: CREATE ROLE billing_runtime NOLOGIN.
-- Roles belong to the cluster, not the database: several billing databases
-- on one cluster share it.

-- +goose Up
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'billing_runtime') THEN
        BEGIN
            CREATE ROLE billing_runtime NOLOGIN;
        EXCEPTION
            -- Another database's migration created it meanwhile.
            WHEN duplicate_object OR unique_violation THEN NULL;
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'role billing_runtime does not exist, and % may not create it: have a superuser run CREATE ROLE billing_runtime NOLOGIN once (docs/deployment.md, PostgreSQL roles and TLS)', current_user;
        END;
    END IF;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO billing_runtime', current_schema());
END
$$;
-- +goose StatementEnd

-- serve's rows: claims (processed_event), charge attempts, outcome events
-- (outbox, its sequence), the consumer's positions; read only: the dedup
-- horizon (maintenance moves it) and the schema version (readiness).
GRANT SELECT, INSERT ON processed_event TO billing_runtime;
GRANT SELECT ON processed_event_horizon TO billing_runtime;
GRANT SELECT, INSERT, UPDATE ON charge TO billing_runtime;
GRANT SELECT, INSERT, UPDATE ON outbox TO billing_runtime;
GRANT USAGE ON SEQUENCE outbox_seq TO billing_runtime;
GRANT SELECT, INSERT, UPDATE ON consumer_position TO billing_runtime;
GRANT SELECT ON goose_db_version TO billing_runtime;

-- ensure_day_partition, as migration 5 made it, but run as its owner (the
-- tables' owner: run billing migrate as the owner, not as a superuser),
-- for billing's permanent processed_event and outbox alone (a caller's
-- temporary table of that name is refused), with every name
-- qualified and search_path fixed, so that a caller's objects cannot stand
-- in for the catalog's (pg_temp last: searched first otherwise). A day of
-- processed_event that retention dropped is never created again: its
-- events would look new.
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
REVOKE EXECUTE ON FUNCTION ensure_day_partition(regclass, date) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ensure_day_partition(regclass, date) TO billing_runtime;

-- +goose Down
REVOKE EXECUTE ON FUNCTION ensure_day_partition(regclass, date) FROM billing_runtime;
GRANT EXECUTE ON FUNCTION ensure_day_partition(regclass, date) TO PUBLIC;
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ensure_day_partition(parent regclass, day date) RETURNS text
LANGUAGE plpgsql SECURITY INVOKER AS $$
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
REVOKE ALL ON goose_db_version, consumer_position, outbox, charge, processed_event_horizon, processed_event FROM billing_runtime;
REVOKE ALL ON SEQUENCE outbox_seq FROM billing_runtime;
-- +goose StatementBegin
DO $$ BEGIN EXECUTE format('REVOKE USAGE ON SCHEMA %I FROM billing_runtime', current_schema()); END $$;
-- +goose StatementEnd
