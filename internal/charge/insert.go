//go:build !upgradetest

package charge

// insertPending records new attempts (InsertPending).
const insertPending = `
INSERT INTO charge (event_id, order_id, customer_id, amount_minor, currency, status)
SELECT e, o, c, a, cur, $6
FROM unnest($1::uuid[], $2::int8[], $3::int8[], $4::int8[], $5::text[]) AS t(e, o, c, a, cur)`
