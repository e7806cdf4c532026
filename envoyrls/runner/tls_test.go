package runner

import (
	"crypto/tls"
	"errors"
	"net"
	"testing"

	"github.com/hybridlimit/hybrid/internal/redistest"
)

// TestRedisTLSSkipHostname: REDIS_TLS_SKIP_HOSTNAME_VERIFICATION accepts a
// certificate for another name, but only one that chains to a trusted
// authority.
func TestRedisTLSSkipHostname(t *testing.T) {
	certs, err := redistest.NewCerts(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	serverCert, err := tls.LoadX509KeyPair(certs.CertFile, certs.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		r    Redis
		ok   bool
	}{
		{"name checked", Redis{TLSCACert: certs.CAFile}, false},
		{"name skipped", Redis{TLSCACert: certs.CAFile, TLSSkipHostnameVerification: true}, true},
		{"name skipped, authority unknown", Redis{TLSSkipHostnameVerification: true}, false},
	} {
		conf, err := redisTLS(c.r)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		conf.ServerName = "not-the-server.example" // the certificate is for 127.0.0.1 and localhost
		err = handshake(t, serverCert, conf)
		if (err == nil) != c.ok {
			t.Errorf("%s: handshake error %v, want success %v", c.name, err, c.ok)
		}
	}
	if _, err := redisTLS(Redis{TLSCACert: certs.KeyFile}); !errors.Is(err, ErrConfig) {
		t.Errorf("a CA file without a certificate: %v, want ErrConfig", err)
	}
}

// handshake makes a TLS handshake over loopback between a server with
// cert and a client with conf, and returns the client's error.
func handshake(t *testing.T, cert tls.Certificate, conf *tls.Config) error {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := lis.Accept()
		if err != nil {
			return
		}
		c.(*tls.Conn).Handshake()
		c.Close()
	}()
	c, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(c, conf)
	err = tc.Handshake()
	tc.Close()
	<-done
	return err
}
