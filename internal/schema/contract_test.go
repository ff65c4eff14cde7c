package schema_test

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/lib/pq"

	"example.com/billing/db/migrations"
	"example.com/billing/internal/schema"
	"example.com/billing/internal/testenv/dbtest"
)

func TestMigrations_ContractMark(t *testing.T) {
	fsys := fstest.MapFS{
		"00001_a.sql": {Data: []byte("-- +goose Up\nCREATE TABLE a (x int);\n")},
		"00002_b.sql": {Data: []byte("-- Drops a.x.\n-- +billing contract: releases of schema 2 and newer\n-- +goose Up\nSELECT billing_contract(2);\n")},
		"embed.go":    {Data: []byte("package migrations\n")},
	}
	got, err := schema.MigrationsOf(fsys)
	if err != nil {
		t.Fatal(err)
	}
	want := []schema.Migration{{Version: 1, Path: "00001_a.sql"}, {Version: 2, Path: "00002_b.sql", RunsFrom: 2}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("migrations %+v, want %+v", got, want)
	}
	if !got[1].Contract() || got[0].Contract() {
		t.Errorf("Contract() wrong: %+v", got)
	}
}

// Every contract migration billing ships calls billing_contract with the
// schema its mark names: the database refuses it then, whoever runs it.
func TestMigrations_EveryContractCallsBillingContract(t *testing.T) {
	ms, err := schema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if !m.Contract() {
			continue
		}
		body, err := fs.ReadFile(migrations.FS, m.Path)
		if err != nil {
			t.Fatal(err)
		}
		if call := fmt.Sprintf("SELECT billing_contract(%d);", m.RunsFrom); !strings.Contains(string(body), call) {
			t.Errorf("%s is marked a contract migration for releases of schema %d and newer but does not %s", m.Path, m.RunsFrom, call)
		}
	}
}

func TestCompatibility_Check(t *testing.T) {
	tests := []struct {
		name           string
		c              schema.Compatibility
		oldest, newest int64
		wantErr        string
	}{
		{"OK_Same", schema.Compatibility{Version: 9}, 9, 9, ""},
		{"OK_NewerExpand", schema.Compatibility{Version: 12, RunsFrom: 0}, 9, 9, ""},
		{"OK_ContractThatKeepsIt", schema.Compatibility{Version: 12, RunsFrom: 9}, 9, 9, ""},
		{"OK_ReleaseAheadOfExpandItDoesNotNeed", schema.Compatibility{Version: 9}, 9, 11, ""},
		{"ErrOlder", schema.Compatibility{Version: 8}, 9, 9, "at version 8; this release runs on schemas 9 and newer"},
		{"ErrNeverMigrated", schema.Compatibility{}, 9, 9, "run billing migrate"},
		{"ErrContractForNewerOnly", schema.Compatibility{Version: 12, RunsFrom: 11}, 9, 10, "runs releases of schema 11 and newer only"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.c.Check(tt.oldest, tt.newest)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("Check: %v, want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("Check: %v, want one saying %q", err, tt.wantErr)
			}
		})
	}
}

// withUpgrade is billing's migrations plus an expand migration (a column
// the next release writes) and a contract one (the column required: a
// release that does not write it can no longer insert), as the next
// release would ship them.
func withUpgrade(t *testing.T) fstest.MapFS {
	t.Helper()
	fsys := fstest.MapFS{}
	entries, err := fs.ReadDir(migrations.FS, ".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := fs.ReadFile(migrations.FS, e.Name())
		if err != nil {
			t.Fatal(err)
		}
		fsys[e.Name()] = &fstest.MapFile{Data: b}
	}
	fsys["10001_expand.sql"] = &fstest.MapFile{Data: []byte("-- +goose Up\nALTER TABLE charge ADD COLUMN note text;\n")}
	fsys["10002_contract.sql"] = &fstest.MapFile{Data: []byte("-- +billing contract: releases of schema 10001 and newer\n-- +goose Up\nSELECT billing_contract(10001);\nALTER TABLE charge ADD CONSTRAINT charge_note_set CHECK (note IS NOT NULL) NOT VALID;\n")}
	return fsys
}

