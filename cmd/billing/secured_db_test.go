package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/dev/pgserver"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/testenv/kafkatest"
	"example.com/billing/internal/testenv/tlspostgres"
	"example.com/billing/internal/testenv/wait"
)

// securedDB is a database on a cluster of its own with TLS on (a
// certificate for 127.0.0.1 and db.billing.test, from the test's CA),
// owned by billing_owner, and billing_app, a login role with
// billing_runtime, both with passwords and admitted only over TLS. admin is
// the superuser's pool on it.
type securedDB struct {
	pg               *pgserver.Cluster
	caFile           string
	admin            *sqlx.DB
	ownerPW, appPW   string
	ownerURL, appURL string // verify-full, to 127.0.0.1
	wrongHost, noTLS string // billing_app's URL to localhost (not in the certificate), and without TLS
	secrets          []string
}

func newSecuredDB(t *testing.T) *securedDB {
	t.Helper()
	pki := newPKI(t)
	cert, key, err := pki.Issue("postgres", "127.0.0.1", "db.billing.test")
	if err != nil {
		t.Fatal(err)
	}
	pg, err := tlspostgres.Start(t.Context(), tlspostgres.Options{CertFile: cert, KeyFile: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Close() })
	d := &securedDB{pg: pg, caFile: pki.CAFile, ownerPW: "owner-pw-" + randomSuffix(), appPW: "app-pw-" + randomSuffix()}
	d.secrets = []string{d.ownerPW, d.appPW}
	root, err := postgres.Open(pg.URL("postgres"), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	// What a DBA does once (docs/deployment.md): the owner, its database,
	// the login role serve uses. billing_runtime comes later, below.
	for _, q := range []string{
		`CREATE ROLE billing_owner LOGIN PASSWORD ` + pq.QuoteLiteral(d.ownerPW),
		`CREATE DATABASE billing OWNER billing_owner`,
		`CREATE ROLE billing_app LOGIN PASSWORD ` + pq.QuoteLiteral(d.appPW),
	} {
		if _, err := root.Exec(q); err != nil {
			t.Fatalf("%s: %v", strings.SplitN(q, " PASSWORD", 2)[0], err)
		}
	}
	d.admin, err = postgres.Open(pg.URL("billing"), 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.admin.Close() })
	d.ownerURL = d.url("billing_owner", d.ownerPW, "127.0.0.1", "verify-full")
	d.appURL = d.url("billing_app", d.appPW, "127.0.0.1", "verify-full")
	d.wrongHost = d.url("billing_app", d.appPW, "localhost", "verify-full")
	d.noTLS = d.url("billing_app", d.appPW, "127.0.0.1", "disable")
	return d
}

func (d *securedDB) url(user, password, host, sslmode string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(user, password), Host: fmt.Sprintf("%s:%d", host, d.pg.Port), Path: "/billing",
		RawQuery: url.Values{"sslmode": {sslmode}, "sslrootcert": {d.caFile}}.Encode()}
	return u.String()
}

// oneShot runs a one-shot billing command with DATABASE_URL and returns its
// error and everything it wrote.
func oneShot(t *testing.T, dsn string, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	err := run(ctx, append([]string{"billing"}, args...), map[string]string{"DATABASE_URL": dsn}, nil, &out, &out)
	return out.String(), err
}

