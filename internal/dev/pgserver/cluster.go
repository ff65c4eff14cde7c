package pgserver

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lib/pq"

	"example.com/billing/internal/dev/freeport"
)

// ClusterOptions change what StartCluster sets up.
type ClusterOptions struct {
	// Files are written into the data directory after initdb, readable by
	// the server's user only: a server.crt and server.key, a pg_hba.conf
	// that replaces initdb's (trust for local connections).
	Files map[string][]byte
	// Settings are server settings (postgres -c name=value) beyond the
	// defaults of a throwaway cluster.
	Settings map[string]string
}

// Cluster is a PostgreSQL cluster this process started on 127.0.0.1.
type Cluster struct {
	// Port is its port on 127.0.0.1.
	Port int
	// Binaries are the programs it runs.
	Binaries Binaries
	// Started is how long initdb and the start took.
	Started time.Duration

	dir  string
	cred *syscall.Credential
	cmd  *exec.Cmd
	done chan struct{}
}

// tempPrefix begins the name of a cluster's directory under the system's
// temporary one, followed by the pid of the process that owns it.
const tempPrefix = "billing-pg-"

// StartCluster initdb's a cluster from bin in a new directory under the
// system's temporary one and starts it; Close stops it and removes the
// directory. The superuser postgres may connect over TCP without a
// password.
func StartCluster(ctx context.Context, bin Binaries, opts ClusterOptions) (*Cluster, error) {
	began := time.Now()
	removeOrphans()
	c := &Cluster{Binaries: bin, done: make(chan struct{})}
	if os.Geteuid() == 0 {
		cred, err := unprivileged()
		if err != nil {
			return nil, err
		}
		c.cred = cred
	}
	dir, err := os.MkdirTemp("", tempPrefix+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return nil, fmt.Errorf("pgserver: %w", err)
	}
	c.dir = dir
	if err := c.prepare(ctx, opts); err != nil {
		_ = c.Close()
		return nil, err
	}
	if err := c.start(ctx, opts); err != nil {
		_ = c.Close()
		return nil, err
	}
	c.Started = time.Since(began)
	return c, nil
}

// unprivileged is the OS user PostgreSQL runs as when this process is root:
// postgres (Debian's packages create it), else nobody.
func unprivileged() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		if u, err = user.Lookup("nobody"); err != nil {
			return nil, fmt.Errorf("pgserver: running as root, which PostgreSQL refuses, and no OS user postgres or nobody to run it as: %w", err)
		}
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func (c *Cluster) prepare(ctx context.Context, opts ClusterOptions) error {
	if err := c.own(c.dir); err != nil {
		return err
	}
	// The user the server runs as cannot reach a cache in root's home
	// (mode 700): it gets a copy of its own (60 MB, a tenth of a second).
	if c.cred != nil && c.Binaries.Embedded {
		home := filepath.Join(c.dir, "postgresql")
		if err := os.CopyFS(home, os.DirFS(c.Binaries.Home)); err != nil {
			return fmt.Errorf("pgserver: copy the embedded PostgreSQL: %w", err)
		}
		c.Binaries.Dir = filepath.Join(home, "bin")
	}
	data := filepath.Join(c.dir, "data")
	initdb := c.command(ctx, "initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")
	if out, err := initdb.CombinedOutput(); err != nil {
		return fmt.Errorf("pgserver: %s: %w\n%s", initdb, err, out)
	}
	for name, b := range opts.Files {
		if err := c.write(filepath.Join(data, name), b); err != nil {
			return err
		}
	}
	return nil
}

// write writes a file only the server's user may read.
func (c *Cluster) write(path string, b []byte) error {
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	return c.own(path)
}

// own gives path to the OS user the server runs as.
func (c *Cluster) own(path string) error {
	if c.cred == nil {
		return nil
	}
	if err := os.Chown(path, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	return nil
}

// command runs a program of the binaries as the server's user.
func (c *Cluster) command(ctx context.Context, program string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.Binaries.Dir, program), args...)
	c.setup(cmd)
	return cmd
}

