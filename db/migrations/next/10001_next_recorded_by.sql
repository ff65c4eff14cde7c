-- The chaos suite's next release (rolling-upgrade; built with the tag
-- upgradetest, never shipped): an expand migration of the shape billing
-- ships. A column the next release writes (which release recorded each
-- charge attempt), the rows recorded before it backfilled in committed
-- batches, and an index built concurrently. The previous release runs on
-- it unchanged: it does not name the column.

-- +goose NO TRANSACTION
-- +goose Up
SET lock_timeout = '1s';
ALTER TABLE charge ADD COLUMN IF NOT EXISTS recorded_by text;

-- +goose StatementBegin
CREATE OR REPLACE PROCEDURE next_backfill_recorded_by() LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    LOOP
        UPDATE charge SET recorded_by = 'an earlier release'
        WHERE event_id IN (SELECT event_id FROM charge WHERE recorded_by IS NULL LIMIT 1000 FOR UPDATE SKIP LOCKED);
        GET DIAGNOSTICS n = ROW_COUNT;
        COMMIT; -- a batch at a time: no transaction holds the rows of the whole table
        EXIT WHEN n = 0;
    END LOOP;
END
$$;
-- +goose StatementEnd
CALL next_backfill_recorded_by();

CREATE INDEX CONCURRENTLY IF NOT EXISTS charge_recorded_by ON charge (recorded_by);
RESET lock_timeout;

-- +goose Down
SET lock_timeout = '1s';
DROP INDEX CONCURRENTLY IF EXISTS charge_recorded_by;
DROP PROCEDURE IF EXISTS next_backfill_recorded_by();
ALTER TABLE charge DROP COLUMN IF EXISTS recorded_by;
RESET lock_timeout;
