-- Leases: which process does a job that one process at a time must do
-- (the outbox relay, the retention of processed_event and of the outbox),
-- kept in a table rather than in a session advisory lock.
--
-- A session advisory lock belongs to a server session. Behind a
-- transaction pooler (PgBouncer in transaction mode, CloudNativePG's
-- Pooler) consecutive statements of one client run on whichever server
-- session is free: the lock stays with an idle pooled session after its
-- process is gone, its unlock reaches a session that does not hold it,
-- and two processes can both believe they hold it. A lease is a row,
-- taken, renewed and given back by single statements whatever session
-- runs them, and free again once its expiry passes.
--
-- token is the fencing token: it grows by one at every new tenure and
-- never goes back (rows are given back by expiring them, never deleted).
-- The holder's writes check it (billing_lease_held), so that a holder
-- that lost its lease (paused past its expiry, cut off) cannot write once
-- another took it over.
--
-- An expand migration: a table and a function the previous release does
-- not know (it keeps its advisory locks).

-- +goose Up
SET LOCAL lock_timeout = '5s';

CREATE TABLE billing_lease (
    -- The job: outbox-relay, dedup-retention, outbox-retention.
    name        text        PRIMARY KEY,
    -- Who holds it (host, process id and a random part), for operators.
    holder      text        NOT NULL,
    token       bigint      NOT NULL CHECK (token > 0),
    acquired_at timestamptz NOT NULL,
    -- Renewed while the holder works; free once past, or when given back
    -- (set to the time it was given back).
    expires_at  timestamptz NOT NULL
);

-- billing_lease_held says whether holder still holds lease with token, and
-- share-locks the lease's row until the caller's transaction ends, so that
-- no other holder can take the lease over before the caller's write has
-- committed. It must be called once per statement, as an uncorrelated
-- subquery or CTE (a call in a WHERE clause runs once per row).
-- +goose StatementBegin
CREATE FUNCTION billing_lease_held(lease_name text, lease_holder text, lease_token bigint) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT EXISTS (
        SELECT FROM billing_lease l
        WHERE l.name = lease_name AND l.holder = lease_holder AND l.token = lease_token AND l.expires_at > now()
        FOR SHARE)
$$;
-- +goose StatementEnd

-- serve takes, renews and gives back leases (FOR SHARE needs UPDATE).
GRANT SELECT, INSERT, UPDATE ON billing_lease TO billing_runtime;

-- +goose Down
DROP FUNCTION billing_lease_held(text, text, bigint);
DROP TABLE billing_lease;
