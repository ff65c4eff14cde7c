-- The payments a provider described in its verified notifications, kept
-- for `billing reconcile`: Adyen has no API that lists payments, so its
-- side of a reconciliation is what its signed AUTHORISATION notifications
-- said (internal/notified). serve inserts a row per notified verdict before
-- it acknowledges the notification; reconcile reads them by time.
--
-- An expand migration: a new table the previous release never names.

-- +goose Up
SET LOCAL lock_timeout = '1s';
CREATE TABLE notified_payment (
    provider        text        NOT NULL,
    -- The provider's id of the payment (Adyen's pspReference).
    payment_ref     text        NOT NULL CHECK (payment_ref <> ''),
    -- The verdict notified: succeeded (AUTHORISATION success=true) or
    -- declined (success=false). Both are kept should a provider ever
    -- notify the two for one payment.
    status          text        NOT NULL CHECK (status IN ('succeeded', 'declined')),
    -- The payment's reference (Adyen's merchantReference): billing's event
    -- id for its own payments, anything for the account's others.
    idempotency_key text        NOT NULL,
    amount_minor    bigint      NOT NULL,
    currency        text        NOT NULL,
    -- When the provider says the event happened (Adyen's eventDate), else
    -- when billing received it.
    created_at      timestamptz NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, payment_ref, status)
);
-- reconcile reads a window of one provider's. A new, empty table: its
-- index is built at once, in the table's transaction.
CREATE INDEX notified_payment_created ON notified_payment (provider, created_at);
GRANT SELECT, INSERT ON notified_payment TO billing_runtime;

-- +goose Down
DROP TABLE notified_payment;
