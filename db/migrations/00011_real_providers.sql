-- Real providers (Stripe, Adyen): answers that arrive later, the saved card
-- a customer pays with, and events that wait for another attempt of their
-- order.
--
-- An expand migration: the previous release runs on it unchanged. It names
-- none of the new columns and never writes in_progress; 00013 adds the
-- unique index of open attempts, which keeps it from starting an attempt
-- for an order whose payment is in progress (its claim meets a unique
-- violation and is retried until the pod is replaced). The checks added
-- here are NOT VALID, enforced for every new row; 00013 validates them
-- outside a transaction, so that no write waits while charge is read.

-- +goose Up
SET LOCAL lock_timeout = '1s';

-- in_progress: the provider accepted the payment and gives its verdict
-- later (Stripe's processing, Adyen's Pending); its id is recorded, it is
-- not asked again, and its webhook or a lookup settles it.
ALTER TABLE charge ADD CONSTRAINT charge_status_known
    CHECK (status IN ('pending', 'in_progress', 'succeeded', 'declined', 'rejected')) NOT VALID;
ALTER TABLE charge DROP CONSTRAINT charge_status_check;

-- A provider's id now comes with answers other than a success (a
-- PaymentIntent processing or declined); a success still needs one.
ALTER TABLE charge ADD CONSTRAINT charge_succeeded_has_provider_id
    CHECK (status <> 'succeeded' OR provider_charge_id IS NOT NULL) NOT VALID;
ALTER TABLE charge DROP CONSTRAINT charge_check;

-- The saved card the attempt charges (Stripe's cus_ and pm_, Adyen's
-- shopperReference and storedPaymentMethodId), read from payment_method
-- when the attempt was recorded: every try sends the same request.
ALTER TABLE charge ADD COLUMN customer_ref text;
ALTER TABLE charge ADD COLUMN payment_method_ref text;
-- The provider's reason for a decline, for an operator and `billing
-- explain` (the outcome event carries it too).
ALTER TABLE charge ADD COLUMN decline_code text;
-- The event's message was finished before the outcome was known (the
-- attempt went in_progress, or its event waited for another attempt of
-- the order): the settle that records the outcome counts it, not a
-- message.
ALTER TABLE charge ADD COLUMN deferred boolean NOT NULL DEFAULT false;
-- When the resolver next asks the provider about an in_progress attempt
-- (no webhook came), or about a pending one past the window: a lease as
-- well, so that two replicas do not ask at once.
ALTER TABLE charge ADD COLUMN resolve_at timestamptz;
-- Indeterminate answers (Stripe's stored 500) the attempt got: it is
-- re-sent once, then looked up.
ALTER TABLE charge ADD COLUMN indeterminate smallint NOT NULL DEFAULT 0;

-- Which saved card pays for a customer at a provider: filled by `billing
-- payment-methods import`; read by the claim.
CREATE TABLE payment_method (
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
CREATE TABLE charge_waiting (
    event_id     uuid        PRIMARY KEY,
    order_id     bigint      NOT NULL,
    customer_id  bigint      NOT NULL,
    amount_minor bigint      NOT NULL,
    currency     text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
-- A new, empty table: its index is built at once, before any row exists.
CREATE INDEX charge_waiting_order ON charge_waiting (order_id, created_at);
GRANT SELECT, INSERT, DELETE ON charge_waiting TO billing_runtime;

-- +goose Down
SET LOCAL lock_timeout = '1s';
DROP TABLE charge_waiting;
DROP TABLE payment_method;
UPDATE charge SET status = 'pending' WHERE status = 'in_progress';
ALTER TABLE charge DROP COLUMN indeterminate;
ALTER TABLE charge DROP COLUMN resolve_at;
ALTER TABLE charge DROP COLUMN deferred;
ALTER TABLE charge DROP COLUMN decline_code;
ALTER TABLE charge DROP COLUMN payment_method_ref;
ALTER TABLE charge DROP COLUMN customer_ref;
ALTER TABLE charge ADD CONSTRAINT charge_check CHECK ((status = 'succeeded') = (provider_charge_id IS NOT NULL)) NOT VALID;
ALTER TABLE charge DROP CONSTRAINT charge_succeeded_has_provider_id;
ALTER TABLE charge ADD CONSTRAINT charge_status_check
    CHECK (status IN ('pending', 'succeeded', 'declined', 'rejected')) NOT VALID;
ALTER TABLE charge DROP CONSTRAINT charge_status_known;
