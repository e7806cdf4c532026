package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// AuthOptions configures StartAuth: who may connect and how. A zero field
// means its default; the zero AuthOptions starts a server like Start does.
type AuthOptions struct {
	// Password is the default user's password (requirepass). "" leaves the
	// default user without one.
	Password string
	// Users are ACL users to create besides the default user.
	Users []User
	// TLS, if not nil, makes the server listen with TLS on a second port
	// (TLSAddr) with the server certificate of these Certs, and require a
	// client certificate signed by their CA. The plain-text port stays open.
	TLS *Certs
	// Args are extra redis-server arguments.
	Args []string
}

// User is an ACL user. Its name, password and rules are written on the
// redis-server command line, so none may be empty or hold a space or a
// control character.
type User struct {
	Name     string
	Password string
	// Rules are ACL rules as ACL SETUSER takes them, one per element, such
	// as "~hybrid:*", "+evalsha" or "-@all". The user is created "on", with
	// Password, and with these rules only: "resetkeys" and "-@all" are
	// implied, so a user without rules may run no command on no key.
	Rules []string
}

// AuthProc is a redis-server started by StartAuth. Its Proc is the
// plain-text port, which Kill, Restart and Stop work on as for Start.
type AuthProc struct {
	*Proc
	tlsAddr  string // "" without TLS
	password string // the default user's
}

// TLSAddr returns the address of the TLS port, "" if the server has none.
func (p *AuthProc) TLSAddr() string { return p.tlsAddr }

// Password returns the default user's password, "" if it has none.
func (p *AuthProc) Password() string { return p.password }

// StartAuth starts redis-server on 127.0.0.1 as Start does, with the
// passwords, ACL users and TLS port of opts, and waits until it answers
// (authenticating as the default user). The caller must call Stop.
func StartAuth(opts AuthOptions) (*AuthProc, error) {
	var args []string
	var auth []string
	if opts.Password != "" {
		if err := checkWord("password", opts.Password); err != nil {
			return nil, err
		}
		args = append(args, "--requirepass", opts.Password)
		auth = []string{opts.Password}
	}
	for _, u := range opts.Users {
		if err := checkWord("user name", u.Name); err != nil {
			return nil, err
		}
		if err := checkWord("password of user "+u.Name, u.Password); err != nil {
			return nil, err
		}
		line := []string{"--user", u.Name, "on", ">" + u.Password, "resetkeys", "-@all"}
		for _, r := range u.Rules {
			if err := checkWord("rule of user "+u.Name, r); err != nil {
				return nil, err
			}
			line = append(line, r)
		}
		args = append(args, line...)
	}
	args = append(args, opts.Args...)
	if opts.TLS == nil {
		p, err := start(Options{Args: args, auth: auth}, freePort)
		if err != nil {
			return nil, err
		}
		return &AuthProc{Proc: p, password: opts.Password}, nil
	}
	var err error
	for range startAttempts {
		var tlsPort int
		if tlsPort, err = freePort(); err != nil {
			return nil, err
		}
		a := append(args[:len(args):len(args)],
			"--tls-port", strconv.Itoa(tlsPort),
			"--tls-cert-file", opts.TLS.CertFile,
			"--tls-key-file", opts.TLS.KeyFile,
			"--tls-ca-cert-file", opts.TLS.CAFile,
			"--tls-auth-clients", "yes",
		)
		var p *Proc
		if p, err = start(Options{Args: a, auth: auth}, freePort); err == nil {
			return &AuthProc{
				Proc:     p,
				tlsAddr:  net.JoinHostPort("127.0.0.1", strconv.Itoa(tlsPort)),
				password: opts.Password,
			}, nil
		}
		if !errors.Is(err, errAddrInUse) { // the TLS port may be the one taken
			break
		}
	}
	if strings.Contains(strings.ToLower(err.Error()), "tls") {
		err = fmt.Errorf("%w: %w", ErrNoTLS, err)
	}
	return nil, err
}

// ErrNoTLS marks a server that failed to start with TLS and said why in
// its log: most likely a redis-server built without TLS support.
var ErrNoTLS = errors.New("redistest: redis-server refused the TLS options")

// checkWord returns an error unless s is a non-empty string without spaces
// or control characters.
func checkWord(what, s string) error {
	if s == "" {
		return fmt.Errorf("redistest: empty %s", what)
	}
	for _, c := range s {
		if c <= ' ' || c == 0x7f {
			return fmt.Errorf("redistest: %s %q holds a space or a control character", what, s)
		}
	}
	return nil
}

