-- What the settle's and the relay's updates write, in isolation (BENCHMARKS.md,
-- issue 32: "Why the two updates are so large"). On a throwaway cluster with a
-- database migrated by `billing migrate` and pg_walinspect created in it:
--
--   psql -d DB -c "ALTER TABLE outbox_p$(date -u +%Y%m%d) SET (fillfactor = 100)" \
--        -c "ALTER TABLE charge SET (fillfactor = 100)" -f bench/throughput/fillfactor-update.sql
--
-- then again with fillfactor 50. It inserts 128 outbox and 128 charge rows in
-- one statement each, as a settle batch does, updates them as the relay and the
-- settle do, and lists the WAL records of each step by type and relation.
\set ON_ERROR_STOP on
TRUNCATE outbox, charge;
SELECT pg_current_wal_insert_lsn() AS l0 \gset
INSERT INTO outbox (event_id, order_id, event_type, causation_id, payload, traceparent)
SELECT (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint + i), 12, '0') || '7000' || '8000' || lpad(to_hex(i), 12, '0'))::uuid,
       i, 'payment.succeeded.v1', gen_random_uuid(),
       convert_to('{"eventId":"0190a0b0-0000-7000-8000-000000000000","eventType":"payment.succeeded.v1","occurredAt":"2026-12-05T03:00:00.123456Z","orderId":123456,"customerId":4567,"amount":1999,"currency":"EUR","causationId":"0190a0b0-0000-7000-8000-000000000001","providerChargeId":"ch_0123456789abcdef01234567"}', 'UTF8'),
       '00-0123456789abcdef0123456789abcdef-0123456789abcdef-01'
FROM generate_series(1, 128) i;
INSERT INTO charge (event_id, order_id, customer_id, amount_minor, currency, status)
SELECT (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint + i), 12, '0') || '7000' || '8000' || lpad(to_hex(i), 12, '0'))::uuid,
       i, 1, 1999, 'EUR', 'pending'
FROM generate_series(1, 128) i;
SELECT pg_current_wal_insert_lsn() AS l1 \gset
UPDATE outbox SET published_at = now(), attempts = attempts + 1, last_error = NULL;
UPDATE charge SET status = 'succeeded', provider_charge_id = 'ch_0123456789abcdef01234567', settled_at = now(), updated_at = now(),
    requests = requests + 1, counted_by = 'x 1234567890abcdef billing-order-confirmed/orders.confirmed/3/12345';
SELECT 'insert' AS step, resource_manager || '/' || record_type AS kind, count(*), round(avg(record_length)) AS bytes_per_record, sum(record_length)
FROM pg_get_wal_records_info(:'l0', :'l1') WHERE block_ref LIKE '%rel%' GROUP BY 1, 2 ORDER BY 5 DESC LIMIT 6;
SELECT 'update' AS step, resource_manager || '/' || record_type AS kind,
       pg_filenode_relation(0, substring(block_ref FROM 'rel [0-9]+/[0-9]+/([0-9]+)')::oid)::regclass AS rel,
       count(*), round(avg(record_length)) AS bytes_per_record, sum(record_length)
FROM pg_get_wal_records_info(:'l1', pg_current_wal_insert_lsn()) GROUP BY 1, 2, 3 ORDER BY 6 DESC LIMIT 12;
