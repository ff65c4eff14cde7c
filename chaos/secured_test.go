//go:build chaos

package chaos_test

// secured-cluster: the pipeline as a production cluster runs it. serve
// reaches Kafka on the SASL_SSL listener (SCRAM-SHA-512, the suite's CA) as
// a user with exactly the ACLs of kafkaacl.Serve, and PostgreSQL over
// sslmode=verify-full as a login role with billing_runtime only, after
// `billing migrate` ran as the database's owner; meanwhile the leader of
// the busiest partition is killed with SIGKILL. Besides the usual books
// (no double charge, nothing lost), no secret of the run (the SCRAM
// password, both database passwords, the servers' private keys) may appear
// in any log, /metrics or /readyz answer, or error of it.
//
// The suite's one Kafka cluster serves it, with a SASL_SSL listener beside
// the plaintext one and its authorizer on (see startApache); the suite's
// PostgreSQL cluster gets TLS and the run's roles when the scenario starts
// (ALTER SYSTEM and pg_hba.conf, reloaded), which leaves the other
// scenarios' trust connections as they were.

import (
	"encoding/pem"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/lib/pq"

	"example.com/billing/internal/config"
	"example.com/billing/internal/kafkaacl"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/testenv/apachekafka"
	"example.com/billing/internal/testenv/kafkatest"
)

// The run's PostgreSQL login roles.
const (
	securedOwner = "chaos_billing_owner"
	securedApp   = "chaos_billing_app"
)

// securedRun is what secure set up for a run.
type securedRun struct {
	ownerURL string            // billing migrate's DATABASE_URL
	serveEnv map[string]string // serve's Kafka and database settings
	secrets  map[string]string // what must appear nowhere → what it is

	stop    chan struct{}
	stopped sync.WaitGroup
	mu      sync.Mutex
	leaks   []string // where a secret was seen
}

// secure makes the run's Kafka user and ACLs, its database's roles and
// TLS, and starts watching serve's HTTP answers for secrets.
func (r *run) secure() (*securedRun, error) {
	s := &securedRun{secrets: map[string]string{}, stop: make(chan struct{})}

	// --- Kafka: a SCRAM user with serve's ACLs and nothing else, granted
	// by the suite as the plaintext listener's super user.
	user, password := "billing-"+r.sc.name, "scram-"+randomHex(16)
	s.secrets[password] = "the SCRAM password"
	if err := suite.kafka.SetSCRAM(user, password); err != nil {
		return nil, err
	}
	k := config.Kafka{Topic: r.topic, GroupID: r.group, DLQTopic: r.dlqTopic, OutcomeTopic: r.outcomeTopic}
	admin, err := sarama.NewClusterAdminFromClient(r.client) // not closed: that would close the client
	if err != nil {
		return nil, err
	}
	if err := kafkatest.Grant(admin, "User:"+user, kafkaacl.Serve(k)...); err != nil {
		return nil, err
	}
	r.t.Logf("Kafka: user %s (SCRAM-SHA-512) with %d ACLs, on the SASL_SSL listeners", user, len(kafkaacl.Serve(k)))

	// --- PostgreSQL: TLS with a certificate of the suite's CA, an owner of
	// the run's database and a runtime login, both with passwords and
	// admitted only over TLS.
	if err := enablePostgresTLS(); err != nil {
		return nil, err
	}
	ownerPW, appPW := "owner-"+randomHex(16), "app-"+randomHex(16)
	s.secrets[ownerPW], s.secrets[appPW] = "the owner's database password", "the runtime role's database password"
	db, err := postgres.Open(suite.pg.URL(r.dbName), 1)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	for _, q := range []string{
		`CREATE ROLE ` + securedOwner + ` LOGIN PASSWORD ` + pq.QuoteLiteral(ownerPW),
		`ALTER DATABASE ` + r.dbName + ` OWNER TO ` + securedOwner,
		// A DBA's once-per-cluster step (docs/deployment.md); an earlier
		// scenario's migrate, as the superuser, may have made it.
		`DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'billing_runtime') THEN CREATE ROLE billing_runtime NOLOGIN; END IF; END $$`,
		`CREATE ROLE ` + securedApp + ` LOGIN PASSWORD ` + pq.QuoteLiteral(appPW) + ` IN ROLE billing_runtime`,
	} {
		if _, err := db.Exec(q); err != nil {
			return nil, fmt.Errorf("%s: %w", strings.SplitN(q, " PASSWORD", 2)[0], err)
		}
	}
	dbURL := func(role, password string) string {
		u := url.URL{Scheme: "postgres", User: url.UserPassword(role, password), Host: fmt.Sprintf("127.0.0.1:%d", suite.pg.port), Path: "/" + r.dbName,
			RawQuery: url.Values{"sslmode": {"verify-full"}, "sslrootcert": {suite.pki.CAFile}}.Encode()}
		return u.String()
	}
	s.ownerURL = dbURL(securedOwner, ownerPW)
	s.serveEnv = map[string]string{
		"KAFKA_BROKERS":        strings.Join(suite.kafka.AddrsOf(apachekafka.SASLOverTLS), ","),
		"KAFKA_TLS_ENABLED":    "true",
		"KAFKA_TLS_CA_FILE":    suite.pki.CAFile,
		"KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
		"KAFKA_SASL_USERNAME":  user,
		"KAFKA_SASL_PASSWORD":  password,
		"DATABASE_URL":         dbURL(securedApp, appPW),
	}

	// --- The servers' private keys: a line of each key's PEM body.
	for _, key := range []string{suite.pki.ServerKeyFile, postgresKeyFile()} {
		b, err := os.ReadFile(key)
		if err != nil {
			return nil, err
		}
		block, _ := pem.Decode(b)
		if block == nil {
			return nil, fmt.Errorf("%s holds no PEM", key)
		}
		body := strings.Split(string(pem.EncodeToMemory(block)), "\n")[1]
		s.secrets[body] = "a private key (" + filepath.Base(key) + ")"
	}

	s.stopped.Go(func() { s.watchHTTP(r) })
	r.t.Cleanup(s.stopWatching)
	return s, nil
}

