package charge

// insertAttempts records new attempts (Insert). The chaos suite's next
// release writes one column more, its seam in nextColumns and nextValues
// (insert_next.go); a release writes none (insert_release.go).
const insertAttempts = `
INSERT INTO charge (event_id, order_id, customer_id, amount_minor, currency, status, customer_ref, payment_method_ref,
                    last_error, settled_at, deferred, updated_at` + nextColumns + `)
SELECT e, o, c, a, cur, st, NULLIF(cref, ''), NULLIF(pref, ''), NULLIF(err, ''),
       CASE WHEN st = $10 THEN NULL ELSE now() END, d,
       -- a deferred attempt has no message to send it: recovery takes it at once
       CASE WHEN d THEN '-infinity'::timestamptz ELSE now() END` + nextValues + `
FROM unnest($1::uuid[], $2::int8[], $3::int8[], $4::int8[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $11::bool[])
    AS t(e, o, c, a, cur, st, cref, pref, err, d)`
