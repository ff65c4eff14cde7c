package next_test

import (
	"errors"
	"io/fs"
	"slices"
	"strings"
	"testing"

	"example.com/billing/db/migrations"
	"example.com/billing/db/migrations/next"
)

// TestWith_ServesBothInVersionOrder: the next release's migrations follow
// billing's in one directory, every one readable, as goose lists and reads
// them.
func TestWith_ServesBothInVersionOrder(t *testing.T) {
	released, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil || len(released) == 0 {
		t.Fatalf("billing's migrations: %v %v", released, err)
	}
	fsys := next.With(migrations.FS)
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.IsSorted(names) {
		t.Errorf("not in lexical order: %v", names)
	}
	if !slices.Equal(names[:len(released)], released) {
		t.Errorf("billing's migrations are not first: %v, want %v first", names, released)
	}
	added := names[len(released):]
	if len(added) == 0 || !strings.HasPrefix(added[0], "10001_") {
		t.Errorf("the next release's migrations, from 10001: %v", added)
	}
	for _, n := range names {
		if b, err := fs.ReadFile(fsys, n); err != nil || !strings.Contains(string(b), "-- +goose Up") {
			t.Errorf("%s: %v, or no Up section", n, err)
		}
	}
	if _, err := fsys.Open("10001_missing.sql"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing file: %v, want fs.ErrNotExist", err)
	}
}
