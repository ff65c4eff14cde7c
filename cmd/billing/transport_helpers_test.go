package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/config"
	"example.com/billing/internal/dbtest"
	"example.com/billing/internal/devkafka"
	"example.com/billing/internal/fakepsp"
	"example.com/billing/internal/kafka"
	"example.com/billing/internal/kafkatest"
)

// testPKI is a throwaway certificate authority with a broker (server)
// certificate for 127.0.0.1/localhost and a client certificate, generated in
// the test and written as PEM files to a temporary directory, the way an
// operator mounts them into the pod.
type testPKI struct {
	caFile   string // PEM of the CA certificate: KAFKA_TLS_CA_FILE
	certFile string // PEM of the client certificate: KAFKA_TLS_CERT_FILE
	keyFile  string // PEM of the client key: KAFKA_TLS_KEY_FILE
	pool     *x509.CertPool
	server   tls.Certificate
}

func newPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey := newKey(t)
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: "billing test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	p := &testPKI{
		caFile:   filepath.Join(dir, "ca.crt"),
		certFile: filepath.Join(dir, "client.crt"),
		keyFile:  filepath.Join(dir, "client.key"),
		pool:     x509.NewCertPool(),
	}
	p.pool.AddCert(ca)
	writePEM(t, p.caFile, "CERTIFICATE", caDER)

	// The broker's certificate: sarama verifies the name it dialled, an IP
	// address for the embedded broker.
	serverKey := newKey(t)
	serverDER := sign(t, ca, caKey, &serverKey.PublicKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kafka"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	p.server = tls.Certificate{Certificate: [][]byte{serverDER}, PrivateKey: serverKey}

	clientKey := newKey(t)
	clientDER := sign(t, ca, caKey, &clientKey.PublicKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "billing"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	writePEM(t, p.certFile, "CERTIFICATE", clientDER)
	keyDER, err := x509.MarshalPKCS8PrivateKey(clientKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, p.keyFile, "PRIVATE KEY", keyDER)
	return p
}

// serverTLS is the broker's TLS configuration; with mutual, a client must
// present a certificate signed by the CA.
func (p *testPKI) serverTLS(mutual bool) *tls.Config {
	cfg := &tls.Config{Certificates: []tls.Certificate{p.server}, MinVersion: tls.VersionTLS12}
	if mutual {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = p.pool
	}
	return cfg
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func serial(t *testing.T) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func sign(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, pub *ecdsa.PublicKey, tmpl *x509.Certificate) []byte {
	t.Helper()
	tmpl.SerialNumber = serial(t)
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, pub, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// newSecureHarness is newHarness for a broker that speaks TLS and/or
// requires SASL. kafkaEnv holds the KAFKA_TLS_* and KAFKA_SASL_* variables
// serve gets; the test's own client is built from the very same variables
// through billing's config and kafka packages, so it authenticates exactly
// as serve does.
func newSecureHarness(t *testing.T, opts devkafka.Options, kafkaEnv map[string]string) *harness {
	t.Helper()
	opts.Topics = []string{kafkatest.Topic, kafkatest.DLQTopic}
	if opts.Partitions == 0 {
		opts.Partitions = 1
	}
	b, err := devkafka.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	h := &harness{t: t, broker: b}
	h.client = secureClient(t, b.Addr(), kafkaEnv)
	h.db, h.dsn = dbtest.New(t)
	h.psp = fakepsp.New(fakepsp.Options{Seed: 1})
	srv := httptest.NewServer(h.psp)
	t.Cleanup(srv.Close)
	h.pspURL = srv.URL
	return h
}

// secureClient returns a sarama client of addr configured from kafkaEnv by
// billing's own code, with the producer settings kafkatest uses.
func secureClient(t *testing.T, addr string, kafkaEnv map[string]string) sarama.Client {
	t.Helper()
	env := map[string]string{"KAFKA_BROKERS": addr, "KAFKA_CLIENT_ID": "transport-test"}
	for k, v := range kafkaEnv {
		env[k] = v
	}
	var k config.Kafka
	if err := config.Load(env, &k); err != nil {
		t.Fatal(err)
	}
	cfg, err := kafka.NewConfig(k)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Idempotent = true
	cfg.Net.MaxOpenRequests = 1
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	c, err := sarama.NewClient(k.Brokers, cfg)
	if err != nil {
		t.Fatalf("test client with %v: %v", redactedKeys(kafkaEnv), err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// redactedKeys lists the variable names of env, for messages that must not
// print a password.
func redactedKeys(env map[string]string) []string {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	return keys
}

// environWith is h.environ with every variable of extra applied, then the
// overrides (name, value, name, value...).
func (h *harness) environWith(extra map[string]string, overrides ...string) map[string]string {
	env := h.environ()
	for k, v := range extra {
		env[k] = v
	}
	for i := 0; i+1 < len(overrides); i += 2 {
		env[overrides[i]] = overrides[i+1]
	}
	return env
}

// staysUnready requires /readyz to answer 503 naming the consumer group
// session for the whole of d, while /healthz answers 200.
func staysUnready(t *testing.T, addr string, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		code, body := get(addr, "/readyz")
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "consumer group session") {
			t.Fatalf("/readyz = %d %s, want 503 naming the consumer group session", code, body)
		}
		if code, _ := get(addr, "/healthz"); code != http.StatusOK {
			t.Fatalf("/healthz = %d while waiting for the broker, want 200", code)
		}
	}
}
