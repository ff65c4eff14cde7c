-- Real providers (Stripe, Adyen): answers that arrive later, the saved card
-- a customer pays with, and events that wait for another attempt of their
-- order.
--
-- An expand migration: the previous release runs on it unchanged. It names
-- none of the new columns, never writes in_progress, and the unique index
-- of open attempts keeps it from starting an attempt for an order whose
-- payment is in progress (its claim meets a unique violation and is
-- retried until the pod is replaced).

-- +goose NO TRANSACTION
-- +goose Up
SET lock_timeout = '1s';

-- in_progress: the provider accepted the payment and gives its verdict
-- later (Stripe's processing, Adyen's Pending); its id is recorded, it is
-- not asked again, and its webhook or a lookup settles it. Added NOT VALID
-- and validated below, so that no write waits while the table is read.
ALTER TABLE charge DROP CONSTRAINT IF EXISTS charge_status_known;
ALTER TABLE charge ADD CONSTRAINT charge_status_known
    CHECK (status IN ('pending', 'in_progress', 'succeeded', 'declined', 'rejected')) NOT VALID;
ALTER TABLE charge VALIDATE CONSTRAINT charge_status_known;
ALTER TABLE charge DROP CONSTRAINT IF EXISTS charge_status_check;

-- A provider's id now comes with answers other than a success (a
-- PaymentIntent processing or declined); a success still needs one.
ALTER TABLE charge DROP CONSTRAINT IF EXISTS charge_succeeded_has_provider_id;
ALTER TABLE charge ADD CONSTRAINT charge_succeeded_has_provider_id
    CHECK (status <> 'succeeded' OR provider_charge_id IS NOT NULL) NOT VALID;
ALTER TABLE charge VALIDATE CONSTRAINT charge_succeeded_has_provider_id;
ALTER TABLE charge DROP CONSTRAINT IF EXISTS charge_check;

-- The saved card the attempt charges (Stripe's cus_ and pm_, Adyen's
-- shopperReference and storedPaymentMethodId), read from payment_method
-- when the attempt was recorded: every try sends the same request.
ALTER TABLE charge ADD COLUMN IF NOT EXISTS customer_ref text;
ALTER TABLE charge ADD COLUMN IF NOT EXISTS payment_method_ref text;
-- The provider's reason for a decline, for an operator and `billing
-- explain` (the outcome event carries it too).
ALTER TABLE charge ADD COLUMN IF NOT EXISTS decline_code text;
-- The event's message was finished before the outcome was known (the
-- attempt went in_progress, or its event waited for another attempt of
-- the order): the settle that records the outcome counts it, not a
-- message.
ALTER TABLE charge ADD COLUMN IF NOT EXISTS deferred boolean NOT NULL DEFAULT false;
-- When the resolver next asks the provider about an in_progress attempt
-- (no webhook came): a lease as well, so that two replicas do not ask at
-- once.
ALTER TABLE charge ADD COLUMN IF NOT EXISTS resolve_at timestamptz;
-- Indeterminate answers (Stripe's stored 500) the attempt got: it is
-- re-sent once, then looked up.
ALTER TABLE charge ADD COLUMN IF NOT EXISTS indeterminate smallint NOT NULL DEFAULT 0;

-- At most one open attempt (pending or in_progress) per order: a second
-- event of the order waits for it. charge_one_pending_per_order, a subset,
-- stays for the previous release's plans.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS charge_one_open_per_order ON charge (order_id)
    WHERE status IN ('pending', 'in_progress');
-- The resolver finds the in_progress attempts that are due.
CREATE INDEX CONCURRENTLY IF NOT EXISTS charge_in_progress_resolve_at ON charge (resolve_at)
    WHERE status = 'in_progress';
RESET lock_timeout;

-- Which saved card pays for a customer at a provider: filled by `billing
-- payment-methods import`; read by the claim.
CREATE TABLE IF NOT EXISTS payment_method (
    customer_id        bigint      NOT NULL CHECK (customer_id > 0),
    provider           text        NOT NULL,
    customer_ref       text        NOT NULL CHECK (customer_ref <> ''),
    payment_method_ref text        NOT NULL CHECK (payment_method_ref <> ''),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (customer_id, provider)
);
GRANT SELECT ON payment_method TO billing_runtime;

-- Events that came while their order's payment was in progress: recorded
-- (their claim is in processed_event), their message finished, and
-- decided when that payment is settled: already charged if it succeeded,
-- else the first of them becomes the order's next attempt.
CREATE TABLE IF NOT EXISTS charge_waiting (
    event_id     uuid        PRIMARY KEY,
    order_id     bigint      NOT NULL,
    customer_id  bigint      NOT NULL,
    amount_minor bigint      NOT NULL,
    currency     text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX CONCURRENTLY IF NOT EXISTS charge_waiting_order ON charge_waiting (order_id, created_at);
GRANT SELECT, INSERT, DELETE ON charge_waiting TO billing_runtime;

-- +goose Down
SET lock_timeout = '1s';
DROP TABLE IF EXISTS charge_waiting;
DROP TABLE IF EXISTS payment_method;
DROP INDEX CONCURRENTLY IF EXISTS charge_in_progress_resolve_at;
DROP INDEX CONCURRENTLY IF EXISTS charge_one_open_per_order;
UPDATE charge SET status = 'pending' WHERE status = 'in_progress';
ALTER TABLE charge DROP COLUMN IF EXISTS indeterminate;
ALTER TABLE charge DROP COLUMN IF EXISTS resolve_at;
ALTER TABLE charge DROP COLUMN IF EXISTS deferred;
ALTER TABLE charge DROP COLUMN IF EXISTS decline_code;
ALTER TABLE charge DROP COLUMN IF EXISTS payment_method_ref;
ALTER TABLE charge DROP COLUMN IF EXISTS customer_ref;
ALTER TABLE charge ADD CONSTRAINT charge_check CHECK ((status = 'succeeded') = (provider_charge_id IS NOT NULL)) NOT VALID;
ALTER TABLE charge DROP CONSTRAINT IF EXISTS charge_succeeded_has_provider_id;
ALTER TABLE charge ADD CONSTRAINT charge_status_check
    CHECK (status IN ('pending', 'succeeded', 'declined', 'rejected')) NOT VALID;
ALTER TABLE charge DROP CONSTRAINT IF EXISTS charge_status_known;
RESET lock_timeout;
