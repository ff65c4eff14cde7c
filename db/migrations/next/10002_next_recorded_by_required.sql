-- The chaos suite's next release's contract migration (rolling-upgrade;
-- never shipped): every charge attempt names the release that recorded it.
-- The previous release does not, so its inserts would fail: this runs only
-- once no replica of it is alive. The rows it recorded since the expand are
-- backfilled first; the constraint is added NOT VALID, then validated.

-- +billing contract: releases of schema 10001 and newer
-- +goose NO TRANSACTION
-- +goose Up
SELECT billing_contract(10001);
SET lock_timeout = '1s';
CALL next_backfill_recorded_by();
ALTER TABLE charge ADD CONSTRAINT charge_recorded_by_set CHECK (recorded_by IS NOT NULL) NOT VALID;
ALTER TABLE charge VALIDATE CONSTRAINT charge_recorded_by_set;
DROP PROCEDURE next_backfill_recorded_by();
RESET lock_timeout;

-- +goose Down
SET lock_timeout = '1s';
ALTER TABLE charge DROP CONSTRAINT IF EXISTS charge_recorded_by_set;
RESET lock_timeout;
