-- The releases running on the database, and what the schema lets run.
--
-- Upgrades replace replicas one at a time while the migrate Job has
-- already run: replicas of the previous release keep charging on the new
-- schema. So migrations come in two kinds. An expand migration only adds
-- (a table, a nullable column, an index built concurrently, a function):
-- the previous release runs on it unchanged, and back again after a
-- rollback. A contract migration removes or tightens what an older
-- release still reads or writes, and may run only once no replica of such
-- a release is alive: its file says from which release schema on releases
-- keep running (-- +billing contract: releases of schema N and newer), and
-- it calls billing_contract(N), which refuses while one is alive.
--
-- Every serve records itself here and renews the record every few seconds
-- (a heartbeat); billing migrate and billing migrate status read it.

-- +goose Up
SET LOCAL lock_timeout = '5s';

CREATE TABLE billing_replica (
    -- A process: a fresh id at each start.
    instance       uuid        PRIMARY KEY,
    -- The binary's version (billing --version) and the host it runs on.
    release        text        NOT NULL,
    host           text        NOT NULL,
    -- The newest schema the binary embeds, and the oldest it runs on.
    schema_version bigint      NOT NULL,
    oldest_schema  bigint      NOT NULL,
    started_at     timestamptz NOT NULL DEFAULT now(),
    -- Renewed every few seconds; a replica whose heartbeat is older than
    -- 30 s (billing_replica_alive) is gone, killed or cut off.
    heartbeat_at   timestamptz NOT NULL DEFAULT now(),
    -- Set when the replica stopped cleanly.
    stopped_at     timestamptz
);

-- The oldest release schema that may still run on this database: contract
-- migrations raise it (billing_contract). 0: every release that knows
-- this table.
CREATE TABLE schema_compatibility (
    only_row  boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    runs_from bigint  NOT NULL
);
INSERT INTO schema_compatibility (runs_from) VALUES (0);

-- billing_replica_alive says whether a replica's record is alive: renewed
-- within the last 30 s and not stopped.
-- +goose StatementBegin
CREATE FUNCTION billing_replica_alive(r billing_replica) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT r.stopped_at IS NULL AND r.heartbeat_at > now() - interval '30 seconds'
$$;
-- +goose StatementEnd

-- billing_contract is the first statement of a contract migration: it
-- refuses while a replica of a release older than runs_from is alive, and
-- otherwise raises the schema's floor to it, in the migration's
-- transaction. The SHARE lock waits for registrations under way and holds
-- new ones until the migration commits: no replica of an older release can
-- slip in between the check and the change.
-- +goose StatementBegin
CREATE FUNCTION billing_contract(runs_from bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    older text;
BEGIN
    LOCK TABLE billing_replica IN SHARE MODE;
    SELECT string_agg(format('%s on %s (release %s, schema %s)', r.instance, r.host, r.release, r.schema_version), ', ')
      INTO older
      FROM billing_replica r WHERE billing_replica_alive(r) AND r.schema_version < runs_from;
    IF older IS NOT NULL THEN
        RAISE EXCEPTION 'contract migration refused: replicas of a release older than schema % are alive: %', runs_from, older
            USING ERRCODE = 'object_in_use', HINT = 'replace them with the new release first; billing migrate status lists them';
    END IF;
    UPDATE schema_compatibility SET runs_from = greatest(schema_compatibility.runs_from, billing_contract.runs_from);
END
$$;
-- +goose StatementEnd

-- serve records itself, renews and closes its record; it reads the floor.
GRANT SELECT, INSERT, UPDATE ON billing_replica TO billing_runtime;
GRANT SELECT ON schema_compatibility TO billing_runtime;

-- +goose Down
DROP FUNCTION billing_contract(bigint);
DROP FUNCTION billing_replica_alive(billing_replica);
DROP TABLE schema_compatibility;
DROP TABLE billing_replica;
