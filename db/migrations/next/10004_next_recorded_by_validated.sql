-- The chaos suite's next release (rolling-upgrade; never shipped): the
-- existing rows checked, in a transaction of its own, whose lock (SHARE
-- UPDATE EXCLUSIVE) blocks no claim or settle.

-- +goose Up
SET LOCAL lock_timeout = '1s';
ALTER TABLE charge VALIDATE CONSTRAINT charge_recorded_by_set;

-- +goose Down
SELECT 1;
