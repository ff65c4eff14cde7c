package main

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"

	"example.com/billing/internal/config"
	"example.com/billing/internal/fleet"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/payment"
)

// fleetMember is this replica's place in its group's fleet
// (internal/fleet): its share of the provider account's budget and the
// charging state it follows, renewed in background until leave.
type fleetMember struct {
	*fleet.Member
	stop context.CancelFunc
	done sync.WaitGroup
	log  *slog.Logger
}

// joinFleet joins the group's fleet before serve takes anything: the
// payment client gets its first share (it sends nothing before) and
// follows the charging state, so that a replica that starts while charging
// is paused starts paused. A database that does not answer is waited for;
// ctx's error is returned when ctx ends first. The renewals run on until
// leave, past ctx: a drain still sends requests, within its share.
func joinFleet(ctx context.Context, db *sqlx.DB, cfg config.Serve, instance uuid.UUID, payer *payment.Client, m *metrics.Metrics, log *slog.Logger) (*fleetMember, error) {
	member := fleet.NewMember(db, fleet.Config{Group: cfg.Kafka.GroupID, Instance: instance, AccountMaxRPS: cfg.Fleet.AccountMaxRPS}, payer, m, log)
	retry := backoff.NewExponentialBackOff()
	retry.MaxInterval = 5 * time.Second
	for {
		err := member.Join(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		wait := retry.NextBackOff()
		log.Warn("cannot join the fleet (its charging state, its share of the provider's budget) in the database; waiting", "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
	member.Follow(payer)
	log.Info("joined the fleet", "group", cfg.Kafka.GroupID, "charging_paused", member.Paused(), "payment_account_max_rps", cfg.Fleet.AccountMaxRPS)
	if member.Paused() {
		log.Warn("charging is paused (billing pause): this replica starts paused and sends no charge until billing resume", "group", cfg.Kafka.GroupID)
	}
	renewing, stop := context.WithCancel(context.WithoutCancel(ctx))
	f := &fleetMember{Member: member, stop: stop, log: log}
	f.done.Go(func() { member.Run(renewing) })
	return f, nil
}

// leave stops the renewals and gives the share back: serve calls it once
// nothing of it sends requests any more, or another replica could take
// the share while this one still used it.
func (f *fleetMember) leave() {
	f.stop()
	f.done.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := f.Leave(ctx); err != nil {
		f.log.Warn("cannot give this replica's share of the provider's budget back; the others take it once it expires", "err", err, "within", fleet.LeaseTTL)
	}
}
