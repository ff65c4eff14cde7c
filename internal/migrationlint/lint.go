package migrationlint

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"
)

// Report is the outcome of linting a directory of migrations.
type Report struct {
	Files, Statements int
	// Violations are those no exception accepts.
	Violations []Violation
	// Excused counts the violations an exception accepted.
	Excused int
	// Stale are the exceptions that matched nothing.
	Stale []Exception
}

// OK reports whether the migrations pass: no violation left and no stale
// exception.
func (r Report) OK() bool {
	return len(r.Violations) == 0 && len(r.Stale) == 0
}

// Lint checks every *.sql migration in fsys, in version order, against
// billing's rules and, when squawk is not nil, squawk's, and applies the
// exceptions of fsys's ExceptionsFile.
func Lint(ctx context.Context, fsys fs.FS, squawk *Squawk) (Report, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return Report{}, fmt.Errorf("list migrations: %w", err)
	}
	// goose orders by the version prefix; billing's are zero-padded, so
	// the names sort the same way.
	sort.Strings(names)
	var files []File
	var r Report
	for _, name := range names {
		src, err := fs.ReadFile(fsys, name)
		if err != nil {
			return Report{}, fmt.Errorf("read migration: %w", err)
		}
		f, err := ParseFile(name, src)
		if err != nil {
			return Report{}, err
		}
		files = append(files, f)
		r.Statements += len(f.Up)
	}
	r.Files = len(files)
	violations := Check(files)
	if squawk != nil {
		found, err := squawk.Check(ctx, files)
		if err != nil {
			return Report{}, err
		}
		violations = append(violations, found...)
	}
	var exceptions []Exception
	src, err := fs.ReadFile(fsys, ExceptionsFile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return Report{}, fmt.Errorf("read exceptions: %w", err)
	default:
		if exceptions, err = ParseExceptions(src); err != nil {
			return Report{}, err
		}
	}
	if squawk == nil {
		// squawk's exceptions cannot be matched without squawk's findings.
		exceptions = withoutSquawk(exceptions)
	}
	r.Violations, r.Excused, r.Stale, err = excuse(files, violations, exceptions)
	if err != nil {
		return Report{}, err
	}
	sort.SliceStable(r.Violations, func(i, j int) bool {
		a, b := r.Violations[i], r.Violations[j]
		if a.File != b.File {
			return a.File < b.File
		}
		return a.Line < b.Line
	})
	return r, nil
}

func withoutSquawk(exceptions []Exception) []Exception {
	var out []Exception
	for _, e := range exceptions {
		if !strings.HasPrefix(e.Rule, SquawkPrefix) {
			out = append(out, e)
		}
	}
	return out
}
