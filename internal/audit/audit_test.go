package audit_test

import (
	"testing"
	"time"

	"example.com/billing/internal/audit"
	"example.com/billing/internal/testenv/dbtest"
)

func TestCheck(t *testing.T) {
	tests := []struct {
		name, by, reason string
		ok               bool
	}{
		{"OK", "alice", "provider incident INC-42", true},
		{"ErrNoReason", "alice", "", false},
		{"ErrBlankReason", "alice", "  ", false},
		{"ErrNoBy", "", "why", false},
		{"ErrTooLong", "alice", string(make([]byte, 1001)), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := audit.Check(tt.by, tt.reason); (err == nil) != tt.ok {
				t.Errorf("Check(%q, %q) = %v, want ok %v", tt.by, tt.reason, err, tt.ok)
			}
		})
	}
}

// Actions are recorded and listed; the table refuses to change or lose
// one, whoever asks.
func TestRecordIsAppendOnly(t *testing.T) {
	db, _ := dbtest.New(t)
	ctx := dbtest.Context(t)
	before := time.Now().Add(-time.Minute)
	a, err := audit.Record(ctx, db, audit.Action{By: "alice", Reason: "INC-42", Command: "pause", Subject: "billing-order-confirmed"}, map[string]any{"paused": true})
	if err != nil {
		t.Fatal(err)
	}
	if a.ID == 0 || a.At.Before(before) || string(a.Details) != `{"paused": true}` {
		t.Errorf("recorded %+v (details %s)", a, a.Details)
	}
	if _, err := audit.Record(ctx, db, audit.Action{By: "bob", Command: "resume"}, nil); err == nil {
		t.Error("an action without a reason was recorded")
	}
	got, err := audit.Since(ctx, db, before)
	if err != nil || len(got) != 1 || got[0].By != "alice" {
		t.Fatalf("Since = %+v, %v; want alice's action", got, err)
	}
	if about, err := audit.About(ctx, db, []string{"billing-order-confirmed", "other"}); err != nil || len(about) != 1 {
		t.Errorf("About = %+v, %v; want alice's action", about, err)
	}
	for _, q := range []string{`UPDATE operator_action SET reason = 'nothing happened'`, `DELETE FROM operator_action`, `TRUNCATE operator_action`} {
		if _, err := db.Exec(q); err == nil {
			t.Errorf("%s: accepted", q)
		}
	}
	if got, _ := audit.Since(ctx, db, before); len(got) != 1 || got[0].Reason != "INC-42" {
		t.Errorf("after the refused changes: %+v", got)
	}
}
