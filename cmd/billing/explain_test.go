package main

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/dlq"
	"example.com/billing/internal/explain"
	"example.com/billing/internal/outbox"
	"example.com/billing/internal/testenv/kafkatest"
	"example.com/billing/internal/testenv/wait"
)

// runBilling runs `billing args...` in-process and returns its stdout and
// error.
func runBilling(t *testing.T, env map[string]string, args ...string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), append([]string{"billing"}, args...), env, nil, &stdout, &stderr)
	if err != nil {
		t.Logf("billing %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), err
}

// explainJSON runs billing explain subject --json and decodes its story.
func explainJSON(t *testing.T, env map[string]string, subject string) explain.Story {
	t.Helper()
	out, err := runBilling(t, env, "explain", subject, "--json")
	if err != nil {
		t.Fatalf("billing explain %s: %v", subject, err)
	}
	var st explain.Story
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("billing explain %s --json: %v\n%s", subject, err, out)
	}
	return st
}

// refuseRecords makes every insert into operator_action fail, until the
// returned function is called: what a failed record looks like to a
// command.
func refuseRecords(t *testing.T, db *sqlx.DB) func() {
	t.Helper()
	for _, q := range []string{
		`CREATE FUNCTION refuse_record() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'the test refuses the record'; END $$`,
		`CREATE TRIGGER refuse_record BEFORE INSERT ON operator_action FOR EACH ROW EXECUTE FUNCTION refuse_record()`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	return func() {
		if _, err := db.Exec(`DROP TRIGGER refuse_record ON operator_action; DROP FUNCTION refuse_record()`); err != nil {
			t.Fatal(err)
		}
	}
}

// billing explain tells each kind of event's story from the database and
// the topics: a charged event, a declined one, one delivered twice, one
// parked, one parked and then replayed by an operator; billing audit lists
// the replay, which was recorded before it republished anything.
func TestExplain_EachKindOfEvent(t *testing.T) {
	h := newHarness(t, 2)
	// The provider sits behind a switch, so that the test can fix it as an
	// operator would (dlq_test.go).
	opts := fakepsp.Options{Seed: 1, DeclineEvery: 50}
	var psp atomic.Pointer[fakepsp.Server]
	psp.Store(fakepsp.New(opts))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { psp.Load().ServeHTTP(w, r) }))
	t.Cleanup(srv.Close)
	env := h.environ("PAYMENT_BASE_URL", srv.URL)
	h.serve(env)

	charged, chargedValue := event(t, 71, 7100, "EUR")
	declined, declinedValue := event(t, 50, 5000, "EUR")
	twice, twiceValue := event(t, 73, 7300, "EUR")
	parked, parkedValue := event(t, 74, 7400, "EUR")
	// Three decimals for a currency of two: the event breaks the contract.
	parkedValue = bytes.Replace(parkedValue, []byte(`"totalAmount":74.00`), []byte(`"totalAmount":74.001`), 1)
	replayed, replayedValue := event(t, 41, 4100, "EUR")
	// The provider holds the replayed event's key with another body: 422,
	// parked provider-rejected until the provider is fixed.
	if code := postCharge(t, srv.URL, "", 41, replayed.ID.String()); code != http.StatusOK {
		t.Fatalf("seed provider: %d", code)
	}
	h.publish(0, "71", chargedValue)
	h.publish(1, "50", declinedValue)
	h.publish(0, "73", twiceValue)
	h.publish(1, "74", parkedValue)
	h.publish(0, "41", replayedValue)
	h.publish(0, "73", twiceValue) // delivered again
	h.waitCaughtUp()
	wait.For(t, 30*time.Second, "4 outcome events published", func() bool { return h.published() == 4 })

	// The operator fixes the provider and replays what it refused.
	psp.Store(fakepsp.New(fakepsp.Options{Seed: 2, DeclineEvery: 50}))
	before := kafkatest.EndOffsets(t, h.client, h.broker.Topic)

	// A replay whose record fails republishes nothing.
	allow := refuseRecords(t, h.db)
	if _, err := runBilling(t, env, "dlq", "replay", "--code", "provider-rejected", "--reason", "INC-42", "--by", "alice"); err == nil ||
		!strings.Contains(err.Error(), "nothing republished") {
		t.Errorf("dlq replay with its record refused: err = %v, want nothing republished", err)
	}
	if after := kafkatest.EndOffsets(t, h.client, h.broker.Topic); !maps.Equal(after, before) {
		t.Fatalf("dlq replay republished with its record refused: end offsets %v, were %v", after, before)
	}
	allow()

	out := dlqReplay(t, env, "--code", "provider-rejected", "--reason", "INC-42: the provider's key store is fixed", "--by", "alice")
	if !strings.Contains(out, "replayed 1,") || !strings.Contains(out, "operator action") {
		t.Errorf("replay output:\n%s", out)
	}
	h.waitCaughtUp()
	wait.For(t, 30*time.Second, "the replayed event's outcome published", func() bool { return h.published() == 5 })

	// billing audit lists the replay, with who, why and what.
	var listing auditListing
	out, err := runBilling(t, env, "audit", "--json")
	if err != nil || json.Unmarshal([]byte(out), &listing) != nil {
		t.Fatalf("billing audit --json: %v\n%s", err, out)
	}
	if len(listing.Actions) != 1 {
		t.Fatalf("billing audit lists %d actions, want the replay alone:\n%s", len(listing.Actions), out)
	}
	replay := listing.Actions[0]
	var plan dlq.Plan
	if err := json.Unmarshal(replay.Details, &plan); err != nil || replay.Command != "dlq replay" || replay.By != "alice" ||
		replay.Reason != "INC-42: the provider's key store is fixed" || replay.Subject != h.broker.DLQTopic ||
		plan.Code != "provider-rejected" || len(plan.Ranges) == 0 {
		t.Errorf("the replay was recorded as %+v (details %s)", replay, replay.Details)
	}
	text, _ := runBilling(t, env, "audit")
	if !strings.Contains(text, "alice  dlq replay  "+h.broker.DLQTopic) || !strings.Contains(text, "why:  INC-42") || !strings.Contains(text, "1 operator actions since") {
		t.Errorf("billing audit:\n%s", text)
	}
	t.Logf("billing audit, after the replay:\n%s", text)

	type want struct {
		reads, replays, claims int
		status                 string   // the attempt's, "" for none
		outcomes               []string // published, in order
		parked                 string   // the parking's reason code, "" for none
		action                 bool     // the replay's action is in the story
		summary                string
	}
	for _, tc := range []struct {
		name string
		id   string
		want want
	}{
		{"Charged", charged.ID.String(), want{reads: 1, claims: 1, status: "succeeded", outcomes: []string{outbox.Succeeded}, summary: "charged 71.00 EUR"}},
		{"Declined", declined.ID.String(), want{reads: 1, claims: 1, status: "declined", outcomes: []string{outbox.Declined}, summary: "declined"}},
		{"Duplicate", twice.ID.String(), want{reads: 2, claims: 1, status: "succeeded", outcomes: []string{outbox.Succeeded}, summary: "read twice"}},
		{"Parked", parked.ID.String(), want{reads: 1, parked: "invalid-event", summary: "parked (invalid-event)"}},
		{"Replayed", replayed.ID.String(), want{reads: 2, replays: 1, claims: 1, status: "succeeded", outcomes: []string{outbox.Failed, outbox.Succeeded},
			parked: "provider-rejected", action: true, summary: "replayed once"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := explainJSON(t, env, tc.id)
			if len(st.Events) != 1 {
				t.Fatalf("story of %d events, want 1: %+v", len(st.Events), st)
			}
			ev := st.Events[0]
			w := tc.want
			if !strings.Contains(ev.Summary, w.summary) {
				t.Errorf("summary %q, want it to say %q", ev.Summary, w.summary)
			}
			replays := 0
			for _, r := range ev.Reads {
				if r.Topic != h.broker.Topic {
					t.Errorf("read on %s, want %s", r.Topic, h.broker.Topic)
				}
				if r.ReplayedFrom != "" {
					replays++
					if r.ReplayAction != replay.ID {
						t.Errorf("the replayed copy names operator action %d, want %d", r.ReplayAction, replay.ID)
					}
				}
			}
			if len(ev.Reads) != w.reads || replays != w.replays {
				t.Errorf("%d reads (%d replayed), want %d (%d): %+v", len(ev.Reads), replays, w.reads, w.replays, ev.Reads)
			}
			if len(ev.Claims) != w.claims || (w.claims > 0 && ev.Claims[0].Group != h.broker.Group) {
				t.Errorf("claims %+v, want %d of group %s", ev.Claims, w.claims, h.broker.Group)
			}
			switch {
			case w.status == "" && ev.Attempt != nil:
				t.Errorf("attempt %+v, want none", ev.Attempt)
			case w.status != "" && (ev.Attempt == nil || ev.Attempt.Status != w.status):
				t.Errorf("attempt %+v, want %s", ev.Attempt, w.status)
			case w.status == "succeeded" && (ev.Attempt.ProviderChargeID == "" || ev.Attempt.SettledAt == nil):
				t.Errorf("succeeded attempt without its provider id or settle time: %+v", ev.Attempt)
			}
			var types []string
			for _, o := range ev.Outcomes {
				if o.State != explain.Published || o.Read == nil || o.Read.Topic != h.broker.OutcomeTopic {
					t.Errorf("outcome %+v, want it found on %s", o, h.broker.OutcomeTopic)
				}
				types = append(types, o.Type)
			}
			if !slices.Equal(types, w.outcomes) {
				t.Errorf("outcomes %q, want %q", types, w.outcomes)
			}
			var codes []string
			for _, p := range ev.Parkings {
				codes = append(codes, strings.SplitN(p.Reason, ":", 2)[0])
				if p.Topic != h.broker.DLQTopic || !strings.HasPrefix(p.Original, h.broker.Topic+"/") {
					t.Errorf("parking %+v, want one on %s from %s", p, h.broker.DLQTopic, h.broker.Topic)
				}
			}
			if wantCodes := slices.DeleteFunc([]string{w.parked}, func(s string) bool { return s == "" }); !slices.Equal(codes, wantCodes) {
				t.Errorf("parkings %q, want %q", codes, wantCodes)
			}
			var actions []int64
			for _, a := range st.Actions {
				actions = append(actions, a.ID)
			}
			if wantActions := map[bool][]int64{true: {replay.ID}}[w.action]; !slices.Equal(actions, wantActions) {
				t.Errorf("operator actions %d, want %d", actions, wantActions)
			}
			for _, s := range st.Searches {
				if s.Err != "" || s.Stopped != "" {
					t.Errorf("search %+v failed or stopped", s)
				}
			}
			if tc.name == "Charged" || tc.name == "Parked" || tc.name == "Replayed" {
				text, err := runBilling(t, env, "explain", tc.id)
				if err != nil || !strings.Contains(text, "event "+tc.id+": ") || !strings.Contains(text, "kafka searches:") {
					t.Errorf("billing explain %s: %v\n%s", tc.id, err, text)
				}
				t.Logf("billing explain %s (%s):\n%s", tc.id, tc.name, text)
			}
		})
	}

	// An order id explains each event billing recorded of it.
	st := explainJSON(t, env, "73")
	if st.OrderID != 73 || len(st.Events) != 1 || st.Events[0].EventID != twice.ID {
		t.Errorf("billing explain 73: order %d, events %+v; want the event of order 73", st.OrderID, st.Events)
	}
	// Without Kafka, the database's part of the story.
	out, err = runBilling(t, env, "explain", charged.ID.String(), "--kafka=false")
	if err != nil || !strings.Contains(out, "attempt   succeeded") || !strings.Contains(out, "Kafka was not searched") {
		t.Errorf("billing explain --kafka=false: %v\n%s", err, out)
	}
	if _, err := runBilling(t, env, "explain", "not-an-id"); err == nil || !strings.Contains(err.Error(), "not an event id") {
		t.Errorf("billing explain not-an-id: err = %v", err)
	}
}
