-- The replicas of a consumer group as a fleet (internal/fleet): one
-- budget of requests per second at the provider's account, shared by
-- them, and the operator's pause of charging (billing pause, billing
-- resume), which every replica follows.
--
-- Every replica renews its row of fleet_member every second, in one short
-- transaction that locks its group's payment_budget row (a row lock: it
-- works through a transaction pooler, where a session's advisory lock
-- would not): it takes its share of the budget (never more than what the
-- others' unexpired shares leave), reads charging_state and records the
-- state it applies. A replica that stops renewing loses its share when its
-- row expires, and the others take it over.
--
-- An expand migration: new tables the previous release never names.

-- +goose Up
SET LOCAL lock_timeout = '1s';

-- The operator's switch: billing pause and billing resume set it, in the
-- transaction that records their operator_action.
CREATE TABLE charging_state (
    consumer_group text        PRIMARY KEY,
    paused         boolean     NOT NULL,
    -- Raised by one at every change: a replica records the version it
    -- applies (fleet_member.applied_version), so billing pause can tell
    -- which replicas follow it.
    version        bigint      NOT NULL CHECK (version > 0),
    -- Since when the group is in this state: a pause left on too long
    -- alerts (billing_charging_paused_seconds).
    changed_at     timestamptz NOT NULL,
    -- The operator_action that set it: who and why.
    action_id      bigint      NOT NULL
);

-- The requests per second the group may send to the provider's account
-- now: PAYMENT_ACCOUNT_MAX_RPS, less what the provider's 429s took, given
-- back step by step once they stop. Its row is the group's lock.
CREATE TABLE payment_budget (
    consumer_group text             PRIMARY KEY,
    rps            double precision NOT NULL CHECK (rps > 0),
    -- When a replica last reported 429s, when they last cut the budget,
    -- and when it last went a step back up.
    limited_at     timestamptz,
    cut_at         timestamptz,
    raised_at      timestamptz
);

-- Each replica (billing_replica's instance) in its group, renewed every
-- second until it stops (its row is then deleted) or dies (its row
-- expires).
CREATE TABLE fleet_member (
    consumer_group  text             NOT NULL,
    instance        uuid             NOT NULL,
    -- The requests per second of payment_budget.rps it may send until
    -- expires_at; 0 without a shared budget.
    share           double precision NOT NULL CHECK (share >= 0),
    -- Its PAYMENT_ACCOUNT_MAX_RPS (0: none): the lowest of the live
    -- members' bounds the budget, so that a lowered limit applies as soon
    -- as one replica has it.
    account_rps     double precision NOT NULL CHECK (account_rps >= 0),
    -- The charging_state version it applies (0: none yet), and whether
    -- that is a pause.
    applied_version bigint           NOT NULL,
    paused          boolean          NOT NULL,
    renewed_at      timestamptz      NOT NULL,
    expires_at      timestamptz      NOT NULL,
    PRIMARY KEY (consumer_group, instance)
);

-- serve renews its row, takes its share and reads the state; it deletes
-- its own row when it stops, and those of members expired long ago. billing
-- pause and billing resume may run with serve's role (kubectl exec into a
-- replica): they write charging_state and operator_action.
GRANT SELECT, INSERT, UPDATE ON charging_state TO billing_runtime;
GRANT SELECT, INSERT, UPDATE ON payment_budget TO billing_runtime;
GRANT SELECT, INSERT, UPDATE, DELETE ON fleet_member TO billing_runtime;

-- +goose Down
SET LOCAL lock_timeout = '1s';
DROP TABLE fleet_member;
DROP TABLE payment_budget;
DROP TABLE charging_state;