// watchHTTP reads /metrics and /readyz of every running serve every 2s
// until stopped, and records where a secret shows.
func (s *securedRun) watchHTTP(r *run) {
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
		}
		for _, c := range r.running() {
			for _, path := range []string{"/metrics", "/readyz"} {
				if _, body, err := httpDo("GET", "http://"+c.addr+path, nil); err == nil {
					s.scan(c.name+" "+path, string(body))
				}
			}
		}
	}
}

func (s *securedRun) stopWatching() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	s.stopped.Wait()
}

// scan records each secret found in text, seen at where.
func (s *securedRun) scan(where, text string) {
	for secret, what := range s.secrets {
		if i := strings.Index(text, secret); i >= 0 {
			line := text[strings.LastIndexByte(text[:i], '\n')+1:]
			if j := strings.IndexByte(line, '\n'); j >= 0 {
				line = line[:j]
			}
			s.mu.Lock()
			s.leaks = append(s.leaks, fmt.Sprintf("%s in %s: %q", what, where, strings.ReplaceAll(line, secret, "<"+what+">")))
			s.mu.Unlock()
		}
	}
}

// checkNoSecrets fails the run when a secret appeared in a /metrics or
// /readyz answer, or appears in any log of the run: every process's (serve,
// migrate, fakepsp; their errors are logged there), the Kafka nodes' and
// PostgreSQL's.
func (r *run) checkNoSecrets() {
	s := r.secured
	s.stopWatching()
	logs := []string{suite.pg.logPath}
	for _, n := range suite.kafka.Nodes() {
		logs = append(logs, filepath.Join(n.Dir(), "server.log"), filepath.Join(n.Dir(), "stdout.log"))
	}
	err := filepath.WalkDir(r.dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			logs = append(logs, p)
		}
		return err
	})
	if err != nil {
		r.t.Errorf("list the run's logs: %v", err)
	}
	lines, masked := 0, 0
	for _, p := range logs {
		b, err := os.ReadFile(p)
		if err != nil {
			r.t.Errorf("read %s: %v", p, err)
			continue
		}
		lines += strings.Count(string(b), "\n")
		// Every serve logs its configuration at start, secrets masked:
		// the scan reads what serve wrote, and the secrets were there to
		// leak.
		masked += strings.Count(string(b), `"sasl_password":"xxxxx"`)
		s.scan(p, string(b))
	}
	r.mu.Lock()
	started := len(r.all)
	r.mu.Unlock()
	if masked < started {
		r.t.Errorf("%d serve processes started, %d start-up configurations with the SASL password masked found in the logs", started, masked)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.leaks {
		r.t.Errorf("secret exposed: %s", l)
	}
	r.t.Logf("secrets: %d secrets, none in %d log files (%d lines) or the /metrics and /readyz answers", len(s.secrets), len(logs), lines)
}

