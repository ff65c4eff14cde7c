// Package pgtest starts a throwaway PostgreSQL cluster configured the way a
// production database holding money is: TLS on (a certificate the test
// issues), and every role but the test's own superuser admitted only over
// TLS and with a password (scram-sha-256). The shared local server the
// other tests use (127.0.0.1:5432, trust, no TLS to speak of) cannot show
// that billing verifies the server or logs in as a role with a password.
//
// The cluster is initdb'd in a directory of its own and its postmaster runs
// as a child of the test process that the kernel kills when the process
// dies. PostgreSQL refuses to run as root: as root, its programs run as the
// OS user postgres. They come from /usr/lib/postgresql/15/bin, or PG_BIN.
//
// Recreate and Drop make and remove a throwaway database on any server,
// this package's or the shared local one: the demo's, a test's, a
// benchmark's.
package pgtest

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

	"example.com/billing/internal/freeport"
	"example.com/billing/internal/postgres"
)

// Options configure a Cluster.
type Options struct {
	// CertFile and KeyFile are the server's certificate and key (PEM).
	CertFile, KeyFile string
}

// Cluster is a running PostgreSQL cluster on 127.0.0.1.
type Cluster struct {
	Port int

	dir  string
	cred *syscall.Credential
	cmd  *exec.Cmd
	done chan struct{}
}

// Start initdb's a cluster in a new directory under the system's temporary
// one and starts it; Close stops it and removes the directory.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	c := &Cluster{done: make(chan struct{})}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgtest: running as root, which PostgreSQL refuses, and no OS user postgres to run it as: %w", err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	dir, err := os.MkdirTemp("", "billing-pgtest-")
	if err != nil {
		return nil, err
	}
	c.dir = dir
	if err := c.prepare(ctx, opts); err != nil {
		c.Close()
		return nil, err
	}
	if err := c.start(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) prepare(ctx context.Context, opts Options) error {
	if err := c.own(c.dir); err != nil {
		return err
	}
	data := filepath.Join(c.dir, "data")
	if out, err := c.command(ctx, bin("initdb"), "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
		return fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}
	// The server reads its key only when the key is its own and private.
	for name, src := range map[string]string{"server.crt": opts.CertFile, "server.key": opts.KeyFile} {
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		if err := c.write(filepath.Join(data, name), b); err != nil {
			return err
		}
	}
	// The superuser postgres without TLS or password (the test's own admin
	// work); every other role over TLS with its password, or not at all.
	return c.write(filepath.Join(data, "pg_hba.conf"), []byte(
		"host    all postgres 127.0.0.1/32 trust\n"+
			"hostssl all all      127.0.0.1/32 scram-sha-256\n"))
}

// write writes a file only the server's user may read.
func (c *Cluster) write(path string, b []byte) error {
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return err
	}
	return c.own(path)
}

// own gives path to the OS user the server runs as.
func (c *Cluster) own(path string) error {
	if c.cred == nil {
		return nil
	}
	return os.Chown(path, int(c.cred.Uid), int(c.cred.Gid))
}

func (c *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = c.dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C", "TZ=UTC"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGKILL}
	return cmd
}

func (c *Cluster) start(ctx context.Context) error {
	port, err := freeport.Port()
	if err != nil {
		return err
	}
	c.Port = port
	logf, err := os.Create(filepath.Join(c.dir, "postgres.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	c.cmd = exec.Command(bin("postgres"), "-D", filepath.Join(c.dir, "data"),
		"-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=",
		"-c", "ssl=on",
		"-c", "password_encryption=scram-sha-256",
		// A test's database is thrown away: no durability to pay for.
		"-c", "fsync=off",
		"-c", "full_page_writes=off",
		"-c", "log_min_messages=warning")
	c.cmd.Dir = c.dir
	c.cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C", "TZ=UTC"}
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGKILL}
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
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		if err := c.ping(ctx); err == nil {
			return nil
		}
		select {
		case <-c.done:
			return fmt.Errorf("pgtest: postgres exited at start; see %s", filepath.Join(c.dir, "postgres.log"))
		case <-ctx.Done():
			return fmt.Errorf("pgtest: postgres does not accept connections; see %s: %w", filepath.Join(c.dir, "postgres.log"), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *Cluster) ping(ctx context.Context) error {
	db, err := postgres.Open(c.URL("postgres"), 1)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return db.PingContext(ctx)
}

// URL is the superuser's URL of database name: plain TCP, no password.
func (c *Cluster) URL(name string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.Port, name)
}

// Close stops the cluster (fast shutdown) and removes its directory.
func (c *Cluster) Close() {
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

func bin(name string) string {
	dir := os.Getenv("PG_BIN")
	if dir == "" {
		dir = "/usr/lib/postgresql/15/bin"
	}
	return filepath.Join(dir, name)
}
