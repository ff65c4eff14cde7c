-- The exactly-once pipeline: the dedup store and the business table.

-- +goose Up
-- processed_event records every event a consumer group has finished. Its key
-- includes the consumer group so that several groups can share one database;
-- INSERT ... ON CONFLICT DO NOTHING on this key is the dedup check, and the
-- primary key makes a racing duplicate wait for the first transaction and then
-- skip (READ COMMITTED).
CREATE TABLE processed_event (
    event_id       uuid        NOT NULL,
    consumer_group text        NOT NULL,
    processed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event_id, consumer_group)
);

-- charge holds one row per charge attempt outcome, keyed by the event that
-- caused it. Money is an integer number of minor units, never a float.
CREATE TABLE charge (
    event_id           uuid        PRIMARY KEY,
    order_id           bigint      NOT NULL CHECK (order_id > 0),
    customer_id        bigint      NOT NULL CHECK (customer_id > 0),
    amount_minor       bigint      NOT NULL CHECK (amount_minor > 0),
    currency           char(3)     NOT NULL,
    status             text        NOT NULL CHECK (status IN ('succeeded', 'declined')),
    provider_charge_id text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    CHECK ((status = 'succeeded') = (provider_charge_id IS NOT NULL))
);

-- At most one succeeded charge per order. The consumer already serializes
-- charges of one order with an advisory lock; this index is the last line of
-- defence should that ever be bypassed.
CREATE UNIQUE INDEX charge_one_success_per_order ON charge (order_id) WHERE status = 'succeeded';

-- Reconciliation reads charges by time window.
CREATE INDEX charge_created_at ON charge (created_at);

-- +goose Down
DROP TABLE charge;
DROP TABLE processed_event;