func (c *Cluster) setup(cmd *exec.Cmd) {
	cmd.Dir = c.dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C", "TZ=UTC"}
	cmd.SysProcAttr = sysProcAttr(c.cred)
}

// start starts the postmaster on a free port, on another one when a
// process took the port first (ports are picked before they are bound).
func (c *Cluster) start(ctx context.Context, opts ClusterOptions) error {
	var err error
	for range 3 {
		if c.Port, err = freeport.Port(); err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
		err = c.run(ctx, opts)
		if err == nil || !strings.Contains(err.Error(), "could not bind") {
			return err
		}
		c.done = make(chan struct{})
	}
	return err
}

func (c *Cluster) run(ctx context.Context, opts ClusterOptions) error {
	settings := map[string]string{
		"listen_addresses":        "127.0.0.1",
		"unix_socket_directories": "",
		// A throwaway cluster's data is not worth an fsync.
		"fsync":             "off",
		"full_page_writes":  "off",
		"max_connections":   "300", // the tests' parallel pools, as .ci/postgres sets
		"log_min_messages":  "warning",
		"logging_collector": "off",
	}
	for k, v := range opts.Settings {
		settings[k] = v
	}
	args := []string{"-D", filepath.Join(c.dir, "data"), "-p", strconv.Itoa(c.Port)}
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		args = append(args, "-c", k+"="+settings[k])
	}
	logPath := filepath.Join(c.dir, "postgres.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	defer logf.Close()
	// Not CommandContext: the server outlives ctx, which only bounds the
	// start.
	c.cmd = exec.Command(filepath.Join(c.Binaries.Dir, "postgres"), args...)
	c.setup(c.cmd)
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	started := make(chan error, 1)
	go func() {
		// Linux sends the death signal when the thread that forked the
		// child exits: keep this goroutine on its own thread for the
		// postmaster's life.
		runtime.LockOSThread()
		if err := c.cmd.Start(); err != nil {
			started <- err
			close(c.done)
			return
		}
		started <- nil
		_ = c.cmd.Wait()
		close(c.done)
	}()
	if err := <-started; err != nil {
		c.cmd = nil
		return fmt.Errorf("pgserver: start postgres: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		if c.ping(ctx) == nil {
			return nil
		}
		select {
		case <-c.done:
			c.cmd = nil
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("pgserver: postgres exited at start:\n%s", bytes.TrimSpace(log))
		case <-ctx.Done():
			return fmt.Errorf("pgserver: postgres does not accept connections; see %s: %w", logPath, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *Cluster) ping(ctx context.Context) error {
	connector, err := pq.NewConnector(c.URL("postgres"))
	if err != nil {
		return err
	}
	db := sql.OpenDB(connector)
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return db.PingContext(ctx)
}

// URL is the superuser's URL of database name: plain TCP, no password.
func (c *Cluster) URL(name string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.Port, name)
}

// Pid is the postmaster's process id.
func (c *Cluster) Pid() int { return c.cmd.Process.Pid }

// Dir is the cluster's directory (its data and its log, postgres.log).
func (c *Cluster) Dir() string { return c.dir }

// Close stops the cluster (fast shutdown: sessions are cut off) and removes
// its directory.
func (c *Cluster) Close() error {
	if c.cmd != nil {
		_ = c.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-c.done:
		case <-time.After(30 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.done
		}
		c.cmd = nil
	}
	if err := os.RemoveAll(c.dir); err != nil {
		return fmt.Errorf("pgserver: remove the cluster: %w", err)
	}
	return nil
}

// removeOrphans removes the directories of clusters whose process is gone:
// one killed (a test binary's timeout) cannot remove its own. Its
// postmaster died with it.
func removeOrphans() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), tempPrefix+"*-*"))
	for _, d := range dirs {
		pid, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(filepath.Base(d), tempPrefix), "-", 2)[0])
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
			_ = os.RemoveAll(d)
		}
	}
}
