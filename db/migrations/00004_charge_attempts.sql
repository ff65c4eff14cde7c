-- Claim → charge → settle: no database transaction stays open while the
-- payment provider is called.
--
-- A charge row is now written before the provider call, as a recovery point:
-- status 'pending' with everything the request needs (the idempotency key is
-- event_id; order, customer, amount_minor and currency are the body). Any
-- worker can complete it from the row alone, and the provider answers a
-- repeated request from its idempotency store. A second short transaction
-- settles it: 'succeeded' (with the provider's charge id), 'declined', or
-- 'rejected' (the provider refused the request itself; the event was parked).
-- Existing rows are settled outcomes of the one-transaction design and carry
-- over unchanged.

-- +goose Up
ALTER TABLE charge DROP CONSTRAINT charge_status_check;
ALTER TABLE charge ADD CONSTRAINT charge_status_check
    CHECK (status IN ('pending', 'succeeded', 'declined', 'rejected'));

-- When the attempt was last worked on (a provider answer, a transient
-- failure), and when it was settled. Maintenance completes attempts that
-- nobody has touched for a while; settled rows keep their settle time.
ALTER TABLE charge ADD COLUMN updated_at timestamptz;
ALTER TABLE charge ADD COLUMN settled_at timestamptz;
UPDATE charge SET updated_at = created_at, settled_at = created_at;
ALTER TABLE charge ALTER COLUMN updated_at SET NOT NULL;
ALTER TABLE charge ALTER COLUMN updated_at SET DEFAULT now();

-- Provider requests made for the attempt, and the last failure or refusal,
-- for an operator who wonders why an attempt is still pending.
ALTER TABLE charge ADD COLUMN requests integer NOT NULL DEFAULT 0;
ALTER TABLE charge ADD COLUMN last_error text;

-- Which message's try counted the settled outcome in billing_events_total
-- ("<process> <group/topic/partition/offset>"); NULL until one did: an
-- attempt settled by another event of the order or by maintenance is
-- counted by its own event's message when that comes. Each settled attempt
-- is counted once, also when the commit that settled it went unanswered
-- and the same message is tried again. Rows of before are counted.
ALTER TABLE charge ADD COLUMN counted_by text;
UPDATE charge SET counted_by = 'migration';

-- At most one pending attempt per order: a second event of the order first
-- completes the pending one, then decides (the consumer serializes this
-- with an advisory lock; the index is the last line of defence).
CREATE UNIQUE INDEX charge_one_pending_per_order ON charge (order_id) WHERE status = 'pending';

-- Maintenance finds the attempts left pending.
CREATE INDEX charge_pending_updated_at ON charge (updated_at) WHERE status = 'pending';

-- The fence for a rolling update. A binary from before this migration
-- claims an event and charges it in one transaction, and it takes an order
-- with only a pending attempt for an unpaid one: running beside this
-- binary, it could charge an order whose attempt is still in flight, under
-- another key. Every claim now says which protocol recorded it; the column
-- has no default, so the old binary's claim (which does not name it) fails
-- on the NOT NULL constraint and is retried, before it can reach the
-- provider: old pods stop charging as soon as the schema is migrated and
-- finish nothing until they are replaced. Rows recorded before carry 1.
ALTER TABLE processed_event ADD COLUMN claimed_with smallint NOT NULL DEFAULT 1;
ALTER TABLE processed_event ALTER COLUMN claimed_with DROP DEFAULT;

-- ensure_processed_event_partition copies the parent's columns with LIKE:
-- new partitions get claimed_with (and no default) like the existing ones.

-- +goose Down
ALTER TABLE processed_event DROP COLUMN claimed_with;
DROP INDEX charge_pending_updated_at;
DROP INDEX charge_one_pending_per_order;
DELETE FROM charge WHERE status IN ('pending', 'rejected');
ALTER TABLE charge DROP COLUMN counted_by;
ALTER TABLE charge DROP COLUMN last_error;
ALTER TABLE charge DROP COLUMN requests;
ALTER TABLE charge DROP COLUMN settled_at;
ALTER TABLE charge DROP COLUMN updated_at;
ALTER TABLE charge DROP CONSTRAINT charge_status_check;
ALTER TABLE charge ADD CONSTRAINT charge_status_check CHECK (status IN ('succeeded', 'declined'));
