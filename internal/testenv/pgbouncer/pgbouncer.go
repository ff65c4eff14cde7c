// Package pgbouncer starts a throwaway PgBouncer (Debian's package, which
// .ci/packages installs) in front of a PostgreSQL server, on a free
// loopback port, so that tests and the chaos suite run billing as most
// Kubernetes deployments reach PostgreSQL: through a pooler, in
// transaction mode, where consecutive statements of one client may run on
// different server sessions.
//
// The binary is PGBOUNCER, else pgbouncer on PATH, else /usr/sbin/pgbouncer.
// Where there is none, Require skips the test, and fails it under CI=true,
// where nothing may be skipped for lack of tools. PgBouncer refuses to run
// as root: as root it runs as the OS user postgres (nobody where there is
// none). Its process dies with the one that started it (Linux), and Close
// stops it and removes its directory.
package pgbouncer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"example.com/billing/internal/dev/freeport"
)

// Pool modes.
const (
	Transaction = "transaction"
	Session     = "session"
)

// Options configure a pooler.
type Options struct {
	// Mode is the pool mode: Transaction (the default) or Session.
	Mode string
	// PoolSize is default_pool_size: server sessions per database and user
	// (default 10).
	PoolSize int
	// Users are the roles that may log in, without a password (auth_type
	// trust: the server behind checks nothing either); default postgres.
	Users []string
}

