package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// seedEnv configures billing as the seed's design: kafkajs eachMessage with
// partitionsConsumedConcurrently: 3 and commitOffsets after every message.
// It is the seed scenario's one definition. A binary is given only the
// variables it reads (knownVars): one built before CONSUMER_LANES and
// CONSUMER_BATCH_MAX were retired runs with its defaults for them.
//
// Its synchronous offset commit after every message is a build of its own,
// not a setting (seedDesignBinary).
var seedEnv = []string{
	"DATABASE_MAX_CONNS=3", "MAX_IN_FLIGHT=3", // at most 3 partitions' messages at once
}

// seedDesignBinary builds this tree's cmd/billing with -tags seeddesign
// into a temporary directory: billing that commits each message's offset
// synchronously, as the seed does, instead of saving positions. The
// caller removes the directory.
func seedDesignBinary() (path, dir string, err error) {
	dir, err = os.MkdirTemp("", "billing-seeddesign-")
	if err != nil {
		return "", "", err
	}
	path = filepath.Join(dir, "billing")
	fmt.Printf("building the seed design (go build -tags seeddesign ./cmd/billing) into %s\n", path)
	build := exec.Command("go", "build", "-tags", "seeddesign", "-trimpath", "-ldflags", "-s -w", "-o", path, "./cmd/billing")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", "", fmt.Errorf("build the seed design: %w\n%s", err, out)
	}
	return path, dir, nil
}

// tagVar finds the variables of a configuration struct's env tags.
var tagVar = regexp.MustCompile(`env:"([A-Z][A-Z0-9_]*)`)

var (
	knownMu    sync.Mutex
	knownCache = map[string]map[string]bool{}
)

// knownVars are the environment variables binary reads: the names in its
// configuration structs' env tags, which every build keeps for reflection
// (stripped or not). An earlier binary does not know a later variable, and
// a later one may have retired a variable the benchmark still sets.
func knownVars(binary string) (map[string]bool, error) {
	knownMu.Lock()
	defer knownMu.Unlock()
	if known, ok := knownCache[binary]; ok {
		return known, nil
	}
	b, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	known := map[string]bool{}
	for _, m := range tagVar.FindAllSubmatch(b, -1) {
		known[string(m[1])] = true
	}
	if !known["DATABASE_URL"] || !known["KAFKA_BROKERS"] {
		return nil, fmt.Errorf("%s: no configuration variables found in the binary; is it billing?", binary)
	}
	knownCache[binary] = known
	return known, nil
}

// runtimeVars change how any Go program runs: the figures are those of the
// binary's own defaults, so the benchmark's environment does not pass them
// on (give them with -env to measure them). SSL_CERT_FILE is which
// certificates the process trusts: the benchmark's HTTP/2 provider's.
var runtimeVars = []string{"GOGC", "GOMEMLIMIT", "GODEBUG", "GOMAXPROCS", "SSL_CERT_FILE"}

// serveEnv is the environment of a billing process: the benchmark's own
// environment without the variables billing reads (tracing's OTEL_* among
// them) or the Go runtime's, then set, then extra. Of set and extra, only
// the variables the binary reads are passed; dropped lists the others.
func serveEnv(known map[string]bool, inherited, set, extra []string) (env, dropped []string) {
	for _, kv := range inherited {
		name, _, _ := strings.Cut(kv, "=")
		if known[name] || slices.Contains(runtimeVars, name) || strings.HasPrefix(name, "OTEL_") {
			continue
		}
		env = append(env, kv)
	}
	for _, kv := range append(slices.Clip(set), extra...) {
		name, _, _ := strings.Cut(kv, "=")
		if known[name] || slices.Contains(runtimeVars, name) {
			env = append(env, kv)
		} else {
			dropped = append(dropped, kv)
		}
	}
	return env, dropped
}

// lookup is the value of name in env, the last one set.
func lookup(env []string, name string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// baselineBinary finds the binary -baseline names: a file, or a commit of
// this repository, built once (as make build does) into
// ~/.cache/billing/bench-binaries/<commit>/billing.
func baselineBinary(arg string) (path, label string, err error) {
	if st, err := os.Stat(arg); err == nil && st.Mode().IsRegular() {
		return arg, "billing (baseline)", nil
	}
	out, err := exec.Command("git", "rev-parse", "--verify", "--quiet", arg+"^{commit}").Output()
	if err != nil {
		return "", "", fmt.Errorf("-baseline %q: neither a file nor a commit of this repository", arg)
	}
	commit := strings.TrimSpace(string(out))
	short := commit[:7]
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", "", err
	}
	path = filepath.Join(cache, "billing", "bench-binaries", commit, "billing")
	label = "billing " + short
	if _, err := os.Stat(path); err == nil {
		return path, label, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", "", err
	}
	fmt.Printf("building %s from commit %s into %s\n", label, commit, path)
	if err := buildCommit(commit, short, path); err != nil {
		return "", "", fmt.Errorf("build the baseline %s: %w", short, err)
	}
	return path, label, nil
}

// buildCommit builds cmd/billing of commit into path, with make build's
// flags, from a copy of the commit's tree (git archive): no worktree, no
// checkout, nothing in this repository changes.
func buildCommit(commit, short, path string) error {
	src, err := os.MkdirTemp("", "billing-baseline-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(src)
	tarball := filepath.Join(src, "tree.tar")
	if out, err := exec.Command("git", "archive", "--format=tar", "-o", tarball, commit).CombinedOutput(); err != nil {
		return fmt.Errorf("git archive: %w\n%s", err, out)
	}
	if out, err := exec.Command("tar", "-xf", tarball, "-C", src).CombinedOutput(); err != nil {
		return fmt.Errorf("tar: %w\n%s", err, out)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X main.version="+short, "-o", path+".tmp", "./cmd/billing")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, out)
	}
	return os.Rename(path+".tmp", path) // whole or not at all
}
