// Package next holds the migrations of the chaos suite's next release
// (rolling-upgrade, docs/testing.md): an expand migration and a contract
// one of the shape a release ships. No release carries them: only a build
// with the tag upgradetest imports this package (internal/schema's
// release_next.go).
package next

import (
	"embed"
	"errors"
	"io/fs"
	"slices"
	"strings"
)

//go:embed *.sql
var files embed.FS

// With returns the migrations of released and the next release's as one
// directory, in lexical (version) order, as goose reads a release's.
func With(released fs.FS) fs.FS { return union{released, files} }

// union serves the files of released and, where released has none of
// that name, next's.
type union struct{ released, next fs.FS }

func (u union) Open(name string) (fs.File, error) {
	f, err := u.released.Open(name)
	if errors.Is(err, fs.ErrNotExist) {
		return u.next.Open(name)
	}
	return f, err
}

func (u union) ReadDir(name string) ([]fs.DirEntry, error) {
	released, err := fs.ReadDir(u.released, name)
	if err != nil || name != "." {
		return released, err
	}
	next, err := fs.ReadDir(u.next, ".")
	if err != nil {
		return nil, err
	}
	all := append(released, next...)
	slices.SortFunc(all, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return all, nil
}
