// Command walk counts docs/architecture.md's walk from two coverage
// profiles of TestServe_Walk (make walk): a production file is on the path
// of one event when the run that charged one valid event executed a
// statement of it that the idle run, as long, did not. It prints those
// files with the count of such statements, and the totals by file and
// package.
//
// Production files are the module's files that a release builds: test
// files are not profiled, and internal/dev, internal/testenv and the
// files of the developer build (//go:build dev) are left out.
//
//	walk IDLE.out EVENT.out
package main

import (
	"bufio"
	"cmp"
	"fmt"
	"go/build/constraint"
	"io"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: walk IDLE.out EVENT.out")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "walk:", err)
		os.Exit(1)
	}
}

func run(idlePath, eventPath string, w io.Writer) error {
	idle, err := readProfile(idlePath)
	if err != nil {
		return err
	}
	event, err := readProfile(eventPath)
	if err != nil {
		return err
	}
	files := onPath(idle, event)
	var names []string
	for f := range files {
		dev, err := developerOnly(f)
		if err != nil {
			return err
		}
		if !dev {
			names = append(names, f)
		}
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(a, b) })
	pkgs := map[string]bool{}
	for _, f := range names {
		pkgs[path.Dir(f)] = true
		fmt.Fprintf(w, "%4d  %s\n", files[f], f)
	}
	fmt.Fprintf(w, "%d production files in %d packages run statements for one event that an idle serve does not run\n", len(names), len(pkgs))
	return nil
}

// block is one coverage block: a file and its position in it.
type block struct{ file, pos string }

// profile holds, for each block, its statements and whether it ran.
type profile map[block]struct {
	stmts int
	ran   bool
}

// readProfile reads a coverage profile (any mode), merging the blocks that
// several packages' instrumentation reported.
func readProfile(name string) (profile, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	p := profile{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "mode:") || line == "" {
			continue
		}
		// example.com/billing/internal/x/y.go:12.2,14.3 2 1
		file, rest, ok := strings.Cut(line, ":")
		fields := strings.Fields(rest)
		if !ok || len(fields) != 3 {
			return nil, fmt.Errorf("%s: not a coverage line: %q", name, line)
		}
		stmts, err1 := strconv.Atoi(fields[1])
		count, err2 := strconv.Atoi(fields[2])
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%s: not a coverage line: %q", name, line)
		}
		b := block{file, fields[0]}
		e := p[b]
		e.stmts, e.ran = stmts, e.ran || count > 0
		p[b] = e
	}
	return p, sc.Err()
}

// onPath returns, by file, the statements that ran in event but not in
// idle.
func onPath(idle, event profile) map[string]int {
	files := map[string]int{}
	for b, e := range event {
		if e.ran && !idle[b].ran {
			files[b.file] += e.stmts
		}
	}
	return files
}

const module = "example.com/billing/"

// developerOnly reports whether file is in no release: the developer
// commands, the fakes and the test environment, and the files only a
// build with one of the project's tags compiles (dev, and the test
// builds upgradetest, seeddesign and chaos). A file it cannot read is an
// error: the profile and the tree do not match.
func developerOnly(file string) (bool, error) {
	rel := strings.TrimPrefix(file, module)
	if strings.HasPrefix(rel, "internal/dev/") || strings.HasPrefix(rel, "internal/testenv/") {
		return true, nil
	}
	src, err := os.ReadFile(rel)
	if err != nil {
		return false, fmt.Errorf("%s: %w (run walk from the module's root, on the tree the profiles were taken of)", file, err)
	}
	first, _, _ := strings.Cut(string(src), "\n")
	expr, err := constraint.Parse(first)
	if err != nil {
		return false, nil // no build constraint: every build has it
	}
	return !expr.Eval(releaseTag), nil
}

// releaseTag reports whether a release build (Linux, the gc compiler)
// satisfies tag; the project's own tags are a release's only when negated.
func releaseTag(tag string) bool {
	switch tag {
	case "linux", "unix", "amd64", "arm64", "gc":
		return true
	}
	return strings.HasPrefix(tag, "go1.")
}
