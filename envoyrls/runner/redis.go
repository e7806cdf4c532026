package runner

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// newRedis returns a client of the Redis r names, a description of it for
// the log (without credentials), and the embedded Redis it started for an
// empty URL (nil otherwise), which the caller stops after the client.
// Every client sends nothing twice (MaxRetries -1: the Limiter makes its
// calls idempotent itself and keeps its own deadlines) and lets call
// deadlines reach the socket.
func newRedis(r Redis) (redis.UniversalClient, string, *miniredis.Miniredis, error) {
	var tlsConf *tls.Config
	if r.TLS {
		var err error
		if tlsConf, err = redisTLS(r); err != nil {
			return nil, "", nil, err
		}
	}
	user, pass := splitAuth(r.Auth)
	switch r.Type {
	case "sentinel":
		parts := splitList(r.URL)
		if len(parts) < 2 {
			return nil, "", nil, fmt.Errorf("%w: redis type sentinel: REDIS_URL %q is not <master name>,<sentinel1>,...,<sentinelN>", ErrConfig, r.URL)
		}
		sUser, sPass := splitAuth(r.SentinelAuth)
		rdb := redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName:            parts[0],
			SentinelAddrs:         parts[1:],
			SentinelUsername:      sUser,
			SentinelPassword:      sPass,
			Username:              user,
			Password:              pass,
			TLSConfig:             tlsConf,
			PoolSize:              r.PoolSize,
			MaxRetries:            -1,
			ContextTimeoutEnabled: true,
		})
		return rdb, fmt.Sprintf("sentinel master %s via %s", parts[0], strings.Join(parts[1:], ",")), nil, nil
	case "cluster":
		nodes := splitList(r.URL)
		rdb := redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                 nodes,
			Username:              user,
			Password:              pass,
			TLSConfig:             tlsConf,
			PoolSize:              r.PoolSize,
			MaxRetries:            -1,
			ContextTimeoutEnabled: true,
		})
		return rdb, "cluster " + strings.Join(nodes, ","), nil, nil
	}

	opts := &redis.Options{Network: r.Network, Addr: r.URL}
	var mini *miniredis.Miniredis
	desc := r.Network + " " + r.URL
	switch {
	case r.URL == "":
		var err error
		if mini, err = miniredis.Run(); err != nil {
			return nil, "", nil, fmt.Errorf("runner: embedded Redis: %w", err)
		}
		opts.Network, opts.Addr = "tcp", mini.Addr()
		desc = "embedded " + mini.Addr()
	case strings.Contains(r.URL, "://"):
		u, err := redis.ParseURL(r.URL)
		if err != nil {
			return nil, "", nil, fmt.Errorf("%w: REDIS_URL: %v", ErrConfig, err)
		}
		opts = u
		desc = opts.Network + " " + opts.Addr
		if tlsConf == nil {
			tlsConf = opts.TLSConfig // rediss://
		}
		if r.Auth == "" {
			user, pass = opts.Username, opts.Password
		}
	}
	opts.Username, opts.Password = user, pass
	opts.TLSConfig = tlsConf
	opts.PoolSize = r.PoolSize
	opts.MaxRetries = -1
	opts.ContextTimeoutEnabled = true
	return redis.NewClient(opts), desc, mini, nil
}

// splitAuth reads REDIS_AUTH as the original does: "user:password" for an
// ACL user, else a password alone. The first ':' separates them, so a user
// name holds none.
func splitAuth(auth string) (user, pass string) {
	if u, p, ok := strings.Cut(auth, ":"); ok {
		return u, p
	}
	return "", auth
}

// splitList splits a comma-separated list, dropping spaces around items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// redisTLS returns the TLS configuration of r's REDIS_TLS_* settings: the
// client certificate if both its files are given, the system's roots plus
// the CA file's, and with TLSSkipHostnameVerification a check of the
// chain that ignores the name the certificate is for.
func redisTLS(r Redis) (*tls.Config, error) {
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if r.TLSClientCert != "" && r.TLSClientKey != "" {
		cert, err := tls.LoadX509KeyPair(r.TLSClientCert, r.TLSClientKey)
		if err != nil {
			return nil, fmt.Errorf("%w: REDIS_TLS_CLIENT_CERT, REDIS_TLS_CLIENT_KEY: %v", ErrConfig, err)
		}
		conf.Certificates = []tls.Certificate{cert}
	}
	if r.TLSCACert != "" {
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		pem, err := os.ReadFile(r.TLSCACert)
		if err != nil {
			return nil, fmt.Errorf("%w: REDIS_TLS_CACERT: %v", ErrConfig, err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: REDIS_TLS_CACERT: no certificate in %s", ErrConfig, r.TLSCACert)
		}
		conf.RootCAs = pool
	}
	if r.TLSSkipHostnameVerification {
		roots := conf.RootCAs
		conf.InsecureSkipVerify = true // the chain is checked below, the name is not
		conf.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
			return verifyChain(raw, roots)
		}
	}
	return conf, nil
}

// verifyChain checks that the certificates raw, the server's first, chain
// to roots (the system's if nil), whatever name they are for.
func verifyChain(raw [][]byte, roots *x509.CertPool) error {
	if len(raw) == 0 {
		return errors.New("runner: Redis sent no certificate")
	}
	certs := make([]*x509.Certificate, len(raw))
	for i, b := range raw {
		c, err := x509.ParseCertificate(b)
		if err != nil {
			return fmt.Errorf("runner: Redis's certificate: %w", err)
		}
		certs[i] = c
	}
	opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool()}
	for _, c := range certs[1:] {
		opts.Intermediates.AddCert(c)
	}
	_, err := certs[0].Verify(opts)
	return err
}
