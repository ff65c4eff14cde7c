package schema

import (
	"context"
	"fmt"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"

	"example.com/billing/internal/postgres"
)

// Replica is one serve process as it recorded itself in billing_replica.
type Replica struct {
	Instance uuid.UUID `db:"instance"`
	Release  string    `db:"release"`
	Host     string    `db:"host"`
	// Schema is the newest schema the replica's binary embeds, Oldest the
	// oldest it runs on.
	Schema    int64      `db:"schema_version"`
	Oldest    int64      `db:"oldest_schema"`
	Started   time.Time  `db:"started_at"`
	Heartbeat time.Time  `db:"heartbeat_at"`
	Stopped   *time.Time `db:"stopped_at"`
}

// HeartbeatInterval is how often a replica renews its record; one not
// renewed for 30 s is gone (billing_replica_alive, migration 9).
const HeartbeatInterval = 5 * time.Second

// Register records r as running, unless the schema's floor keeps its
// release from running (Compatibility.Check): one transaction, so that a
// contract migration (billing_contract's SHARE lock) either sees the
// record or is seen by it.
func Register(ctx context.Context, db *sqlx.DB, r Replica) error {
	return postgres.InTx(ctx, db, func(tx *sqlx.Tx) error {
		const q = `
INSERT INTO billing_replica (instance, release, host, schema_version, oldest_schema)
VALUES ($1, $2, $3, $4, $5)`
		if _, err := tx.ExecContext(ctx, q, r.Instance, r.Release, r.Host, r.Schema, r.Oldest); err != nil {
			return fmt.Errorf("record the replica: %w", err)
		}
		c, err := Read(ctx, tx)
		if err != nil {
			return err
		}
		return c.Check(r.Oldest, r.Schema)
	})
}

// Heartbeat renews instance's record and returns the database's
// compatibility now: a contract migration may have raised its floor
// meanwhile (a replica whose heartbeats failed for 30 s counts as gone).
func Heartbeat(ctx context.Context, db *sqlx.DB, instance uuid.UUID) (Compatibility, error) {
	if _, err := db.ExecContext(ctx, `UPDATE billing_replica SET heartbeat_at = now() WHERE instance = $1`, instance); err != nil {
		return Compatibility{}, fmt.Errorf("renew the replica's record: %w", err)
	}
	return Read(ctx, db)
}

// Stop records that instance stopped cleanly.
func Stop(ctx context.Context, db *sqlx.DB, instance uuid.UUID) error {
	if _, err := db.ExecContext(ctx, `UPDATE billing_replica SET stopped_at = now() WHERE instance = $1`, instance); err != nil {
		return fmt.Errorf("record the replica's stop: %w", err)
	}
	return nil
}

// Alive returns the replicas alive now, oldest release first; none before
// migration 9.
func Alive(ctx context.Context, db sqlx.QueryerContext) ([]Replica, error) {
	var out []Replica
	err := sqlx.SelectContext(ctx, db, &out, `
SELECT instance, release, host, schema_version, oldest_schema, started_at, heartbeat_at, stopped_at
FROM billing_replica r WHERE billing_replica_alive(r) ORDER BY schema_version, started_at`)
	if undefinedTable(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list the replicas alive: %w", err)
	}
	return out, nil
}

// Forget removes the records of replicas gone for longer than age; it
// needs a role that may delete from billing_replica (the owner's, billing
// maintain's).
func Forget(ctx context.Context, db sqlx.ExecerContext, age time.Duration) (int64, error) {
	res, err := db.ExecContext(ctx, `DELETE FROM billing_replica WHERE coalesce(stopped_at, heartbeat_at) < now() - $1::interval`, fmt.Sprintf("%d seconds", int64(age.Seconds())))
	if undefinedTable(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("forget replicas gone: %w", err)
	}
	return res.RowsAffected()
}
