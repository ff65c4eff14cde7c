package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"example.com/billing/internal/audit"
	"example.com/billing/internal/config"
	"example.com/billing/internal/fleet"
	"example.com/billing/internal/postgres"
)

const pauseHelp = `
Pauses charging for every replica of KAFKA_GROUP_ID. Within 5 seconds
(each replica reads the state every second) none sends a request that
could create a payment: a call already sent is answered and settled, and a
charge still waiting for its turn is not sent but stays pending, to be sent
after billing resume. Fetching pauses without leaving the consumer group:
no rebalance, the same partitions, /readyz still 200;
billing_charging_paused is 1. Webhooks, and lookups of payments the
provider already holds, go on: they charge nothing. A replica that starts
while charging is paused starts paused.

Who (--by) and why (--reason) are recorded in operator_action (billing
audit lists them) in the transaction that sets the state. billing pause
then waits, up to --wait, until every live replica applies the pause, and
prints the state and how many do; it exits non-zero when one did not
within --wait (the pause is recorded all the same, and a replica applies
it at its next renewal). Pausing a paused group is recorded and changes
nothing. It may run with serve's own database role, e.g. with kubectl exec
in a running replica. The alert BillingChargingPausedTooLong fires when a
pause is left on (docs/operations.md).`

const resumeHelp = `
Resumes charging for every replica of KAFKA_GROUP_ID after billing pause:
within 5 seconds the replicas fetch again, and send the charges that waited
(under the same idempotency keys). Who (--by) and why (--reason) are
recorded in operator_action with the state; like billing pause it waits,
up to --wait, until every live replica applies it, and prints the state.`

// pauseCmd runs billing pause (paused) or billing resume.
func pauseCmd(ctx context.Context, paused bool, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	name, help, example := "resume", resumeHelp, `DATABASE_URL='postgres://...' billing resume --reason "INC-42 over: the provider answers again" --by alice`
	if paused {
		name, help, example = "pause", pauseHelp, `DATABASE_URL='postgres://...' billing pause --reason "INC-42: the provider double-charges" --by alice`
	}
	var cfg config.Charging
	fs := newFlagSet(name, about{synopsis: "--reason TEXT [--by NAME] [flags]", description: help, env: &cfg, example: example})
	reason := fs.String("reason", "", "why, for whoever reads billing audit later (required)")
	by := fs.String("by", "", "who acts (default: the operating system's user)")
	wait := fs.Duration("wait", 10*time.Second, "how long to wait for every live replica to apply it (0: do not wait)")
	if help, err := parseSubcommandFlags(fs, args, stdout); help || err != nil {
		return err
	}
	if *by == "" {
		*by = audit.DefaultBy()
	}
	if err := audit.Check(*by, *reason); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if *wait < 0 {
		return fmt.Errorf("%s: --wait must not be negative", name)
	}
	if err := config.Load(environ, &cfg); err != nil {
		return err
	}
	log := newLogger(stderr, cfg.Log)
	db, err := postgres.Open(cfg.Database.URL, 1)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer db.Close()

	st, action, err := fleet.SetCharging(ctx, db, cfg.GroupID, paused, audit.Action{By: *by, Reason: *reason})
	if err != nil {
		if postgres.IsConfigError(err) {
			return fmt.Errorf("DATABASE_URL: %w", err)
		}
		return fmt.Errorf("%s: %w", name, err)
	}
	log.Info("charging state set", "group", cfg.GroupID, "paused", st.Paused, "version", st.Version, "operator_action", action.ID)
	fmt.Fprintln(stdout, describeState(cfg.GroupID, st, action))
	if *wait == 0 {
		return nil
	}
	applying, live, err := awaitReplicas(ctx, cfg.GroupID, st, *wait, func(ctx context.Context) ([]fleet.Replica, error) {
		return fleet.Replicas(ctx, db, cfg.GroupID)
	})
	switch {
	case err != nil:
		return fmt.Errorf("%s: the state is recorded, but the replicas could not be read: %w", name, err)
	case live == 0:
		fmt.Fprintln(stdout, "no replica is running: each applies it as it starts")
		return nil
	}
	fmt.Fprintf(stdout, "%d of %d live replicas apply it\n", applying, live)
	if applying < live {
		return fmt.Errorf("%s: %d of %d live replicas did not apply it within %s; the state is recorded and they apply it when they next renew (see their logs)", name, live-applying, live, *wait)
	}
	return nil
}

// describeState says what the group's charging state is now, and whether
// action changed it.
func describeState(group string, st fleet.State, action audit.Action) string {
	verb := "running"
	if st.Paused {
		verb = "paused"
	}
	s := fmt.Sprintf("charging of group %s: %s", group, verb)
	if st.Version > 0 {
		s += fmt.Sprintf(" since %s by %s (%q; state version %d)", st.Since.UTC().Format(time.RFC3339), st.By, st.Reason, st.Version)
	}
	if st.ActionID != action.ID {
		s += fmt.Sprintf("; unchanged: operator action %d recorded", action.ID)
	} else {
		s += fmt.Sprintf("; operator action %d", action.ID)
	}
	return s
}

// replicaPoll is how often billing pause looks at the replicas while it
// waits for them.
const replicaPoll = 200 * time.Millisecond

// awaitReplicas polls the live replicas until every one applies st, or for
// wait, and returns how many apply it and how many are live.
func awaitReplicas(ctx context.Context, group string, st fleet.State, wait time.Duration, list func(context.Context) ([]fleet.Replica, error)) (applying, live int, err error) {
	deadline := time.Now().Add(wait)
	for {
		replicas, err := list(ctx)
		if err != nil {
			return 0, 0, err
		}
		applying = 0
		for _, r := range replicas {
			if r.Applies >= st.Version && r.Paused == st.Paused {
				applying++
			}
		}
		if applying == len(replicas) || time.Now().After(deadline) {
			return applying, len(replicas), nil
		}
		select {
		case <-ctx.Done():
			return applying, len(replicas), fmt.Errorf("waiting for the replicas of %s: %w", group, ctx.Err())
		case <-time.After(replicaPoll):
		}
	}
}