// A contract migration waits while a replica of an older release is
// alive: billing migrate applies the expand migration before it and leaves
// it pending, saying which replica it waits for; once that replica is
// gone, it applies it, and an older release can no longer start.
func TestMigrate_AContractWaitsForTheOlderReplicas(t *testing.T) {
	db, _ := dbtest.New(t)
	old := schema.Replica{Instance: uuid.Must(uuid.NewV4()), Release: "v1", Host: "pod-a", Schema: schema.Oldest, Oldest: schema.Oldest}
	if err := schema.Register(dbtest.Context(t), db, old); err != nil {
		t.Fatal(err)
	}
	rep, err := schema.MigrateFS(dbtest.Context(t), db.DB, withUpgrade(t), discard())
	if err != nil {
		t.Fatal(err)
	}
	var older *schema.OlderReplicasError
	if len(rep.Applied) != 1 || rep.Applied[0] != 10001 || len(rep.Pending) != 1 || !errors.As(rep.Refused, &older) || older.Replicas[0].Instance != old.Instance {
		t.Fatalf("applied %v, pending %v, refused %v: want the expand applied, the contract refused for replica %s", rep.Applied, rep.Pending, rep.Refused, old.Instance)
	}
	st, err := schema.ReadStatus(dbtest.Context(t), db)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Alive) != 1 || st.Compatibility.Version != 10001 {
		t.Errorf("status %+v: want the old replica alive at schema 10001", st)
	}

	// The database refuses the contract too, whoever runs it.
	var pe *pq.Error
	if _, err := db.Exec(`SELECT billing_contract(10001)`); !errors.As(err, &pe) || pe.Code != "55006" {
		t.Errorf("billing_contract with an older replica alive: %v, want object_in_use", err)
	}

	if err := schema.Stop(dbtest.Context(t), db, old.Instance); err != nil {
		t.Fatal(err)
	}
	if rep, err = schema.MigrateFS(dbtest.Context(t), db.DB, withUpgrade(t), discard()); err != nil || len(rep.Applied) != 1 || rep.Applied[0] != 10002 || rep.Refused != nil {
		t.Fatalf("once the old replica stopped: applied %v, refused %v, %v; want the contract applied", rep.Applied, rep.Refused, err)
	}
	again := old
	again.Instance = uuid.Must(uuid.NewV4())
	if err := schema.Register(dbtest.Context(t), db, again); err == nil || !strings.Contains(err.Error(), "schema 10001 and newer only") {
		t.Errorf("an older release registering after the contract: %v, want a refusal naming the schema's floor", err)
	}
}

// A replica whose heartbeat stopped (killed, cut off) is alive for 30 s,
// then gone: its contract waits no longer.
func TestAlive_AReplicaGoneQuietIsGoneAfter30s(t *testing.T) {
	db, _ := dbtest.New(t)
	r := schema.Replica{Instance: uuid.Must(uuid.NewV4()), Release: "v1", Host: "pod-b", Schema: schema.Oldest, Oldest: schema.Oldest}
	if err := schema.Register(dbtest.Context(t), db, r); err != nil {
		t.Fatal(err)
	}
	if alive, err := schema.Alive(dbtest.Context(t), db); err != nil || len(alive) != 1 {
		t.Fatalf("alive %v, %v: want the replica", alive, err)
	}
	if _, err := db.Exec(`UPDATE billing_replica SET heartbeat_at = now() - interval '31 seconds'`); err != nil {
		t.Fatal(err)
	}
	if alive, err := schema.Alive(dbtest.Context(t), db); err != nil || len(alive) != 0 {
		t.Errorf("alive %v, %v: want none 31 s after the last heartbeat", alive, err)
	}
	if _, err := schema.Heartbeat(dbtest.Context(t), db, r.Instance); err != nil {
		t.Fatal(err)
	}
	if alive, _ := schema.Alive(dbtest.Context(t), db); len(alive) != 1 || time.Since(alive[0].Heartbeat) > 10*time.Second {
		t.Errorf("alive %v after a heartbeat: want it again", alive)
	}
}
