-- The chaos suite's next release's contract migration (rolling-upgrade;
-- never shipped): every charge attempt names the release that recorded it.
-- The previous release does not, so its inserts would fail: this runs only
-- once no replica of it is alive. The rows it recorded since the expand are
-- backfilled in committed batches; 10003 adds the constraint.

-- +billing contract: releases of schema 10001 and newer
-- +goose NO TRANSACTION
-- +goose Up
SELECT billing_contract(10001);
CALL next_backfill_recorded_by();

-- +goose Down
SELECT 1;
