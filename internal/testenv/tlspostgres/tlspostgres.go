// Package tlspostgres starts a throwaway PostgreSQL cluster configured the way a
// production database holding money is: TLS on (a certificate the test
// issues), and every role but the test's own superuser admitted only over
// TLS and with a password (scram-sha-256). The server the other tests use
// (trust, no TLS to speak of) cannot show that billing verifies the server
// or logs in as a role with a password.
//
// The cluster is a pgserver.Cluster: from the same binaries as the tests'
// server when none answers (PG_BIN, /usr/lib/postgresql/*/bin, else the
// embedded PostgreSQL), run as the OS user postgres when root.
package tlspostgres

import (
	"context"
	"fmt"
	"os"

	"example.com/billing/internal/dev/pgserver"
)

// Options configure a cluster.
type Options struct {
	// CertFile and KeyFile are the server's certificate and key (PEM).
	CertFile, KeyFile string
}

// Start starts a cluster with TLS in a new directory under the system's
// temporary one; its Close stops it and removes the directory.
func Start(ctx context.Context, opts Options) (*pgserver.Cluster, error) {
	bin, err := pgserver.FindBinaries(ctx, pgserver.TestOptions(os.Getenv))
	if err != nil {
		return nil, fmt.Errorf("tlspostgres: %w", err)
	}
	files := map[string][]byte{
		// The superuser postgres without TLS or password (the test's own
		// admin work); every other role over TLS with its password, or not
		// at all.
		"pg_hba.conf": []byte("host    all postgres 127.0.0.1/32 trust\n" +
			"hostssl all all      127.0.0.1/32 scram-sha-256\n"),
	}
	// The server reads its key only when the key is its own and private:
	// StartCluster writes them so.
	for name, src := range map[string]string{"server.crt": opts.CertFile, "server.key": opts.KeyFile} {
		b, err := os.ReadFile(src)
		if err != nil {
			return nil, fmt.Errorf("tlspostgres: %w", err)
		}
		files[name] = b
	}
	return pgserver.StartCluster(ctx, bin, pgserver.ClusterOptions{
		Files:    files,
		Settings: map[string]string{"ssl": "on", "password_encryption": "scram-sha-256"},
	})
}
