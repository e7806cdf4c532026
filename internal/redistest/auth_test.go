package redistest_test

import (
	"crypto/tls"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// authClient returns a client of addr with the given credentials and TLS
// configuration (nil for none), closed at cleanup. It uses go-redis's own
// dialer, which is the one that applies Options.TLSConfig.
func authClient(t *testing.T, addr, user, password string, tc *tls.Config) *redis.Client {
	t.Helper()
	if err := redistest.CheckLoopback(addr); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{
		Addr:                     addr,
		Username:                 user,
		Password:                 password,
		TLSConfig:                tc,
		MaxRetries:               -1,
		DialTimeout:              5 * time.Second,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// TestAuthPassword: the default user needs the password, the readiness
// probe sends it (on start and on Restart), and a wrong one is refused.
func TestAuthPassword(t *testing.T) {
	t.Parallel()
	p := redistest.AuthServer(t, redistest.AuthOptions{Password: "s3cret"})
	if got := p.Password(); got != "s3cret" {
		t.Errorf("Password() = %q, want s3cret", got)
	}
	if p.TLSAddr() != "" {
		t.Errorf("TLSAddr() = %q without TLS, want empty", p.TLSAddr())
	}
	ctx := t.Context()
	for _, tt := range []struct {
		password string
		want     string // in the error; "" for none
	}{
		{"s3cret", ""},
		{"", "NOAUTH"},
		{"wrong", "WRONGPASS"},
	} {
		err := authClient(t, p.Addr(), "", tt.password, nil).Ping(ctx).Err()
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("PING with password %q = %v, want an error with %q (none if empty)", tt.password, err, tt.want)
		}
	}
	if err := p.Restart(); err != nil {
		t.Fatalf("Restart() = %v", err)
	}
	if err := authClient(t, p.Addr(), "", "s3cret", nil).Ping(ctx).Err(); err != nil {
		t.Errorf("PING after Restart: %v", err)
	}
}

// TestAuthUsers: an ACL user may run what its rules allow, on the keys
// they allow, and nothing else; "-@all" is implied.
func TestAuthUsers(t *testing.T) {
	t.Parallel()
	p := redistest.AuthServer(t, redistest.AuthOptions{Users: []redistest.User{
		{Name: "writer", Password: "w-pass", Rules: []string{"~app:*", "+set", "+get"}},
		{Name: "nobody", Password: "n-pass"},
	}})
	ctx := t.Context()
	writer := authClient(t, p.Addr(), "writer", "w-pass", nil)
	if err := writer.Set(ctx, "app:1", "v", 0).Err(); err != nil {
		t.Errorf("writer: SET app:1: %v", err)
	}
	if got, err := writer.Get(ctx, "app:1").Result(); err != nil || got != "v" {
		t.Errorf("writer: GET app:1 = %q, %v; want v", got, err)
	}
	for _, tt := range []struct {
		name string
		err  error
	}{
		{"SET other:1", writer.Set(ctx, "other:1", "v", 0).Err()},
		{"DEL app:1", writer.Del(ctx, "app:1").Err()},
		{"FLUSHALL", writer.FlushAll(ctx).Err()},
	} {
		if tt.err == nil || !strings.Contains(tt.err.Error(), "NOPERM") {
			t.Errorf("writer: %s = %v, want NOPERM", tt.name, tt.err)
		}
	}
	if err := authClient(t, p.Addr(), "nobody", "n-pass", nil).Get(ctx, "app:1").Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("nobody: GET app:1 = %v, want NOPERM", err)
	}
	if err := authClient(t, p.Addr(), "writer", "n-pass", nil).Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Errorf("writer with the wrong password: PING = %v, want WRONGPASS", err)
	}
	// The default user is untouched: no password, every command.
	if err := authClient(t, p.Addr(), "", "", nil).FlushAll(ctx).Err(); err != nil {
		t.Errorf("default user: FLUSHALL: %v", err)
	}
}

// TestAuthTLS: the TLS port answers a client that trusts the CA and shows
// the client certificate, and refuses one without a certificate, one that
// trusts another CA, and plain text; the plain-text port still works.
func TestAuthTLS(t *testing.T) {
	t.Parallel()
	certs, err := redistest.NewCerts(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	other, err := redistest.NewCerts(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p := redistest.AuthServer(t, redistest.AuthOptions{Password: "tls-pass", TLS: certs})
	if err := redistest.CheckLoopback(p.TLSAddr()); err != nil || p.TLSAddr() == p.Addr() {
		t.Fatalf("TLSAddr() = %q (Addr %q): %v; want another loopback address", p.TLSAddr(), p.Addr(), err)
	}
	ctx := t.Context()
	if err := authClient(t, p.TLSAddr(), "", "tls-pass", certs.ClientTLS()).Ping(ctx).Err(); err != nil {
		t.Errorf("PING over TLS: %v", err)
	}
	if err := authClient(t, p.Addr(), "", "tls-pass", nil).Ping(ctx).Err(); err != nil {
		t.Errorf("PING on the plain-text port: %v", err)
	}
	noCert := certs.ClientTLS()
	noCert.Certificates = nil
	for _, tt := range []struct {
		name string
		tc   *tls.Config
	}{
		{"without a client certificate", noCert},
		{"trusting another CA", other.ClientTLS()},
		{"in plain text", nil},
	} {
		if err := authClient(t, p.TLSAddr(), "", "tls-pass", tt.tc).Ping(ctx).Err(); err == nil {
			t.Errorf("PING on the TLS port %s = nil, want an error", tt.name)
		}
	}
}

// TestStartAuthRejects: names, passwords and rules that would not survive
// the command line are refused before anything starts.
func TestStartAuthRejects(t *testing.T) {
	for _, opts := range []redistest.AuthOptions{
		{Password: "two words"},
		{Password: "line\nbreak"},
		{Users: []redistest.User{{Name: "", Password: "x"}}},
		{Users: []redistest.User{{Name: "u", Password: ""}}},
		{Users: []redistest.User{{Name: "u", Password: "x", Rules: []string{"+get +set"}}}},
	} {
		p, err := redistest.StartAuth(opts)
		if err == nil {
			p.Stop()
			t.Errorf("StartAuth(%+v) = nil error, want one", opts)
		} else if errors.Is(err, redistest.ErrNoTLS) {
			t.Errorf("StartAuth(%+v) = %v, want no ErrNoTLS", opts, err)
		}
	}
}
