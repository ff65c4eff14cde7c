//go:build upgradetest

package charge

// insertPending, in the chaos suite's next release (the tag upgradetest,
// never shipped), also says which release recorded the attempt, in the
// column its expand migration adds (db/migrations/next).
const insertPending = `
INSERT INTO charge (event_id, order_id, customer_id, amount_minor, currency, status, recorded_by)
SELECT e, o, c, a, cur, $6, 'the next release'
FROM unnest($1::uuid[], $2::int8[], $3::int8[], $4::int8[], $5::text[]) AS t(e, o, c, a, cur)`
