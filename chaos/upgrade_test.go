//go:build chaos

package chaos_test

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"example.com/billing/internal/postgres"
)

// A rolling upgrade across a schema change, and back (issue 30): replicas
// of the previous release charge under steady load; billing migrate of the
// next release applies its expand migration (a column the next release
// writes, a backfill in batches, an index built concurrently) and refuses
// its contract migration while a replica of the previous release is alive;
// replicas are replaced one at a time as a Deployment does (the new one
// ready before the old one gets SIGTERM), one of them rolled back to the
// previous release and forward again; then billing migrate applies the
// contract.
//
// The previous release is billing at previousRelease, built from this
// repository's history; the next one is this tree built with the tag
// upgradetest, which adds the test-only migrations of db/migrations/next and
// the code that writes their column.

// previousRelease is the commit the previous release is built from: the
// first that records its replicas (migration 9), which billing migrate
// needs to know it is alive.
const previousRelease = "ecf6129"

// lockBound is the longest a claim or settle may wait for a lock that is
// not an order's own advisory lock while migrations run: the migrations'
// lock_timeout, after which a migration's statement gives way.
const lockBound = time.Second

// releaseBinaries are the previous and the next release's binaries, built
// once per suite on first use.
type releaseBinaries struct {
	once           sync.Once
	previousBinary string
	nextBinary     string
	err            error
}

var releases releaseBinaries

func (b *releaseBinaries) previous() (string, error) {
	b.once.Do(b.build)
	return b.previousBinary, b.err
}

func (b *releaseBinaries) next() (string, error) {
	b.once.Do(b.build)
	return b.nextBinary, b.err
}

func (b *releaseBinaries) build() {
	started := time.Now()
	root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		b.err = fmt.Errorf("the previous release is built from this repository's history (git): %w", err)
		return
	}
	src := filepath.Join(suite.dir, "previous-release")
	if b.err = extractCommit(strings.TrimSpace(string(root)), previousRelease, src); b.err != nil {
		return
	}
	b.previousBinary = filepath.Join(suite.dir, "billing-previous")
	if b.err = goBuild(src, b.previousBinary, "previous"); b.err != nil {
		return
	}
	b.nextBinary = filepath.Join(suite.dir, "billing-next")
	if b.err = goBuild(".", b.nextBinary, "next", "-tags", "upgradetest"); b.err != nil {
		return
	}
	fmt.Printf("chaos: built the previous release (%s) and the next one (this tree, -tags upgradetest) in %s\n", previousRelease, time.Since(started).Round(time.Second))
}

// extractCommit writes the tree of commit, of the repository at root, into
// dir (git archive: no worktree, nothing of the repository touched).
func extractCommit(root, commit, dir string) error {
	out, err := exec.Command("git", "-C", root, "archive", "--format=tar", commit).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return fmt.Errorf("git archive %s (a shallow clone lacks it: git fetch --unshallow): %w", commit, err)
	}
	tr := tar.NewReader(bytes.NewReader(out))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		path := filepath.Join(dir, filepath.FromSlash(h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(path, 0o755)
		case tar.TypeReg:
			if err = os.MkdirAll(filepath.Dir(path), 0o755); err == nil {
				var f *os.File
				if f, err = os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o777); err == nil {
					_, err = io.Copy(f, tr)
					err = errors.Join(err, f.Close())
				}
			}
		}
		if err != nil {
			return err
		}
	}
}

// goBuild builds cmd/billing of the module at dir into out, as version,
// with make build's flags (and extra ones).
func goBuild(dir, out, version string, extra ...string) error {
	args := append([]string{"build", "-trimpath", "-ldflags", "-X main.version=" + version}, extra...)
	cmd := exec.Command("go", append(args, "-o", out, "./cmd/billing")...)
	cmd.Dir = dir
	if dir == "." {
		cmd.Dir = ".." // the test runs in chaos/
	}
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build the %s release: %w\n%s", version, err, msg)
	}
	return nil
}

