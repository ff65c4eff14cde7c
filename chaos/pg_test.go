//go:build chaos

package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"example.com/billing/internal/dev/freeport"
	"example.com/billing/internal/dev/pgserver"
	"example.com/billing/internal/postgres"
)

// pgBin is a program of the local PostgreSQL, as the tests find it (PG_BIN,
// else the newest /usr/lib/postgresql/*/bin): the suite needs programs the
// embedded binaries lack (pg_basebackup). Without them the program is
// looked up on PATH, and the first cluster's start says it is not there.
func pgBin(name string) string {
	b, err := pgserver.LocalBinaries(context.Background(), os.Getenv("PG_BIN"))
	if err != nil {
		return name
	}
	return filepath.Join(b.Dir, name)
}

// pgCluster is a throwaway PostgreSQL cluster that the suite may stop and
// start: initdb in a directory of its own, a free port on 127.0.0.1, trust
// authentication, superuser "postgres".
//
// The postmaster is a child of the test process (`postgres -D`, with
// PDEATHSIG), so that it dies with the suite even when the suite is killed
// by a timeout; scenarios stop it with `pg_ctl stop -m fast|immediate` and
// start it again the same way.
//
// PostgreSQL refuses to run as root. When the suite runs as root, every
// PostgreSQL binary runs as the OS user "postgres" (the Credential of
// SysProcAttr, which is what `runuser -u postgres --` does) and the cluster's
// directory is chowned to it.
type pgCluster struct {
	dir, data, logPath string
	opts               pgOptions
	port               int
	how                string
	cred               *syscall.Credential

	mu       sync.Mutex
	postgres *exec.Cmd
	exited   chan struct{}
}

// pgOptions are what a scenario's own cluster changes.
type pgOptions struct {
	// wal, when set, holds pg_wal outside the data directory (initdb -X),
	// e.g. off a filesystem that fills up.
	wal string
}

// startCluster creates a cluster in dir with initdb and starts it.
func startCluster(dir string) (*pgCluster, error) {
	c, err := newCluster(dir, pgOptions{})
	if err != nil {
		return nil, err
	}
	if err := c.initdb(); err != nil {
		return nil, err
	}
	if err := c.start(); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// newCluster prepares a cluster's directory and port; initdb or
// basebackup then creates its data directory, dir/data unless the caller
// sets c.data first.
func newCluster(dir string, o pgOptions) (*pgCluster, error) {
	c := &pgCluster{dir: dir, data: filepath.Join(dir, "data"), logPath: filepath.Join(dir, "postgres.log"), opts: o}
	c.how = "initdb and postgres as the current user"
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root, and PostgreSQL refuses root: need an OS user \"postgres\" to run it as: %w", err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		c.how = "running as root: initdb, postgres and pg_ctl run as OS user postgres"
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := c.own(dir); err != nil {
		return nil, err
	}
	port, err := freeport.Port()
	if err != nil {
		return nil, err
	}
	c.port = port
	return c, nil
}

// own gives path to the user PostgreSQL runs as.
func (c *pgCluster) own(path string) error {
	if c.cred == nil {
		return nil
	}
	return os.Chown(path, int(c.cred.Uid), int(c.cred.Gid))
}

// initdb creates the data directory: superuser postgres, trust
// authentication, and trust for the suite's network namespaces too (their
// replicas connect from hostNet, see netHost).
func (c *pgCluster) initdb() error {
	args := []string{"-D", c.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"}
	if c.opts.wal != "" {
		args = append(args, "-X", c.opts.wal)
	}
	if out, err := c.command(pgBin("initdb"), args...).CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w\n%s", err, out)
	}
	hba, err := os.OpenFile(filepath.Join(c.data, "pg_hba.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(hba, "host all all %s trust # the chaos suite's network namespaces\n", hostNet)
	return errors.Join(err, hba.Close())
}

// command runs a PostgreSQL binary, as user postgres when we are root.
func (c *pgCluster) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = c.dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C", "TZ=UTC"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGKILL}
	return cmd
}

// URL is the URL of database name.
func (c *pgCluster) URL(name string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, name)
}

// start starts the postmaster and waits until it accepts connections.
func (c *pgCluster) start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.postgres != nil {
		return errors.New("postgres is already running")
	}
	logf, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := []string{"-D", c.data,
		"-p", strconv.Itoa(c.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=",
		"-c", "max_connections=300",
		// fsync off: the suite never crashes the operating system, only
		// PostgreSQL, and what was written reaches the files through the
		// page cache. synchronous_commit stays on: an immediate stop must
		// not lose a committed transaction.
		"-c", "fsync=off",
		"-c", "full_page_writes=off",
		"-c", "log_min_messages=warning",
	}
	cmd := c.command(pgBin("postgres"), args...)
	// A process group of its own: kill9 kills the postmaster and all its
	// processes at once, as a crash of the machine does.
	cmd.SysProcAttr.Setpgid = true
	cmd.Stdout, cmd.Stderr = logf, logf
	exited := make(chan struct{})
	if err := startOnOwnThread(cmd, func(error) { close(exited) }); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	c.postgres, c.exited = cmd, exited

	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := c.ping(); err == nil {
			return nil
		}
		select {
		case <-exited:
			c.postgres = nil
			return fmt.Errorf("postgres exited at start; see %s", c.logPath)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres did not accept connections within 60s; see %s", c.logPath)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *pgCluster) ping() error {
	db, err := postgres.Open(c.URL("postgres"), 1)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return db.PingContext(ctx)
}

// stop runs `pg_ctl stop -m mode` and waits for the postmaster to exit.
func (c *pgCluster) stop(mode string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.postgres == nil {
		return errors.New("postgres is not running")
	}
	out, err := c.command(pgBin("pg_ctl"), "stop", "-D", c.data, "-m", mode, "-w", "-t", "60").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl stop -m %s: %w\n%s", mode, err, out)
	}
	select {
	case <-c.exited:
	case <-time.After(30 * time.Second):
		return errors.New("postmaster still running 30s after pg_ctl stop")
	}
	c.postgres = nil
	return nil
}

// kill9 kills the postmaster and every process of the server with
// SIGKILL, as a crash of its machine does: nothing is written, no
// connection is closed properly.
func (c *pgCluster) kill9() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.postgres == nil {
		return errors.New("postgres is not running")
	}
	if err := syscall.Kill(-c.postgres.Process.Pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill -9 the server's process group: %w", err)
	}
	<-c.exited
	c.postgres = nil
	return nil
}

// promote ends a standby's recovery (pg_ctl promote) and waits until it
// takes writes.
func (c *pgCluster) promote() error {
	if out, err := c.command(pgBin("pg_ctl"), "promote", "-D", c.data, "-w", "-t", "60").CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl promote: %w\n%s", err, out)
	}
	return nil
}

// ensureRunning starts the cluster if a failed scenario left it stopped.
func (c *pgCluster) ensureRunning() error {
	c.mu.Lock()
	running := c.postgres != nil
	c.mu.Unlock()
	if running {
		return nil
	}
	return c.start()
}

// close stops the cluster for good.
func (c *pgCluster) close() {
	c.mu.Lock()
	p, exited := c.postgres, c.exited
	c.postgres = nil
	c.mu.Unlock()
	if p == nil {
		return
	}
	_ = p.Process.Signal(syscall.SIGINT) // fast shutdown
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = p.Process.Kill()
		<-exited
	}
}

// createDatabase creates database name in the cluster.
func (c *pgCluster) createDatabase(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := pgserver.Recreate(ctx, c.URL("postgres"), name)
	return err
}
