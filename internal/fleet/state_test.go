package fleet_test

import (
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/gofrs/uuid/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"example.com/billing/internal/audit"
	"example.com/billing/internal/fleet"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/testenv/dbtest"
)

// follower records the charging states it was told.
type follower struct {
	mu     sync.Mutex
	states []bool
}

func (f *follower) SetPaused(paused bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.states = append(f.states, paused)
}

func (f *follower) told() []bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]bool(nil), f.states...)
}

// A pause and a resume are recorded with their operator actions; a pause
// of a paused group is recorded and changes nothing; members apply the
// state at their renewal, record the version they apply, and one that
// joins while paused starts paused.
func TestSetCharging_MembersFollow(t *testing.T) {
	db, _ := dbtest.New(t)
	ctx := dbtest.Context(t)
	const group = "g"
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	m := metrics.New(prometheus.NewRegistry())
	running := fleet.NewMember(db, fleet.Config{Group: group, Instance: uuid.Must(uuid.NewV4())}, nil, m, log)
	if err := running.Join(ctx); err != nil {
		t.Fatal(err)
	}
	var f follower
	running.Follow(&f)

	if _, _, err := fleet.SetCharging(ctx, db, group, true, audit.Action{By: "alice"}); err == nil {
		t.Fatal("a pause without a reason was set")
	}
	st, a, err := fleet.SetCharging(ctx, db, group, true, audit.Action{By: "alice", Reason: "INC-42"})
	if err != nil {
		t.Fatal(err)
	}
	if !st.Paused || st.Version != 1 || st.By != "alice" || st.Reason != "INC-42" || st.ActionID != a.ID || a.Command != "pause" || a.Subject != group {
		t.Fatalf("state %+v, action %+v", st, a)
	}
	again, a2, err := fleet.SetCharging(ctx, db, group, true, audit.Action{By: "bob", Reason: "INC-42 too"})
	if err != nil {
		t.Fatal(err)
	}
	if again.Version != 1 || again.By != "alice" || a2.ID == a.ID {
		t.Errorf("a second pause: state %+v, action %+v; want the first's state and an action of its own", again, a2)
	}

	// The member applies it at its renewal, and says so.
	if err := running.Join(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.told(); len(got) != 2 || got[0] || !got[1] {
		t.Errorf("the follower was told %v, want running then paused", got)
	}
	if got := testutil.ToFloat64(m.ChargingPaused); got != 1 {
		t.Errorf("billing_charging_paused = %v, want 1", got)
	}
	replicas, err := fleet.Replicas(ctx, db, group)
	if err != nil || len(replicas) != 1 || replicas[0].Applies != 1 || !replicas[0].Paused {
		t.Fatalf("replicas %+v, %v; want one applying the pause's version 1", replicas, err)
	}

	// One that joins while paused starts paused.
	late := fleet.NewMember(db, fleet.Config{Group: group, Instance: uuid.Must(uuid.NewV4())}, nil, metrics.New(prometheus.NewRegistry()), log)
	if err := late.Join(ctx); err != nil {
		t.Fatal(err)
	}
	var lf follower
	late.Follow(&lf)
	if got := lf.told(); len(got) != 1 || !got[0] {
		t.Errorf("the late member's follower was told %v, want paused at once", got)
	}

	st, _, err = fleet.SetCharging(ctx, db, group, false, audit.Action{By: "alice", Reason: "INC-42 over"})
	if err != nil || st.Paused || st.Version != 2 {
		t.Fatalf("resume: %+v, %v", st, err)
	}
	if err := running.Join(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.told(); len(got) != 3 || got[2] {
		t.Errorf("the follower was told %v, want resumed last", got)
	}
	actions, err := audit.About(ctx, db, []string{group})
	if err != nil || len(actions) != 3 {
		t.Errorf("operator actions on the group: %+v, %v; want pause, pause, resume", actions, err)
	}

	// A member that leaves is no longer counted.
	if err := late.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if replicas, err := fleet.Replicas(ctx, db, group); err != nil || len(replicas) != 1 {
		t.Errorf("after a member left: %+v, %v", replicas, err)
	}
}