// upgrade is what the rolling upgrade saw.
type upgrade struct {
	stop chan struct{}
	done sync.WaitGroup

	mu sync.Mutex
	// noneReady counts the samples (every 200 ms) at which no running
	// replica answered /readyz 200; samples counts them all.
	noneReady, samples int
	// lockWait is the longest a pipeline statement was seen waiting for a
	// lock (not an order's advisory lock), and what it was.
	lockWait  time.Duration
	lockQuery string
	// refused is what billing migrate said of the contract while the
	// previous release ran; applied whether a later run applied it;
	// expandTook how long the expand migration took under load.
	refused, expandTook string
	applied             bool
	// lockSamples counts the looks at pg_stat_activity.
	lockSamples int
}

// logField returns field of the first JSON log line of out whose message
// starts with msg (and whose key has value, when given).
func logField(out, msg, field string, where ...string) (string, bool) {
	for _, line := range strings.Split(out, "\n") {
		var l map[string]any
		if json.Unmarshal([]byte(line), &l) != nil {
			continue
		}
		if m, _ := l["msg"].(string); !strings.HasPrefix(m, msg) {
			continue
		}
		if len(where) == 2 && fmt.Sprint(l[where[0]]) != where[1] {
			continue
		}
		return fmt.Sprint(l[field]), true
	}
	return "", false
}

// watch samples, until stop, whether some replica is ready and how long
// pipeline statements wait for locks.
func (u *upgrade) watch(r *run) {
	db, err := postgres.Open(r.dsn, 1)
	if err != nil {
		r.t.Errorf("rolling-upgrade: %v", err)
		return
	}
	u.done.Go(func() {
		defer db.Close()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-u.stop:
				return
			case <-tick.C:
			}
			var waits []struct {
				Waited float64 `db:"waited"`
				Query  string  `db:"query"`
			}
			_ = db.Select(&waits, `
SELECT extract(epoch FROM now() - query_start)::float8 AS waited, left(query, 120) AS query FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend' AND wait_event_type = 'Lock' AND wait_event <> 'advisory'
  AND query !~* '^\s*(ALTER|CREATE|CALL|DROP|SET|SELECT billing_contract)'`)
			u.mu.Lock()
			u.lockSamples++
			for _, w := range waits {
				if d := time.Duration(w.Waited * float64(time.Second)); d > u.lockWait {
					u.lockWait, u.lockQuery = d, w.Query
				}
			}
			u.mu.Unlock()
			if n%2 != 0 {
				continue
			}
			ready := false
			for _, c := range r.running() {
				if c.get("/readyz") == http.StatusOK {
					ready = true
					break
				}
			}
			u.mu.Lock()
			u.samples++
			if !ready {
				u.noneReady++
			}
			u.mu.Unlock()
		}
	})
}

// migrate runs billing migrate of binary and returns its log.
func (r *run) migrate(binary, what string) (string, error) {
	path := filepath.Join(r.dir, what+".log")
	p, err := startBinaryIn(binary, nil, what, path, map[string]string{"DATABASE_URL": r.dsn}, nil, "migrate")
	if err != nil {
		return "", err
	}
	<-p.done
	out, _ := os.ReadFile(path)
	if p.exitErr != nil {
		return string(out), fmt.Errorf("%s: %w\n%s", what, p.exitErr, out)
	}
	return string(out), nil
}

// replace starts a replica of binary (the release) in a new slot, waits
// until it is ready, then stops old with SIGTERM: a Deployment's rolling
// update with one replica of surge.
func (r *run) replace(old *consumer, binary, release string) *consumer {
	r.mu.Lock()
	r.binary = binary
	r.mu.Unlock()
	c := r.startConsumer()
	if c == nil {
		return nil
	}
	if err := c.waitReady(time.Minute); err != nil {
		r.t.Errorf("rolling-upgrade: %v", err)
		return c
	}
	r.fault("replace", "%s (%s release) ready; stopping %s", c.name, release, old.name)
	r.stop(old, "")
	r.faultOver()
	return c
}