// injectSecuredLeaderKill checks that serve runs as the least-privilege
// users over TLS, then kills the busiest partition's leader (leader-kill-9).
func injectSecuredLeaderKill(r *run) {
	db, err := postgres.Open(r.dsn, 1)
	if err != nil {
		r.t.Errorf("open database: %v", err)
		return
	}
	var tls, plain int
	err = db.QueryRow(`SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl)
		FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) WHERE a.datname = $1 AND a.usename = $2`, r.dbName, securedApp).Scan(&tls, &plain)
	db.Close()
	switch {
	case err != nil:
		r.t.Errorf("serve's database sessions: %v", err)
	case tls == 0 || plain != 0:
		r.t.Errorf("serve holds %d TLS and %d plain sessions as %s, want only TLS ones", tls, plain, securedApp)
	default:
		r.t.Logf("[+%s] serve holds %d database sessions as %s, all over TLS", r.elapsed(), tls, securedApp)
	}
	injectLeaderKill(r)
}

// enablePostgresTLS turns TLS on in the suite's PostgreSQL cluster, with a
// certificate of the suite's CA for 127.0.0.1, and admits the secured
// roles only over TLS with their passwords. The settings take a reload,
// not a restart, and stay for the later scenarios (whose trust connections
// without TLS they leave alone).
func enablePostgresTLS() error {
	cert, key, err := suite.pki.Issue("postgres", "127.0.0.1")
	if err != nil {
		return err
	}
	dir := filepath.Join(suite.pg.dir, "tls")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for src, name := range map[string]string{cert: "server.crt", key: "server.key"} {
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		// PostgreSQL reads a key only when it is its own and private.
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return err
		}
	}
	if suite.pg.cred != nil {
		for _, p := range []string{dir, filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")} {
			if err := os.Chown(p, int(suite.pg.cred.Uid), int(suite.pg.cred.Gid)); err != nil {
				return err
			}
		}
	}
	hbaPath := filepath.Join(suite.pg.data, "pg_hba.conf")
	hba, err := os.ReadFile(hbaPath)
	if err != nil {
		return err
	}
	roles := securedOwner + "," + securedApp
	first := fmt.Sprintf("hostssl all %s 127.0.0.1/32 scram-sha-256\nhost    all %s 127.0.0.1/32 reject\n", roles, roles)
	if err := os.WriteFile(hbaPath, append([]byte(first), hba...), 0o600); err != nil {
		return err
	}
	db, err := postgres.Open(suite.pg.URL("postgres"), 1)
	if err != nil {
		return err
	}
	defer db.Close()
	for _, q := range []string{
		`ALTER SYSTEM SET ssl_cert_file = ` + pq.QuoteLiteral(filepath.Join(dir, "server.crt")),
		`ALTER SYSTEM SET ssl_key_file = ` + pq.QuoteLiteral(filepath.Join(dir, "server.key")),
		`ALTER SYSTEM SET ssl = on`,
		`SELECT pg_reload_conf()`,
	} {
		if _, err := db.Exec(q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	// The postmaster applies a reload a moment later; new sessions see it.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var ssl string
		if err := db.Get(&ssl, `SHOW ssl`); err == nil && ssl == "on" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("PostgreSQL did not turn TLS on after a reload; see %s", suite.pg.logPath)
		}
		db.SetMaxIdleConns(0) // a new session each time
	}
}

// postgresKeyFile is the key enablePostgresTLS issued for the cluster.
func postgresKeyFile() string { return filepath.Join(suite.pg.dir, "tls", "server.key") }
