-- Where the dedup store's memory ends.
--
-- Retention drops whole days of processed_event. A redelivered event of a
-- dropped day finds no partition; creating one for it would give it an empty
-- memory, and it would be charged again as new. Maintenance records here the
-- first day it kept before it drops anything, so that such an event is
-- parked as stale-event instead, whatever retention the consumer or another
-- maintainer is configured with.

-- +goose Up
CREATE TABLE processed_event_horizon (
    only_row       boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    dropped_before date    NOT NULL
);

-- +goose Down
DROP TABLE processed_event_horizon;