// AuthServer starts a redis-server with the passwords, users and TLS of opts
// for tb (StartAuth), stopped at cleanup. It always starts its own server:
// REDIS_ADDR is not used, since its users and TLS are not this test's.
// Without redis-server on PATH, or when the server refuses the TLS options,
// it skips tb, or fails it when Required.
func AuthServer(tb testing.TB, opts AuthOptions) *AuthProc {
	tb.Helper()
	need(tb, "redis-server")
	p, err := StartAuth(opts)
	if errors.Is(err, ErrNoTLS) && !Required() {
		tb.Skip(err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := p.Stop(); err != nil {
			tb.Error(err)
		}
	})
	return p
}

// Certs is a throwaway certificate authority with a server certificate for
// 127.0.0.1 and localhost and a client certificate, both signed by it, held
// as PEM files in one directory. Create them with NewCerts.
type Certs struct {
	CAFile         string // the authority's certificate
	CertFile       string // the server's certificate
	KeyFile        string // the server's private key
	ClientCertFile string // the client's certificate
	ClientKeyFile  string // the client's private key

	pool   *x509.CertPool
	client tls.Certificate
}

// certLife is how long the certificates of NewCerts are valid.
const certLife = 24 * time.Hour

// NewCerts generates an ECDSA P-256 certificate authority, a server
// certificate and a client certificate, valid from an hour ago for a day,
// and writes them and their keys to dir as PEM files (the keys readable by
// the owner only).
func NewCerts(dir string) (*Certs, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	caTmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "redistest CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certLife),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, caCert, err := sign(caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	c := &Certs{
		CAFile:         filepath.Join(dir, "ca.crt"),
		CertFile:       filepath.Join(dir, "server.crt"),
		KeyFile:        filepath.Join(dir, "server.key"),
		ClientCertFile: filepath.Join(dir, "client.crt"),
		ClientKeyFile:  filepath.Join(dir, "client.key"),
		pool:           x509.NewCertPool(),
	}
	c.pool.AddCert(caCert)
	if err := writePEM(c.CAFile, "CERTIFICATE", caDER, 0o644); err != nil {
		return nil, err
	}
	leaves := []struct {
		name      string
		certFile  string
		keyFile   string
		usage     x509.ExtKeyUsage
		forServer bool
	}{
		{"redistest server", c.CertFile, c.KeyFile, x509.ExtKeyUsageServerAuth, true},
		{"redistest client", c.ClientCertFile, c.ClientKeyFile, x509.ExtKeyUsageClientAuth, false},
	}
	for _, l := range leaves {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("redistest: %w", err)
		}
		tmpl := &x509.Certificate{
			Subject:     pkix.Name{CommonName: l.name},
			NotBefore:   now.Add(-time.Hour),
			NotAfter:    now.Add(certLife),
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{l.usage},
		}
		if l.forServer {
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
			tmpl.DNSNames = []string{"localhost"}
		}
		der, _, err := sign(tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return nil, err
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return nil, fmt.Errorf("redistest: %w", err)
		}
		if err := writePEM(l.certFile, "CERTIFICATE", der, 0o644); err != nil {
			return nil, err
		}
		if err := writePEM(l.keyFile, "EC PRIVATE KEY", keyDER, 0o600); err != nil {
			return nil, err
		}
		if !l.forServer {
			c.client = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
		}
	}
	return c, nil
}

// sign makes a certificate from tmpl, with a random serial number, signed
// by parent's key, and returns it in DER and parsed.
func sign(tmpl, parent *x509.Certificate, pub *ecdsa.PublicKey, priv *ecdsa.PrivateKey) ([]byte, *x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, fmt.Errorf("redistest: %w", err)
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, priv)
	if err != nil {
		return nil, nil, fmt.Errorf("redistest: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("redistest: %w", err)
	}
	return der, cert, nil
}

// writePEM writes one PEM block to path with the given permissions.
func writePEM(path, typ string, der []byte, perm os.FileMode) error {
	data := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(path, data, perm); err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	return nil
}

// ClientTLS returns a TLS configuration for a client of a server started
// with c: it trusts c's authority alone and presents c's client
// certificate. Each call returns a new configuration.
func (c *Certs) ClientTLS() *tls.Config {
	return &tls.Config{
		RootCAs:      c.pool,
		Certificates: []tls.Certificate{c.client},
		MinVersion:   tls.VersionTLS12,
	}
}
