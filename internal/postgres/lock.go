package postgres

// LockMigrations is the id of the lock that lets one billing migrate run
// at a time: the row of goose's lock table (goose_lock) that
// schema.Migrate takes. It is goose's default id, written out so that a
// goose upgrade cannot change it. (Releases before the leases took it as a
// session advisory lock, which behind a transaction pooler stays with a
// pooled server session.)
const LockMigrations int64 = 4097083626

// OrderLockSpace is the first key of the two-key transaction locks that
// serialize the claims of one order (pg_advisory_xact_lock(OrderLockSpace,
// hashint8(order_id))). A transaction's lock is released at its end, so it
// is safe behind a transaction pooler, where a session's is not.
const OrderLockSpace int32 = 0x62696c6c // "bill"
