-- Fewer bytes of WAL per event (issue 32): what one event wrote was 2.6 KB,
-- half of it the outbox's, and every byte goes to the standby and the
-- archive.
--
-- An expand migration: the previous release runs on it unchanged (it names
-- none of the indexes, and reads no outbox_dead).

-- +goose NO TRANSACTION
-- +goose Up
SET lock_timeout = '1s';

-- The settle rewrites an attempt: with room on its page, the new version
-- stays there, and PostgreSQL then logs only the bytes that changed and no
-- lock record for the old one. New pages only; nothing is rewritten.
ALTER TABLE charge SET (fillfactor = 70);

-- Reconciliation reads attempts by created_at window. A BRIN index serves
-- it (created_at grows with the table): it is written when a page range's
-- bounds change, where a btree took an entry at every claim and at every
-- settle.
CREATE INDEX CONCURRENTLY IF NOT EXISTS charge_created_at_brin ON charge USING brin (created_at);
DROP INDEX CONCURRENTLY IF EXISTS charge_created_at;

-- Maintenance finds the pending attempts through
-- charge_one_pending_per_order, which holds them alone.
DROP INDEX CONCURRENTLY IF EXISTS charge_pending_updated_at;

-- Nothing reads an outcome by its cause. (A partitioned index cannot be
-- dropped concurrently: it waits at most lock_timeout for the outbox.)
DROP INDEX IF EXISTS outbox_causation;

-- The outcome events the relay can never publish (an invalid or oversized
-- value), for a human: the relay moves them here, and deletes from the
-- outbox the ones the broker acknowledged (the topic is their record), so
-- that a published outcome costs no second version of its row.
CREATE TABLE IF NOT EXISTS outbox_dead (
    event_id     uuid        PRIMARY KEY,
    seq          bigint      NOT NULL,
    order_id     bigint      NOT NULL,
    event_type   text        NOT NULL,
    causation_id uuid        NOT NULL,
    reason       text,
    payload      bytea       NOT NULL,
    traceparent  text,
    recorded_at  timestamptz NOT NULL,
    attempts     integer     NOT NULL,
    last_error   text        NOT NULL,
    died_at      timestamptz NOT NULL DEFAULT now()
);
GRANT SELECT, INSERT ON outbox_dead TO billing_runtime;
-- Deleting what was published takes nothing the runtime role could not
-- do before: marking a row published without publishing it.
GRANT DELETE ON outbox TO billing_runtime;
RESET lock_timeout;

-- +goose Down
SET lock_timeout = '1s';
REVOKE DELETE ON outbox FROM billing_runtime;
DROP TABLE IF EXISTS outbox_dead;
CREATE INDEX IF NOT EXISTS outbox_causation ON outbox (causation_id);
CREATE INDEX CONCURRENTLY IF NOT EXISTS charge_pending_updated_at ON charge (updated_at) WHERE status = 'pending';
CREATE INDEX CONCURRENTLY IF NOT EXISTS charge_created_at ON charge (created_at);
DROP INDEX CONCURRENTLY IF EXISTS charge_created_at_brin;
ALTER TABLE charge RESET (fillfactor);
RESET lock_timeout;
