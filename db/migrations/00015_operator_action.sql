-- What operators did to money-relevant state (pause, resume, dlq replay,
-- payment-methods import, an attempt resolved by hand, a maintain that
-- drops data early): who, why, what, when. Append-only: billing_runtime
-- may insert and read, never change or delete, and a trigger refuses an
-- UPDATE or DELETE from any role but a superuser's session that disables
-- it on purpose. billing audit lists it; billing explain shows the
-- actions on an event or an order.
--
-- An expand migration: a new table the previous release never reads.

-- +goose Up
SET LOCAL lock_timeout = '1s';

CREATE TABLE operator_action (
    id      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    -- Who: --by, by default the operating system's user.
    by      text        NOT NULL CHECK (by <> ''),
    -- Why: --reason, required.
    reason  text        NOT NULL CHECK (reason <> ''),
    -- What: the command ("pause", "dlq replay", ...).
    command text        NOT NULL CHECK (command <> ''),
    -- On what: an event id, an order id, a consumer group, "" for the
    -- whole deployment.
    subject text        NOT NULL DEFAULT '',
    -- The command's settings and results, as JSON.
    details jsonb       NOT NULL DEFAULT '{}'
);
CREATE INDEX operator_action_at ON operator_action (at);
CREATE INDEX operator_action_subject ON operator_action (subject) WHERE subject <> '';

-- +goose StatementBegin
CREATE FUNCTION operator_action_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'operator_action is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;
-- +goose StatementEnd
CREATE TRIGGER operator_action_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON operator_action
    FOR EACH STATEMENT EXECUTE FUNCTION operator_action_append_only();

GRANT SELECT, INSERT ON operator_action TO billing_runtime;

-- +goose Down
SET LOCAL lock_timeout = '1s';
DROP TABLE operator_action;
DROP FUNCTION operator_action_append_only();