// billing's database, the way production runs it: `billing migrate` as the
// owner, `billing serve` as a login role with billing_runtime only, both
// with sslmode=verify-full against a private CA. The runtime role charges,
// parks and publishes, creates the partitions it lacks (through the
// owner's ensure_day_partition) and drops none; it cannot DROP or TRUNCATE
// billing's tables; billing refuses a certificate for another host, saying
// so, and the server refuses billing_app without TLS. No password reaches a
// log, /readyz, /metrics or an error.
func TestSecuredDatabase_OwnerMigratesRuntimeRoleServesOverVerifiedTLS(t *testing.T) {
	d := newSecuredDB(t)
	var said []string // every log and error of the test's billing commands

	// migrate, as the owner, before the DBA made billing_runtime: refused,
	// saying what to run.
	out, err := oneShot(t, d.ownerURL, "migrate")
	said = append(said, out, fmt.Sprint(err))
	if err == nil || !strings.Contains(err.Error(), "CREATE ROLE billing_runtime NOLOGIN") {
		t.Fatalf("migrate without billing_runtime = %v, want an error saying to create it", err)
	}
	for _, q := range []string{`CREATE ROLE billing_runtime NOLOGIN`, `GRANT billing_runtime TO billing_app`} {
		if _, err := d.admin.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	// A certificate for another host than the one dialled is refused, and
	// the error says so.
	out, err = oneShot(t, d.url("billing_owner", d.ownerPW, "localhost", "verify-full"), "migrate")
	said = append(said, out, fmt.Sprint(err))
	if err == nil || !strings.Contains(err.Error(), "certificate is valid for db.billing.test, not localhost") {
		t.Fatalf("migrate to localhost with a certificate for 127.0.0.1 and db.billing.test = %v, want the host named", err)
	}
	out, err = oneShot(t, d.ownerURL, "migrate")
	said = append(said, out, fmt.Sprint(err))
	if err != nil {
		t.Fatalf("migrate as the owner over verify-full: %v\n%s", err, out)
	}
	// Without TLS the server does not let billing_app in.
	out, err = oneShot(t, d.noTLS, "migrate")
	said = append(said, out, fmt.Sprint(err))
	if err == nil || !strings.Contains(err.Error(), "no encryption") {
		t.Errorf("billing_app without TLS = %v, want the server's refusal (no pg_hba.conf entry ... no encryption)", err)
	}

	// The partitions three days ahead gone (as if maintenance had not
	// run): serve, as billing_runtime, creates them; they belong to the
	// owner.
	ahead := time.Now().UTC().AddDate(0, 0, 3).Format("20060102")
	for _, tbl := range []string{"processed_event", "outbox"} {
		for _, q := range []string{`ALTER TABLE ` + tbl + ` DETACH PARTITION ` + tbl + `_p` + ahead, `DROP TABLE ` + tbl + `_p` + ahead} {
			if _, err := d.admin.Exec(q); err != nil {
				t.Fatal(err)
			}
		}
	}

	broker := kafkatest.Start(t, 1)
	h := &harness{t: t, broker: broker, client: kafkatest.Client(t, broker.Addr()), db: d.admin, dsn: d.appURL,
		psp: fakepsp.New(fakepsp.Options{Seed: 1})}
	srv := httptest.NewServer(h.psp)
	t.Cleanup(srv.Close)
	h.pspURL = srv.URL
	s := h.serve(h.environ())
	ev, value := event(t, 41, 2500, "EUR")
	h.publish(0, "41", value)
	h.publish(0, "bad", []byte("{oops"))
	h.waitCaughtUp()
	if got := h.count(`SELECT count(*) FROM charge WHERE event_id = $1 AND status = 'succeeded'`, ev.ID); got != 1 {
		t.Errorf("charged %d times, want 1", got)
	}
	wait.For(t, 20*time.Second, "the outcome event published", func() bool { return h.published() == 1 })
	for _, tbl := range []string{"processed_event", "outbox"} {
		var owner string
		if err := d.admin.Get(&owner, `SELECT pg_get_userbyid(relowner) FROM pg_class WHERE relname = $1`, tbl+"_p"+ahead); err != nil || owner != "billing_owner" {
			t.Errorf("%s_p%s: owner %q (%v), want it created by serve and owned by billing_owner", tbl, ahead, owner, err)
		}
	}
	var user string
	if err := d.admin.Get(&user, `SELECT usename FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
		WHERE a.datname = 'billing' AND s.ssl AND a.usename = 'billing_app' LIMIT 1`); err != nil {
		t.Errorf("serve holds no TLS connection as billing_app: %v", err)
	}
	s.waitLog(t, `"drops":"left to billing maintain, run as the owner`)
	for _, path := range []string{"/readyz", "/metrics"} {
		_, body := get(s.addr, path)
		said = append(said, body)
	}
	s.stop(t)
	said = append(said, s.logs.String())

	// maintain as the runtime role creates and reports, then fails: it
	// cannot drop, and must not look as if it did; as the owner it works.
	out, err = oneShot(t, d.appURL, "maintain")
	said = append(said, out, fmt.Sprint(err))
	if err == nil || !strings.Contains(err.Error(), "does not own") {
		t.Errorf("maintain as billing_app = %v, want an error saying it does not own the tables", err)
	}
	out, err = oneShot(t, d.ownerURL, "maintain")
	said = append(said, out, fmt.Sprint(err))
	if err != nil {
		t.Errorf("maintain as the owner: %v\n%s", err, out)
	}

	// The runtime role, over its own TLS connection, cannot destroy.
	app, err := postgres.Open(d.appURL, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	for _, q := range []string{`DROP TABLE charge`, `TRUNCATE charge`, `DROP TABLE processed_event`, `TRUNCATE processed_event, outbox`} {
		_, err := app.Exec(q)
		var pqErr *pq.Error
		if !errors.As(err, &pqErr) || pqErr.Code != "42501" {
			t.Errorf("billing_app: %s = %v, want insufficient_privilege", q, err)
		}
	}

	// serve to the wrong host: never ready, the certificate named.
	env := h.environ("DATABASE_URL", d.wrongHost)
	b := startServe(t, env)
	b.waitLog(t, "certificate is valid for db.billing.test, not localhost")
	if code, body := get(env["HTTP_ADDR"], "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "database") {
		t.Errorf("/readyz = %d %s, want 503 naming the database", code, body)
	}
	b.stop(t)
	said = append(said, b.logs.String())

	for _, text := range said {
		for _, secret := range d.secrets {
			if strings.Contains(text, secret) {
				t.Errorf("a password reached a log, a response or an error: %q", firstLineWith(text, secret))
			}
		}
	}
}

// firstLineWith is the line of text holding s, for a failure message that
// shows where without dumping everything.
func firstLineWith(text, s string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

func randomSuffix() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
