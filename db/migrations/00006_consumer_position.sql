-- The consumer group's position, kept by the database as well as by Kafka.
--
-- Kafka's committed offset says which messages a group finished; the
-- database holds what finishing them did (claims, settled charges, outbox
-- rows). The two are written separately, so after a PostgreSQL failover that
-- lost the last acknowledged commits (asynchronous replication), Kafka can be
-- ahead of what the database remembers: the messages in between would never
-- be delivered again, and their effects would be gone. billing therefore
-- also writes each partition's position here, always after the effects of
-- the messages below it committed: whatever position the database holds,
-- everything below it is in the database too. A consumer that takes a
-- partition whose committed offset is ahead of this position consumes again
-- from here (deduplication skips what the database still has).

-- +goose Up
CREATE TABLE consumer_position (
    consumer_group text        NOT NULL,
    topic          text        NOT NULL,
    partition      integer     NOT NULL CHECK (partition >= 0),
    -- The next offset to consume: every message below it is finished and
    -- its effects are committed in this database.
    next_offset    bigint      NOT NULL CHECK (next_offset >= 0),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, partition)
);

-- +goose Down
DROP TABLE consumer_position;
