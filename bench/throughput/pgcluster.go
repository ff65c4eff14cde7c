package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"example.com/billing/internal/dev/freeport"
	"example.com/billing/internal/postgres"
)

// pgCluster is the benchmark's own PostgreSQL cluster: initdb'd in a
// directory of its own, on a free port of 127.0.0.1, used by nobody else.
// WAL positions and the server's CPU are the whole cluster's, so on the
// shared server other engineers' tests would be counted as billing's; here
// every byte and every tick between two samples is the scenario's (and the
// few records a server writes by itself, which the breakdown shows).
//
// It is configured as a primary that keeps money: fsync, full-page writes
// and synchronous commit on, wal_level replica (a standby or an archive
// reads its WAL). What differs from a production primary, and why:
//
//   - Checkpoints come only when the benchmark asks (CHECKPOINT before each
//     measured window; checkpoint_timeout and max_wal_size too large to
//     fire within one). Every window then starts the same way, with every
//     page's first change after it logging a full-page image, instead of a
//     checkpoint landing at a random moment in some windows and not in
//     others. The full-page images are reported apart.
//   - autovacuum is off, so that a vacuum does not land in some windows
//     and not in others; what vacuuming a window's dead rows writes is
//     measured after the window instead (a VACUUM of the scenario's
//     database, at 0 ms).
//
// PostgreSQL refuses to run as root: as root, its programs run as the OS
// user postgres. The postmaster is a child of this process that the kernel
// kills when the benchmark dies.
type pgCluster struct {
	port int
	dir  string
	cred *syscall.Credential
	cmd  *exec.Cmd
	done chan struct{}
}

// pgSettings are the cluster's settings beyond initdb's defaults.
var pgSettings = []string{
	"listen_addresses=127.0.0.1",
	"unix_socket_directories=",
	"max_connections=300", // replicas × DATABASE_MAX_CONNS, pgbench's 16 clients, the benchmark's own
	"fsync=on",
	"synchronous_commit=on",
	"full_page_writes=on",
	"wal_compression=off",
	"checkpoint_timeout=1h",
	"max_wal_size=16GB",
	"autovacuum=off",
	"log_checkpoints=on",
	"log_min_messages=warning",
}

// startPGCluster initdb's a cluster in a new directory under the system's
// temporary one and starts it; close stops it and removes the directory.
func startPGCluster(ctx context.Context) (*pgCluster, error) {
	c := &pgCluster{done: make(chan struct{})}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root, which PostgreSQL refuses, and no OS user postgres to run it as: %w", err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	dir, err := os.MkdirTemp("", "billing-bench-pg-")
	if err != nil {
		return nil, err
	}
	c.dir = dir
	if c.cred != nil {
		if err := os.Chown(dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			c.close()
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	if out, err := c.command(ctx, pgBin("initdb"), "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
		c.close()
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	if err := c.start(ctx, data); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

func (c *pgCluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = c.dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C", "TZ=UTC"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGKILL}
	return cmd
}

func (c *pgCluster) start(ctx context.Context, data string) error {
	port, err := freeport.Port()
	if err != nil {
		return err
	}
	c.port = port
	logf, err := os.Create(c.logPath())
	if err != nil {
		return err
	}
	defer logf.Close()
	args := []string{"-D", data, "-p", strconv.Itoa(port)}
	for _, s := range pgSettings {
		args = append(args, "-c", s)
	}
	c.cmd = exec.Command(pgBin("postgres"), args...)
	c.cmd.Dir = c.dir
	c.cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C", "TZ=UTC"}
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGKILL}
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	started := make(chan error, 1)
	go func() {
		// Linux sends the death signal when the thread that forked the
		// child exits: this goroutine keeps its thread for the
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
		return fmt.Errorf("start postgres: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		if err := c.ping(ctx); err == nil {
			break
		}
		select {
		case <-c.done:
			return fmt.Errorf("postgres exited at start; see %s", c.logPath())
		case <-ctx.Done():
			return fmt.Errorf("postgres does not accept connections; see %s: %w", c.logPath(), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	// pg_walinspect reads the WAL back (the breakdown by record type and
	// relation); creating it takes a superuser, which the benchmark is in
	// its own cluster.
	db, err := postgres.Open(c.url("postgres"), 1)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`); err != nil {
		return fmt.Errorf("create extension pg_walinspect: %w", err)
	}
	return nil
}

func (c *pgCluster) ping(ctx context.Context) error {
	db, err := postgres.Open(c.url("postgres"), 1)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return db.PingContext(ctx)
}

// url is the superuser's URL of database name.
func (c *pgCluster) url(name string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, name)
}

func (c *pgCluster) logPath() string { return filepath.Join(c.dir, "postgres.log") }

// postmaster is the server's first process: the others are its children.
func (c *pgCluster) postmaster() int { return c.cmd.Process.Pid }

// close stops the cluster (fast shutdown) and removes its directory.
func (c *pgCluster) close() {
	if c.cmd != nil && c.cmd.Process != nil {
		_ = c.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-c.done:
		case <-time.After(30 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	}
	_ = os.RemoveAll(c.dir)
}

// pgBin is where the PostgreSQL 15 programs are; PG_BIN overrides it.
func pgBin(name string) string {
	dir := os.Getenv("PG_BIN")
	if dir == "" {
		dir = "/usr/lib/postgresql/15/bin"
	}
	return filepath.Join(dir, name)
}