// Bouncer is a running PgBouncer.
type Bouncer struct {
	// Port is its port on 127.0.0.1.
	Port int
	// Mode is its pool mode.
	Mode string

	bin  string
	dir  string
	cred *syscall.Credential

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Binary returns the pgbouncer program to run, or an error saying there is
// none.
func Binary() (string, error) {
	if p := os.Getenv("PGBOUNCER"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	const debian = "/usr/sbin/pgbouncer"
	if _, err := os.Stat(debian); err == nil {
		return debian, nil
	}
	return "", errors.New("no pgbouncer: set PGBOUNCER, or install Debian's package (.ci/packages does)")
}

// Require starts a pooler in front of the server of serverURL (any
// database's URL on it) for t, stopped when t ends. Without a pgbouncer
// binary it skips t, or fails it under CI=true.
func Require(t testing.TB, serverURL string, opts Options) *Bouncer {
	t.Helper()
	if _, err := Binary(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true: %v", err)
		}
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := Start(ctx, serverURL, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	return b
}

// Start starts a pooler in front of the server of serverURL, in a new
// directory under the system's temporary one.
func Start(ctx context.Context, serverURL string, opts Options) (*Bouncer, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	if opts.Mode == "" {
		opts.Mode = Transaction
	}
	if opts.PoolSize == 0 {
		opts.PoolSize = 10
	}
	if len(opts.Users) == 0 {
		opts.Users = []string{"postgres"}
	}
	u, err := url.Parse(serverURL)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: server url: %w", err)
	}
	b := &Bouncer{Mode: opts.Mode, bin: bin}
	if os.Geteuid() == 0 {
		if b.cred, err = unprivileged(); err != nil {
			return nil, err
		}
	}
	if b.dir, err = os.MkdirTemp("", "billing-pgbouncer-"); err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	if b.Port, err = freeport.Port(); err != nil {
		_ = os.RemoveAll(b.dir)
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	if err := b.configure(u, opts); err != nil {
		_ = os.RemoveAll(b.dir)
		return nil, err
	}
	if err := b.start(ctx); err != nil {
		_ = b.Close()
		return nil, err
	}
	return b, nil
}

// configure writes pgbouncer.ini and the users' file.
func (b *Bouncer) configure(server *url.URL, opts Options) error {
	host, port := server.Hostname(), server.Port()
	if port == "" {
		port = "5432"
	}
	var users strings.Builder
	for _, name := range opts.Users {
		fmt.Fprintf(&users, "%q \"\"\n", name)
	}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
admin_users = postgres
pool_mode = %s
default_pool_size = %d
max_client_conn = 1000
`, host, port, b.Port, filepath.Join(b.dir, "users.txt"), opts.Mode, opts.PoolSize)
	for name, body := range map[string]string{"pgbouncer.ini": ini, "users.txt": users.String()} {
		path := filepath.Join(b.dir, name)
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			return fmt.Errorf("pgbouncer: %w", err)
		}
		if err := b.own(path); err != nil {
			return err
		}
	}
	return b.own(b.dir)
}

// start runs pgbouncer and waits until its admin console answers.
func (b *Bouncer) start(ctx context.Context) error {
	logf, err := os.OpenFile(b.LogPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgbouncer: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(b.bin, filepath.Join(b.dir, "pgbouncer.ini"))
	cmd.Dir = b.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr(b.cred)
	done := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		// Linux sends the death signal when the thread that forked the
		// child exits: keep this goroutine on its own thread for the
		// pooler's life.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			close(done)
			return
		}
		started <- nil
		_ = cmd.Wait()
		close(done)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("pgbouncer: start %s: %w", b.bin, err)
	}
	b.mu.Lock()
	b.cmd, b.done = cmd, done
	b.mu.Unlock()
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := b.Show(pctx, "VERSION")
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			log, _ := os.ReadFile(b.LogPath())
			return fmt.Errorf("pgbouncer: exited at start:\n%s", strings.TrimSpace(string(log)))
		case <-ctx.Done():
			return fmt.Errorf("pgbouncer: its admin console does not answer (%v); see %s: %w", err, b.LogPath(), ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// LogPath is where pgbouncer logs.
func (b *Bouncer) LogPath() string { return filepath.Join(b.dir, "pgbouncer.log") }

// URL returns dsn, a URL of a database on the server behind, through the
// pooler instead.
func (b *Bouncer) URL(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return dsn
	}
	u.Host = "127.0.0.1:" + strconv.Itoa(b.Port)
	return u.String()
}

// Pid is the pooler's process id, 0 when it is not running.
func (b *Bouncer) Pid() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd == nil {
		return 0
	}
	return b.cmd.Process.Pid
}

// Kill kills the pooler with SIGKILL, as an OOM kill or a node loss would:
// every client connection breaks, and the server sessions it held end
// once PostgreSQL notices.
func (b *Bouncer) Kill() {
	b.stop(syscall.SIGKILL)
}

// Restart starts the pooler again after Kill, on the same port.
func (b *Bouncer) Restart(ctx context.Context) error {
	return b.start(ctx)
}

// stop signals the pooler and waits for it to exit.
func (b *Bouncer) stop(sig syscall.Signal) {
	b.mu.Lock()
	cmd, done := b.cmd, b.done
	b.cmd = nil
	b.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Close stops the pooler (SIGTERM: an immediate shutdown) and removes its
// directory.
func (b *Bouncer) Close() error {
	b.stop(syscall.SIGTERM)
	if err := os.RemoveAll(b.dir); err != nil {
		return fmt.Errorf("pgbouncer: %w", err)
	}
	return nil
}

// Show runs SHOW what on the admin console and returns its rows, each a
// map of column to text.
func (b *Bouncer) Show(ctx context.Context, what string) ([]map[string]string, error) {
	connector, err := pq.NewConnector(fmt.Sprintf("postgres://postgres@127.0.0.1:%d/pgbouncer?sslmode=disable", b.Port))
	if err != nil {
		return nil, err
	}
	db := sqlx.NewDb(sql.OpenDB(connector), "postgres")
	defer db.Close()
	// The admin console speaks the simple protocol only: no parameters.
	rows, err := db.QueryxContext(ctx, "SHOW "+what)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: SHOW %s: %w", what, err)
	}
	defer rows.Close()
	var out []map[string]string
	for rows.Next() {
		m := map[string]any{}
		if err := rows.MapScan(m); err != nil {
			return nil, fmt.Errorf("pgbouncer: SHOW %s: %w", what, err)
		}
		row := map[string]string{}
		for k, v := range m {
			switch v := v.(type) {
			case []byte:
				row[k] = string(v)
			case nil:
				row[k] = ""
			default:
				row[k] = fmt.Sprint(v)
			}
		}
		out = append(out, row)
	}
	return out, rows.Err()
}

// Pool is one line of SHOW POOLS: a database and user's clients and server
// sessions.
type Pool struct {
	Database, User, Mode string
	// ClientsActive are clients linked to a server session or idle;
	// ClientsWaiting wait for one.
	ClientsActive, ClientsWaiting int
	// ServersActive are linked to a client; ServersIdle and ServersUsed
	// are free.
	ServersActive, ServersIdle, ServersUsed int
}

// Pools returns SHOW POOLS, the admin console's own pool left out.
func (b *Bouncer) Pools(ctx context.Context) ([]Pool, error) {
	rows, err := b.Show(ctx, "POOLS")
	if err != nil {
		return nil, err
	}
	var out []Pool
	for _, r := range rows {
		if r["database"] == "pgbouncer" {
			continue
		}
		n := func(k string) int { v, _ := strconv.Atoi(r[k]); return v }
		out = append(out, Pool{Database: r["database"], User: r["user"], Mode: r["pool_mode"],
			ClientsActive: n("cl_active"), ClientsWaiting: n("cl_waiting"),
			ServersActive: n("sv_active"), ServersIdle: n("sv_idle"), ServersUsed: n("sv_used")})
	}
	return out, nil
}

// own gives path to the OS user the pooler runs as.
func (b *Bouncer) own(path string) error {
	if b.cred == nil {
		return nil
	}
	if err := os.Chown(path, int(b.cred.Uid), int(b.cred.Gid)); err != nil {
		return fmt.Errorf("pgbouncer: %w", err)
	}
	return nil
}

// unprivileged is the OS user the pooler runs as when this process is
// root: postgres (Debian's packages create it), else nobody.
func unprivileged() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		if u, err = user.Lookup("nobody"); err != nil {
			return nil, fmt.Errorf("pgbouncer: running as root, which PgBouncer refuses, and no OS user postgres or nobody to run it as: %w", err)
		}
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// Route is how a test reaches its database.
type Route struct {
	Name string
	// Via returns the URL to reach dsn's database this way.
	Via func(t testing.TB, dsn string) string
}

// Routes are the ways billing reaches PostgreSQL that its mutual exclusion
// must hold on: directly (or through a pooler in session mode, which keeps
// a client on one server session), and through a pooler in transaction
// mode, with fewer server sessions than the test opens connections, so
// that consecutive statements of one client run on different ones.
func Routes() []Route {
	return []Route{
		{Name: "direct", Via: func(_ testing.TB, dsn string) string { return dsn }},
		{Name: "pgbouncer-transaction", Via: func(t testing.TB, dsn string) string {
			return Require(t, dsn, Options{Mode: Transaction, PoolSize: 4}).URL(dsn)
		}},
	}
}
