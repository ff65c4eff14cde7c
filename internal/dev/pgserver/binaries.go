package pgserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// MinMajor is the oldest PostgreSQL the migrations run on.
const MinMajor = 15

// ErrNoLocalBinaries is returned by LocalBinaries when this machine has no
// PostgreSQL of MinMajor or later where it looks.
var ErrNoLocalBinaries = errors.New("no local PostgreSQL binaries")

// Binaries are the PostgreSQL programs a cluster is started from.
type Binaries struct {
	// Dir holds initdb and postgres.
	Dir string
	// Version is the server's, e.g. 15.18.
	Version string
	// Embedded marks the binaries fetched into the cache, as opposed to
	// the ones installed on this machine.
	Embedded bool
	// Home is the embedded installation (bin, lib and share: it finds its
	// libraries from where it lies, so it may be copied whole).
	Home string
	// Fetched is how long this process took to fetch and unpack the
	// embedded binaries: zero when they were in the cache already.
	Fetched time.Duration
}

// FindBinaries returns the local binaries (LocalBinaries) where this
// machine has them, else the embedded ones, fetched into the cache on
// first use (EmbeddedBinaries).
func FindBinaries(ctx context.Context, opts Options) (Binaries, error) {
	b, err := LocalBinaries(ctx, opts.BinDir)
	if !errors.Is(err, ErrNoLocalBinaries) {
		return b, err
	}
	cache := opts.CacheDir
	if cache == "" {
		d, err := os.UserCacheDir()
		if err != nil {
			return Binaries{}, fmt.Errorf("pgserver: cache directory of the embedded PostgreSQL: %w", err)
		}
		cache = filepath.Join(d, "billing")
	}
	return EmbeddedBinaries(ctx, cache)
}

// LocalBinaries returns the PostgreSQL installed on this machine: the one in
// binDir (PG_BIN) when it is set, else the newest of Debian's and Ubuntu's
// /usr/lib/postgresql/<major>/bin of MinMajor or later. The chaos suite
// needs them: it runs programs the embedded binaries lack (pg_basebackup).
func LocalBinaries(ctx context.Context, binDir string) (Binaries, error) {
	dirs := []string{binDir}
	if binDir == "" {
		dirs, _ = filepath.Glob("/usr/lib/postgresql/*/bin")
		// Newest first: 16 before 15, whatever the glob's order.
		slices.SortFunc(dirs, func(a, b string) int { return majorOfDir(b) - majorOfDir(a) })
	}
	var rejected []error
	for _, dir := range dirs {
		v, err := version(ctx, dir)
		if err != nil {
			rejected = append(rejected, err)
			continue
		}
		if major(v) < MinMajor {
			rejected = append(rejected, fmt.Errorf("%s is PostgreSQL %s, older than %d", dir, v, MinMajor))
			continue
		}
		return Binaries{Dir: dir, Version: v}, nil
	}
	return Binaries{}, fmt.Errorf("%w of %d or later (%v)", ErrNoLocalBinaries, MinMajor, errors.Join(rejected...))
}

var versionLine = regexp.MustCompile(`\(PostgreSQL\) (\d+(?:\.\d+)*)`)

// version is the version of the server in dir, which must also hold
// initdb.
func version(ctx context.Context, dir string) (string, error) {
	if _, err := os.Stat(filepath.Join(dir, "initdb")); err != nil {
		return "", fmt.Errorf("no initdb in %s", dir)
	}
	out, err := exec.CommandContext(ctx, filepath.Join(dir, "postgres"), "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s/postgres --version: %w", dir, err)
	}
	m := versionLine.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("%s/postgres --version: no version in %q", dir, out)
	}
	return string(m[1]), nil
}

// major is the major version of v (15 of 15.18).
func major(v string) int {
	n, _ := strconv.Atoi(strings.SplitN(v, ".", 2)[0])
	return n
}

// majorOfDir is the major version a /usr/lib/postgresql/<major>/bin names.
func majorOfDir(dir string) int { return major(filepath.Base(filepath.Dir(dir))) }
