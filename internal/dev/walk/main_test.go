package main

import (
	"maps"
	"os"
	"path/filepath"
	"testing"
)

func TestOnPath(t *testing.T) {
	a := block{"m/a.go", "1.1,2.2"}
	b := block{"m/a.go", "3.1,4.2"}
	c := block{"m/c.go", "1.1,9.2"}
	type entry = struct {
		stmts int
		ran   bool
	}
	tests := []struct {
		name        string
		idle, event profile
		want        map[string]int
	}{
		{"ran in both: not the event's", profile{a: {2, true}}, profile{a: {2, true}}, map[string]int{}},
		{"ran in neither", profile{a: {2, false}}, profile{a: {2, false}}, map[string]int{}},
		{"ran for the event only", profile{a: {2, false}, b: {3, true}}, profile{a: {2, true}, b: {3, true}}, map[string]int{"m/a.go": 2}},
		{"statements summed by file", profile{}, profile{a: {2, true}, b: {3, true}, c: {1, true}}, map[string]int{"m/a.go": 5, "m/c.go": 1}},
		{"absent from idle counts as not run", profile{}, profile{c: entry{4, true}}, map[string]int{"m/c.go": 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := onPath(tt.idle, tt.event); !maps.Equal(got, tt.want) {
				t.Errorf("onPath = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestReadProfile_MergesBlocksReportedTwice(t *testing.T) {
	p, err := readProfile(writeFile(t, "mode: set\nm/a.go:1.1,2.2 2 0\nm/a.go:1.1,2.2 2 1\nm/b.go:3.1,4.2 1 0\n"))
	if err != nil {
		t.Fatal(err)
	}
	if e := p[block{"m/a.go", "1.1,2.2"}]; !e.ran || e.stmts != 2 {
		t.Errorf("a block one package ran and another did not: %+v, want ran with 2 statements", e)
	}
	if e := p[block{"m/b.go", "3.1,4.2"}]; e.ran {
		t.Errorf("a block that never ran: %+v", e)
	}
	if _, err := readProfile(writeFile(t, "mode: set\nnot a line\n")); err == nil {
		t.Error("a malformed line was accepted")
	}
}

func TestDeveloperOnly(t *testing.T) {
	tests := []struct {
		file string
		want bool
	}{
		{module + "internal/dev/fakepsp/fakepsp.go", true},
		{module + "internal/testenv/wait/wait.go", true},
		{module + "cmd/billing/dev.go", true},                 // //go:build dev
		{module + "cmd/billing/nodev.go", false},              // //go:build !dev: a release's
		{module + "internal/charge/insert_release.go", false}, // //go:build !upgradetest
		{module + "internal/charge/insert_next.go", true},     // //go:build upgradetest
		{module + "cmd/billing/serve.go", false},
		{module + "internal/billing/billing.go", false},
	}
	// The paths are the module's, relative to its root.
	t.Chdir("../../..")
	for _, tt := range tests {
		if got, err := developerOnly(tt.file); err != nil || got != tt.want {
			t.Errorf("developerOnly(%s) = %v, %v; want %v", tt.file, got, err, tt.want)
		}
	}
	if _, err := developerOnly(module + "internal/no/such.go"); err == nil {
		t.Error("a file the tree lacks was taken for a release's")
	}
}

func writeFile(t *testing.T, text string) string {
	t.Helper()
	name := filepath.Join(t.TempDir(), "p.out")
	if err := os.WriteFile(name, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return name
}