// The rolling upgrade, its rollback and its contract, under the stream.
func injectRollingUpgrade(r *run) {
	u := &upgrade{stop: make(chan struct{})}
	r.upgrading = u
	u.watch(r)
	next, err := releases.next()
	if err != nil {
		r.t.Errorf("rolling-upgrade: %v", err)
		return
	}
	previous := r.binary
	// A thousand attempts or so recorded by the previous release: the
	// backfill takes more than one batch.
	r.sleepUntil(8 * time.Second)

	// The migrate Job of the next release: its expand migration, not its
	// contract one, while the previous release runs.
	out, err := r.migrate(next, "migrate-expand")
	if err != nil {
		r.t.Errorf("rolling-upgrade: %v", err)
		return
	}
	r.fault("migrate", "the next release's billing migrate, two replicas of the previous release running")
	refusal, ok := logField(out, "contract migration not applied", "reason")
	if !ok {
		r.t.Errorf("rolling-upgrade: billing migrate did not refuse the contract while the previous release ran:\n%s", out)
	}
	expand, _ := logField(out, "migration applied", "duration", "version", "10001")
	u.mu.Lock()
	u.refused, u.expandTook = refusal, expand
	u.mu.Unlock()
	if status, err := r.migrate(next, "migrate-status"); err == nil {
		_ = status // kept in migrate-status.log for the reader
	}

	running := r.running()
	if len(running) != 2 {
		r.t.Errorf("rolling-upgrade: %d replicas running, want 2", len(running))
		return
	}
	// One replica to the next release, then back (a rollback after the
	// expand: the previous release runs on the expanded schema), then
	// both forward.
	c := running[0]
	for _, step := range []struct{ binary, release string }{{next, "next"}, {previous, "previous"}, {next, "next"}} {
		if c = r.replace(c, step.binary, step.release); c == nil {
			return
		}
	}
	if r.replace(running[1], next, "next") == nil {
		return
	}

	// The contract, once no replica of the previous release is alive.
	out, err = r.migrate(next, "migrate-contract")
	if err != nil {
		r.t.Errorf("rolling-upgrade: %v", err)
		return
	}
	u.mu.Lock()
	u.applied = strings.Contains(out, `"version":10002`) && strings.Contains(out, `"version":10004`)
	u.mu.Unlock()
	r.fault("migrate", "the next release's billing migrate again, only the next release running")
}

// checkRollingUpgrade checks what the upgrade must not cost.
func checkRollingUpgrade(r *run) {
	t := r.t
	u := r.upgrading
	if u == nil {
		t.Error("rolling-upgrade: nothing was upgraded")
		return
	}
	close(u.stop)
	u.done.Wait()
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.noneReady > 0 {
		t.Errorf("no replica was ready at %d of %d samples (every 200 ms)", u.noneReady, u.samples)
	}
	if u.lockWait > lockBound {
		t.Errorf("a pipeline statement waited %s for a lock (bound %s): %s", u.lockWait.Round(time.Millisecond), lockBound, u.lockQuery)
	}
	if !u.applied {
		t.Error("the contract migration was not applied once the previous release was gone")
	}
	db, err := postgres.Open(r.dsn, 1)
	if err != nil {
		t.Error(err)
		return
	}
	defer db.Close()
	var runsFrom, unnamed, byNext int
	if err := db.Get(&runsFrom, `SELECT runs_from FROM schema_compatibility`); err != nil || runsFrom != 10001 {
		t.Errorf("the schema runs releases from %d (%v), want 10001 after the contract", runsFrom, err)
	}
	if err := db.Get(&unnamed, `SELECT count(*) FROM charge WHERE recorded_by IS NULL`); err != nil || unnamed != 0 {
		t.Errorf("%d charge attempts name no release (%v) after the contract", unnamed, err)
	}
	_ = db.Get(&byNext, `SELECT count(*) FROM charge WHERE recorded_by = 'the next release'`)
	if byNext == 0 {
		t.Error("the next release recorded no charge attempt")
	}
	r.figure("a ready replica at %d of %d samples; longest lock wait of a pipeline statement %s in %d looks at pg_stat_activity (bound %s); the expand migration (backfill, concurrent index) took %s under load",
		u.samples-u.noneReady, u.samples, u.lockWait.Round(time.Millisecond), u.lockSamples, lockBound, u.expandTook)
	r.figure("contract refused while the previous release ran (%s); applied once it was gone; %d attempts recorded by the next release", u.refused, byNext)
}
