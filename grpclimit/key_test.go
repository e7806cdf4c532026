package grpclimit_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/grpclimit"
	"github.com/hybridlimit/hybrid/httplimit"
)

// proxies are the trusted proxies of the key tests.
var proxies = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48")}

// callCtx returns the context of a call from addr (nil: no peer) with the
// metadata given as key, value pairs, as a server hands it to its
// interceptors.
func callCtx(addr net.Addr, kv ...string) context.Context {
	ctx := context.Background()
	if addr != nil {
		ctx = peer.NewContext(ctx, &peer.Peer{Addr: addr})
	}
	return metadata.NewIncomingContext(ctx, metadata.Pairs(kv...))
}

// unixAddr is the address of a peer on a Unix socket.
var unixAddr = &net.UnixAddr{Name: "/run/app.sock", Net: "unix"}

// TestKeys: each KeyFunc on calls from various peers with various
// metadata.
func TestKeys(t *testing.T) {
	trusted := grpclimit.ByPeer(&httplimit.ClientIP{TrustedProxies: proxies})
	fwd := grpclimit.ByPeer(&httplimit.ClientIP{TrustedProxies: proxies, Header: httplimit.Forwarded, IPv4Bits: 24})
	failing := func(context.Context, string) (string, error) { return "", errors.New("broken") }
	const m = "/pkg.Service/Get"
	tests := []struct {
		name string
		key  grpclimit.KeyFunc
		ctx  context.Context
		want string // "": ErrNoKey
		fail bool   // another error
	}{
		{"method", grpclimit.ByMethod(), callCtx(nil), "method:/pkg.Service/Get", false},

		{"peer", grpclimit.ByPeer(nil), callCtx(tcpAddr(client)), "ip:198.51.100.7", false},
		{"peer IPv6 /64", grpclimit.ByPeer(nil), callCtx(tcpAddr("[2001:db8:1:2:3::9]:1")), "ip:2001:db8:1:2::/64", false},
		{"peer IPv4-mapped", grpclimit.ByPeer(nil), callCtx(tcpAddr("[::ffff:198.51.100.7]:1")), "ip:198.51.100.7", false},
		{"peer UDP", grpclimit.ByPeer(nil), callCtx(&net.UDPAddr{IP: net.IPv4(198, 51, 100, 7), Port: 1}), "ip:198.51.100.7", false},
		{"peer Unix socket", grpclimit.ByPeer(nil), callCtx(unixAddr), "ip:/run/app.sock", false},
		{"no peer", grpclimit.ByPeer(nil), callCtx(nil), "ip:unknown", false},
		{"no proxy trusted: x-forwarded-for ignored", grpclimit.ByPeer(nil), callCtx(tcpAddr("10.0.0.1:1"), "x-forwarded-for", "198.51.100.7"), "ip:10.0.0.1", false},
		{"untrusted peer: x-forwarded-for ignored", trusted, callCtx(tcpAddr("203.0.113.9:1"), "x-forwarded-for", "198.51.100.7"), "ip:203.0.113.9", false},
		{"trusted peer: x-forwarded-for read", trusted, callCtx(tcpAddr("10.0.0.1:1"), "x-forwarded-for", "6.6.6.6, 198.51.100.7, 10.0.0.2"), "ip:198.51.100.7", false},
		{"trusted peer: lines in order", trusted, callCtx(tcpAddr("10.0.0.1:1"), "x-forwarded-for", "198.51.100.7", "x-forwarded-for", "10.0.0.2"), "ip:198.51.100.7", false},
		{"trusted IPv6 peer", trusted, callCtx(tcpAddr("[2001:db8:ffff::1]:1"), "x-forwarded-for", "198.51.100.7"), "ip:198.51.100.7", false},
		{"trusted peer, no metadata", trusted, callCtx(tcpAddr("10.0.0.1:1")), "ip:10.0.0.1", false},
		{"trusted peer, garbage", trusted, callCtx(tcpAddr("10.0.0.1:1"), "x-forwarded-for", "198.51.100.7, garbage"), "ip:10.0.0.1", false},
		{"trusted peer, forwarded not read", trusted, callCtx(tcpAddr("10.0.0.1:1"), "forwarded", "for=198.51.100.7"), "ip:10.0.0.1", false},
		{"Forwarded", fwd, callCtx(tcpAddr("10.0.0.1:1"), "forwarded", "for=198.51.100.7;proto=https"), "ip:198.51.100.0/24", false},

		{"metadata", grpclimit.ByMetadata("X-API-Key"), callCtx(nil, "x-api-key", "k1"), "x-api-key:k1", false},
		{"metadata, first value", grpclimit.ByMetadata("x-api-key"), callCtx(nil, "x-api-key", "k1", "x-api-key", "k2"), "x-api-key:k1", false},
		{"metadata missing", grpclimit.ByMetadata("x-api-key"), callCtx(nil, "x-other", "k1"), "", false},
		{"metadata empty", grpclimit.ByMetadata("x-api-key"), callCtx(nil, "x-api-key", ""), "", false},

		{"first: the first found", grpclimit.FirstKey(grpclimit.ByMetadata("x-api-key"), grpclimit.ByPeer(nil)), callCtx(tcpAddr(client), "x-api-key", "k1"), "x-api-key:k1", false},
		{"first: falls through", grpclimit.FirstKey(grpclimit.ByMetadata("x-api-key"), grpclimit.ByPeer(nil)), callCtx(tcpAddr(client)), "ip:198.51.100.7", false},
		{"first: none", grpclimit.FirstKey(grpclimit.ByMetadata("a"), grpclimit.ByMetadata("b")), callCtx(nil), "", false},
		{"first: no KeyFunc", grpclimit.FirstKey(), callCtx(nil), "", false},
		{"first: an error stops", grpclimit.FirstKey(grpclimit.ByMetadata("a"), failing, grpclimit.ByMethod()), callCtx(nil), "", true},

		{"join", grpclimit.Join(grpclimit.ByMethod(), grpclimit.ByPeer(nil)), callCtx(tcpAddr(client)), "method:/pkg.Service/Get|ip:198.51.100.7", false},
		{"join escapes", grpclimit.Join(grpclimit.ByMetadata("a"), grpclimit.ByMetadata("b")), callCtx(nil, "a", `x|b:y\`, "b", "z"), `a:x\|b:y\\|b:z`, false},
		{"join: one without a key", grpclimit.Join(grpclimit.ByMethod(), grpclimit.ByMetadata("a")), callCtx(nil), "", false},
		{"join: no KeyFunc", grpclimit.Join(), callCtx(nil), "", false},
		{"join: an error", grpclimit.Join(grpclimit.ByMethod(), failing), callCtx(nil), "", true},
	}
	for _, tt := range tests {
		got, err := tt.key(tt.ctx, m)
		switch {
		case tt.fail:
			if err == nil || errors.Is(err, grpclimit.ErrNoKey) {
				t.Errorf("%s: %q, %v; want an error other than ErrNoKey", tt.name, got, err)
			}
		case tt.want == "":
			if got != "" || !errors.Is(err, grpclimit.ErrNoKey) {
				t.Errorf("%s: %q, %v; want ErrNoKey", tt.name, got, err)
			}
		case got != tt.want || err != nil:
			t.Errorf("%s: %q, %v; want %q", tt.name, got, err, tt.want)
		}
	}
}

// TestJoinInjective: values a client chooses cannot make two different
// lists of keys join alike.
func TestJoinInjective(t *testing.T) {
	key := grpclimit.Join(grpclimit.ByMetadata("a"), grpclimit.ByMetadata("b"))
	a, _ := key(callCtx(nil, "a", "x|b:y", "b", "z"), "/m")
	b, _ := key(callCtx(nil, "a", "x", "b", "y|b:z"), "/m")
	if a == b {
		t.Errorf("both join as %q", a)
	}
}

// TestByPeerCopies: ByPeer copies its ClientIP: changing it afterwards
// changes nothing.
func TestByPeerCopies(t *testing.T) {
	c := &httplimit.ClientIP{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	key := grpclimit.ByPeer(c)
	c.TrustedProxies[0] = netip.MustParsePrefix("203.0.113.0/24")
	c.IPv4Bits = 8
	got, _ := key(callCtx(tcpAddr("10.0.0.1:1"), "x-forwarded-for", "198.51.100.7"), "/m")
	if got != "ip:198.51.100.7" {
		t.Errorf("key %q, want ip:198.51.100.7 as ByPeer was given", got)
	}
}

// TestKeysServed: keys on calls through a real server. ByMethod gives
// Check and Watch a bucket each; behind a trusted proxy each forwarded
// client has its own bucket, while an untrusted peer cannot escape its own
// by forging x-forwarded-for.
func TestKeysServed(t *testing.T) {
	one := hybrid.Limit{Rate: slow, Burst: 1}
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		s := serve(t, newInterceptor(t, lim, grpclimit.Config{Name: "m", Key: grpclimit.ByMethod(), Limit: one}), options{})
		if _, _, err := s.check(context.Background()); err != nil {
			t.Errorf("first Check: %v", err)
		}
		if _, err := s.watch(t); err != nil {
			t.Errorf("first Watch: %v, want its own bucket", err)
		}
		if _, _, err := s.check(context.Background()); status.Code(err) != codes.ResourceExhausted {
			t.Errorf("second Check: %v, want ResourceExhausted", err)
		}
	})
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		ic := newInterceptor(t, lim, grpclimit.Config{Name: "ip", Key: grpclimit.ByPeer(&httplimit.ClientIP{TrustedProxies: proxies}), Limit: one})
		proxy := serve(t, ic, options{peer: tcpAddr("10.0.0.1:5000")})
		spoofer := serve(t, ic, options{peer: tcpAddr("203.0.113.9:5000")})
		steps := []struct {
			s    *server
			xff  string
			code codes.Code
		}{
			{proxy, "198.51.100.7", codes.OK},
			{proxy, "198.51.100.8", codes.OK},
			{proxy, "6.6.6.6, 198.51.100.7", codes.ResourceExhausted}, // a forged left part does not help
			{proxy, "198.51.100.9, 10.0.0.2", codes.OK},
			{spoofer, "198.51.100.10", codes.OK},
			{spoofer, "198.51.100.11", codes.ResourceExhausted}, // keyed by the peer
			{spoofer, "198.51.100.7", codes.ResourceExhausted},
		}
		for i, st := range steps {
			if _, _, err := st.s.check(context.Background(), "x-forwarded-for", st.xff); status.Code(err) != st.code {
				t.Errorf("step %d, x-forwarded-for %q: %v, want %v", i, st.xff, err, st.code)
			}
		}
	})
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		s := serve(t, newInterceptor(t, lim, grpclimit.Config{Name: "key", Key: grpclimit.ByMetadata("x-api-key"), Limit: one}), options{})
		for i, st := range []struct {
			key  string
			code codes.Code
		}{{"k1", codes.OK}, {"k2", codes.OK}, {"k1", codes.ResourceExhausted}} {
			if _, _, err := s.check(context.Background(), "x-api-key", st.key); status.Code(err) != st.code {
				t.Errorf("step %d, x-api-key %q: %v, want %v", i, st.key, err, st.code)
			}
		}
	})
}
