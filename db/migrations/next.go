//go:build upgradetest

package migrations

// The chaos suite's rolling-upgrade scenario builds "the next release" of
// billing with the build tag upgradetest: billing's migrations and those of
// next/, an expand migration and a contract one of the shape a release
// ships, served as if they were in this directory. No release of billing
// is built with the tag.

import (
	"embed"
	"errors"
	"io/fs"
	"slices"
	"strings"
)

//go:embed *.sql next/*.sql
var files embed.FS

// FS holds billing's migrations and the next release's.
var FS fs.FS = withNext{files}

// withNext serves next/'s files in the root.
type withNext struct{ files embed.FS }

func (n withNext) Open(name string) (fs.File, error) {
	f, err := n.files.Open(name)
	if errors.Is(err, fs.ErrNotExist) && name != "next" {
		return n.files.Open("next/" + name)
	}
	return f, err
}

func (n withNext) ReadDir(name string) ([]fs.DirEntry, error) {
	root, err := n.files.ReadDir(name)
	if err != nil || name != "." {
		return root, err
	}
	next, err := n.files.ReadDir("next")
	if err != nil {
		return nil, err
	}
	out := slices.DeleteFunc(root, func(e fs.DirEntry) bool { return e.Name() == "next" })
	out = append(out, next...)
	slices.SortFunc(out, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return out, nil
}
