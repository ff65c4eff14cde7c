-- The chaos suite's next release (rolling-upgrade; never shipped): the
-- constraint that every attempt names its release, added NOT VALID: new
-- rows are checked, the existing ones are not scanned under the lock
-- (10004 validates them).

-- +goose Up
SET LOCAL lock_timeout = '1s';
ALTER TABLE charge ADD CONSTRAINT charge_recorded_by_set CHECK (recorded_by IS NOT NULL) NOT VALID;

-- +goose Down
SET LOCAL lock_timeout = '1s';
ALTER TABLE charge DROP CONSTRAINT IF EXISTS charge_recorded_by_set;
