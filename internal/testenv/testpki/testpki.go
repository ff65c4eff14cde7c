// Package testpki is a throwaway certificate authority for tests: the CA,
// server certificates for the names a test dials, and a client
// certificate, written as PEM files the way an operator mounts them.
// Nothing it makes is committed: each test makes its own.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// PKI is a throwaway certificate authority with a server certificate for
// 127.0.0.1/localhost (a broker's) and a client certificate; Issue makes
// more server certificates.
type PKI struct {
	CAFile   string // the CA certificate: KAFKA_TLS_CA_FILE
	CertFile string // the client certificate: KAFKA_TLS_CERT_FILE
	KeyFile  string // the client key (PKCS #8): KAFKA_TLS_KEY_FILE

	// ServerCertFile and ServerKeyFile are the broker's certificate and
	// PKCS #8 key.
	ServerCertFile, ServerKeyFile string

	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	pool   *x509.CertPool
	server tls.Certificate
}

// New creates a PKI in dir.
func New(dir string) (*PKI, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "billing test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(7 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	p := &PKI{
		CAFile:         filepath.Join(dir, "ca.crt"),
		CertFile:       filepath.Join(dir, "client.crt"),
		KeyFile:        filepath.Join(dir, "client.key"),
		ServerCertFile: filepath.Join(dir, "server.crt"),
		ServerKeyFile:  filepath.Join(dir, "server.key"),
		dir:            dir,
		ca:             ca,
		caKey:          caKey,
		pool:           x509.NewCertPool(),
	}
	p.pool.AddCert(ca)
	if err := writePEM(p.CAFile, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	// sarama verifies the name it dialled: an IP address here.
	serverKey, serverDER, err := issue(ca, caKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kafka"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, p.ServerCertFile, p.ServerKeyFile)
	if err != nil {
		return nil, err
	}
	p.server = tls.Certificate{Certificate: [][]byte{serverDER}, PrivateKey: serverKey}
	if _, _, err := issue(ca, caKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "billing"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, p.CertFile, p.KeyFile); err != nil {
		return nil, err
	}
	return p, nil
}

// Issue signs a server certificate for hosts (DNS names or IP addresses)
// and writes it and its PKCS #8 key as <name>.crt and <name>.key in the
// PKI's directory. A server reached under another name fails
// verification: what a test of the wrong host needs.
func (p *PKI) Issue(name string, hosts ...string) (certFile, keyFile string, err error) {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: strings.Join(hosts, ",")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	certFile, keyFile = filepath.Join(p.dir, name+".crt"), filepath.Join(p.dir, name+".key")
	if _, _, err := issue(p.ca, p.caKey, tmpl, certFile, keyFile); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// ServerTLS is the broker's TLS configuration for the embedded broker; with
// mutual, a client must present a certificate signed by the CA.
func (p *PKI) ServerTLS(mutual bool) *tls.Config {
	cfg := &tls.Config{Certificates: []tls.Certificate{p.server}, MinVersion: tls.VersionTLS12}
	if mutual {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = p.pool
	}
	return cfg
}

// issue signs a certificate for a new key from tmpl and writes both.
func issue(ca *x509.Certificate, caKey *ecdsa.PrivateKey, tmpl *x509.Certificate, certFile, keyFile string) (*ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(7 * 24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
		return nil, nil, err
	}
	if err := writePEM(keyFile, "PRIVATE KEY", keyDER); err != nil {
		return nil, nil, err
	}
	return key, der, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

func writePEM(path, typ string, der []byte) error {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
