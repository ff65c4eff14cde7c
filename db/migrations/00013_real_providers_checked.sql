-- The second half of 00011: what must not run inside a transaction, so
-- that no claim or settle waits while charge is read. VALIDATE CONSTRAINT
-- and CREATE INDEX CONCURRENTLY take SHARE UPDATE EXCLUSIVE on charge,
-- which no write takes: they wait for none and none waits for them. An
-- expand migration, like 00011.

-- +goose NO TRANSACTION
-- +goose Up
ALTER TABLE charge VALIDATE CONSTRAINT charge_status_known;
ALTER TABLE charge VALIDATE CONSTRAINT charge_succeeded_has_provider_id;

-- At most one open attempt (pending or in_progress) per order: a second
-- event of the order waits for it. charge_one_pending_per_order, a subset,
-- stays for the previous release's plans.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS charge_one_open_per_order ON charge (order_id)
    WHERE status IN ('pending', 'in_progress');
-- The resolver finds the in_progress attempts that are due.
CREATE INDEX CONCURRENTLY IF NOT EXISTS charge_in_progress_resolve_at ON charge (resolve_at)
    WHERE status = 'in_progress';

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS charge_in_progress_resolve_at;
DROP INDEX CONCURRENTLY IF EXISTS charge_one_open_per_order;
