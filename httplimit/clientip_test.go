package httplimit_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/hybridlimit/hybrid/httplimit"
)

// proxies are the trusted proxies of the client-address tests: two IPv4
// networks and one IPv6 network.
var proxies = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("2001:db8:ffff::/48"),
}

// TestClientIPAddr: the client address behind trusted proxies, for both
// headers: trusted and untrusted peers, chains, spoofing, IPv6, the quoting
// and obfuscated identifiers of RFC 7239, and garbage, which always gives
// the peer.
func TestClientIPAddr(t *testing.T) {
	const peer = "10.0.0.1:5000" // a trusted proxy
	xff := httplimit.ClientIP{TrustedProxies: proxies}
	fwd := httplimit.ClientIP{TrustedProxies: proxies, Header: httplimit.Forwarded}
	tests := []struct {
		name   string
		c      httplimit.ClientIP
		remote string
		header []string // name, value pairs, in order
		want   string   // "" for the zero Addr
	}{
		// Who is trusted.
		{"no proxy trusted: headers ignored", httplimit.ClientIP{}, peer, []string{"X-Forwarded-For", "198.51.100.7"}, "10.0.0.1"},
		{"untrusted peer: spoofed header ignored", xff, "203.0.113.9:1", []string{"X-Forwarded-For", "198.51.100.7"}, "203.0.113.9"},
		{"untrusted peer: spoofed Forwarded ignored", fwd, "203.0.113.9:1", []string{"Forwarded", "for=198.51.100.7"}, "203.0.113.9"},
		{"trusted peer, no header", xff, peer, nil, "10.0.0.1"},
		{"trusted peer, empty header", xff, peer, []string{"X-Forwarded-For", ""}, "10.0.0.1"},

		// X-Forwarded-For chains, read right to left.
		{"one hop", xff, peer, []string{"X-Forwarded-For", "198.51.100.7"}, "198.51.100.7"},
		{"trusted hops skipped", xff, peer, []string{"X-Forwarded-For", "198.51.100.7, 10.0.0.2, 192.168.1.1"}, "198.51.100.7"},
		{"forged left part ignored", xff, peer, []string{"X-Forwarded-For", "6.6.6.6, 7.7.7.7, 198.51.100.7, 10.0.0.2"}, "198.51.100.7"},
		{"forged trusted-looking hop stops at the first untrusted", xff, peer, []string{"X-Forwarded-For", "10.9.9.9, 198.51.100.7"}, "198.51.100.7"},
		{"all hops trusted: the leftmost", xff, peer, []string{"X-Forwarded-For", "10.1.1.1, 10.0.0.2"}, "10.1.1.1"},
		{"lines joined in order", xff, peer, []string{"X-Forwarded-For", "6.6.6.6", "X-Forwarded-For", "198.51.100.7, 10.0.0.2"}, "198.51.100.7"},
		{"chain across lines", xff, peer, []string{"X-Forwarded-For", "198.51.100.7", "X-Forwarded-For", "10.0.0.2"}, "198.51.100.7"},
		{"empty elements and blanks", xff, peer, []string{"X-Forwarded-For", " ,198.51.100.7 ,,\t10.0.0.2 , "}, "198.51.100.7"},
		{"IPv4 with port", xff, peer, []string{"X-Forwarded-For", "198.51.100.7:4711"}, "198.51.100.7"},
		{"IPv6", xff, peer, []string{"X-Forwarded-For", "2001:db8:1::7"}, "2001:db8:1::7"},
		{"IPv6 in brackets with port", xff, peer, []string{"X-Forwarded-For", "[2001:db8:1::7]:443"}, "2001:db8:1::7"},
		{"IPv6 in brackets", xff, peer, []string{"X-Forwarded-For", "[2001:db8:1::7]"}, "2001:db8:1::7"},
		{"IPv4-mapped IPv6 unmapped", xff, peer, []string{"X-Forwarded-For", "::ffff:198.51.100.7"}, "198.51.100.7"},
		{"zone dropped", xff, peer, []string{"X-Forwarded-For", "fe80::1%eth0"}, "fe80::1"},
		{"IPv6 peer trusted", xff, "[2001:db8:ffff::1]:443", []string{"X-Forwarded-For", "2001:db8:1::7"}, "2001:db8:1::7"},
		{"IPv6 peer untrusted", xff, "[2001:db8:1::9]:443", []string{"X-Forwarded-For", "198.51.100.7"}, "2001:db8:1::9"},
		{"IPv4-mapped peer trusted as IPv4", xff, "[::ffff:10.0.0.1]:80", []string{"X-Forwarded-For", "198.51.100.7"}, "198.51.100.7"},
		{"peer without port", xff, "10.0.0.1", []string{"X-Forwarded-For", "198.51.100.7"}, "198.51.100.7"},
		{"Forwarded ignored when X-Forwarded-For is the header", xff, peer, []string{"Forwarded", "for=6.6.6.6"}, "10.0.0.1"},
		{"X-Forwarded-For ignored when Forwarded is the header", fwd, peer, []string{"X-Forwarded-For", "6.6.6.6"}, "10.0.0.1"},

		// X-Forwarded-For garbage: the peer.
		{"garbage hop", xff, peer, []string{"X-Forwarded-For", "198.51.100.7, garbage"}, "10.0.0.1"},
		{"garbage left of the client ignored", xff, peer, []string{"X-Forwarded-For", "garbage, 198.51.100.7"}, "198.51.100.7"},
		{"five octets", xff, peer, []string{"X-Forwarded-For", "1.2.3.4.5"}, "10.0.0.1"},
		{"octet above 255", xff, peer, []string{"X-Forwarded-For", "256.1.1.1"}, "10.0.0.1"},
		{"bad port", xff, peer, []string{"X-Forwarded-For", "198.51.100.7:http"}, "10.0.0.1"},
		{"quoted", xff, peer, []string{"X-Forwarded-For", `"198.51.100.7"`}, "10.0.0.1"},
		{"unclosed bracket", xff, peer, []string{"X-Forwarded-For", "[2001:db8::1"}, "10.0.0.1"},
		{"IPv4 in brackets", xff, peer, []string{"X-Forwarded-For", "[198.51.100.7]"}, "10.0.0.1"},
		{"overlong", xff, peer, []string{"X-Forwarded-For", strings.Repeat("1", 200)}, "10.0.0.1"},
		{"unparsable peer", xff, "pipe", []string{"X-Forwarded-For", "198.51.100.7"}, ""},
		{"empty peer", xff, "", []string{"X-Forwarded-For", "198.51.100.7"}, ""},

		// Forwarded (RFC 7239).
		{"for", fwd, peer, []string{"Forwarded", "for=198.51.100.7"}, "198.51.100.7"},
		{"for among parameters", fwd, peer, []string{"Forwarded", "proto=https;for=198.51.100.7;by=10.0.0.2"}, "198.51.100.7"},
		{"for in capitals", fwd, peer, []string{"Forwarded", "For=198.51.100.7"}, "198.51.100.7"},
		{"quoted IPv4 with port", fwd, peer, []string{"Forwarded", `for="198.51.100.7:47011"`}, "198.51.100.7"},
		{"quoted IPv6 with port", fwd, peer, []string{"Forwarded", `for="[2001:db8:cafe::17]:4711"`}, "2001:db8:cafe::17"},
		{"quoted IPv6", fwd, peer, []string{"Forwarded", `for="[2001:db8:cafe::17]"`}, "2001:db8:cafe::17"},
		{"unquoted IPv6 in brackets", fwd, peer, []string{"Forwarded", "for=[2001:db8:cafe::17]"}, "2001:db8:cafe::17"},
		{"obfuscated port", fwd, peer, []string{"Forwarded", `for="[2001:db8:cafe::17]:_p0rt"`}, "2001:db8:cafe::17"},
		{"quoted-pairs resolved", fwd, peer, []string{"Forwarded", `for="\1\98.51.100.7"`}, "198.51.100.7"},
		{"chain", fwd, peer, []string{"Forwarded", "for=198.51.100.7;proto=https, for=10.0.0.2;by=10.0.0.1"}, "198.51.100.7"},
		{"forged left part ignored", fwd, peer, []string{"Forwarded", "for=6.6.6.6, for=198.51.100.7, for=10.0.0.2"}, "198.51.100.7"},
		{"forged element with quoted comma ignored", fwd, peer, []string{"Forwarded", `for="6.6.6.6, for=7.7.7.7", for=198.51.100.7`}, "198.51.100.7"},
		{"for inside a quoted value not taken", fwd, peer, []string{"Forwarded", `for=198.51.100.7, by="x;for=6.6.6.6";for=10.0.0.5`}, "198.51.100.7"},
		{"all trusted: the leftmost", fwd, peer, []string{"Forwarded", "for=10.1.1.1", "Forwarded", "for=10.0.0.2"}, "10.1.1.1"},
		{"blanks around pairs", fwd, peer, []string{"Forwarded", " for=198.51.100.7 ; proto=http "}, "198.51.100.7"},

		// Forwarded nodes that are not addresses, and garbage: the peer.
		{"unknown", fwd, peer, []string{"Forwarded", "for=unknown"}, "10.0.0.1"},
		{"unknown quoted", fwd, peer, []string{"Forwarded", `for="UNKNOWN"`}, "10.0.0.1"},
		{"obfuscated identifier", fwd, peer, []string{"Forwarded", "for=_hidden"}, "10.0.0.1"},
		{"obfuscated identifier quoted", fwd, peer, []string{"Forwarded", `for="_SEVKISEK"`}, "10.0.0.1"},
		{"obfuscated behind a trusted hop", fwd, peer, []string{"Forwarded", "for=_hidden, for=10.0.0.2"}, "10.0.0.1"},
		{"no for", fwd, peer, []string{"Forwarded", "proto=https;by=10.0.0.2"}, "10.0.0.1"},
		{"for twice", fwd, peer, []string{"Forwarded", "for=198.51.100.7;for=203.0.113.1"}, "10.0.0.1"},
		{"unterminated quote", fwd, peer, []string{"Forwarded", `for="198.51.100.7`}, "10.0.0.1"},
		{"quote inside", fwd, peer, []string{"Forwarded", `for="198.51"100.7"`}, "10.0.0.1"},
		{"trailing backslash", fwd, peer, []string{"Forwarded", `for="198.51.100.7\"`}, "10.0.0.1"},
		{"empty for", fwd, peer, []string{"Forwarded", "for="}, "10.0.0.1"},
		{"empty quoted for", fwd, peer, []string{"Forwarded", `for=""`}, "10.0.0.1"},
		{"no name", fwd, peer, []string{"Forwarded", "=198.51.100.7"}, "10.0.0.1"},
		{"no equals", fwd, peer, []string{"Forwarded", "198.51.100.7"}, "10.0.0.1"},
		{"separators only", fwd, peer, []string{"Forwarded", ";;=;"}, "10.0.0.1"},
		{"unclosed bracket", fwd, peer, []string{"Forwarded", `for="[2001:db8::1"`}, "10.0.0.1"},
		{"control byte", fwd, peer, []string{"Forwarded", "for=\"198.51.100.7\x01\""}, "10.0.0.1"},
		{"hostname", fwd, peer, []string{"Forwarded", "for=example.com"}, "10.0.0.1"},
		{"64 KB of quotes", fwd, peer, []string{"Forwarded", strings.Repeat(`"`, 64<<10)}, "10.0.0.1"},
		{"64 KB node", fwd, peer, []string{"Forwarded", "for=" + strings.Repeat("1", 64<<10)}, "10.0.0.1"},
		{"64 KB of parameters", fwd, peer, []string{"Forwarded", strings.Repeat("a=b;", 16<<10) + "for=198.51.100.7"}, "198.51.100.7"},
		{"64 KB of trusted hops", fwd, peer, []string{"Forwarded", strings.Repeat("for=10.0.0.9, ", 5000) + "for=198.51.100.7, for=10.0.0.2"}, "198.51.100.7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := request("/", tt.remote, tt.header...)
			got := tt.c.Addr(r)
			var want netip.Addr
			if tt.want != "" {
				want = netip.MustParseAddr(tt.want)
			}
			if got != want {
				t.Errorf("Addr(RemoteAddr %q, %q) = %v, want %v", tt.remote, tt.header, got, want)
			}
			// AddrFrom, given the peer and the lines of the header,
			// finds the same client.
			peer, lines := peerOf(tt.remote), r.Header[tt.c.Header.String()]
			if got := tt.c.AddrFrom(peer, lines); got != want {
				t.Errorf("AddrFrom(%v, %q) = %v, want %v", peer, lines, got, want)
			}
		})
	}
}

// peerOf parses a RemoteAddr, "host:port" or a bare address, as the
// protocols that call AddrFrom have it: the zero Addr if it is neither.
func peerOf(remote string) netip.Addr {
	if ap, err := netip.ParseAddrPort(remote); err == nil {
		return ap.Addr()
	}
	a, _ := netip.ParseAddr(remote)
	return a
}

// TestClientIPAddrFrom: AddrFrom normalizes the peer, reads the lines only
// for a trusted peer, and reads them in order.
func TestClientIPAddrFrom(t *testing.T) {
	c := httplimit.ClientIP{TrustedProxies: proxies}
	tests := []struct {
		name  string
		peer  netip.Addr
		lines []string
		want  netip.Addr
	}{
		{"zero peer", netip.Addr{}, []string{"198.51.100.7"}, netip.Addr{}},
		{"untrusted peer", netip.MustParseAddr("203.0.113.9"), []string{"198.51.100.7"}, netip.MustParseAddr("203.0.113.9")},
		{"untrusted peer unmapped", netip.MustParseAddr("::ffff:203.0.113.9"), nil, netip.MustParseAddr("203.0.113.9")},
		{"untrusted peer without zone", netip.MustParseAddr("fe80::1%eth0"), nil, netip.MustParseAddr("fe80::1")},
		{"trusted mapped peer", netip.MustParseAddr("::ffff:10.0.0.1"), []string{"198.51.100.7"}, netip.MustParseAddr("198.51.100.7")},
		{"trusted peer, no lines", netip.MustParseAddr("10.0.0.1"), nil, netip.MustParseAddr("10.0.0.1")},
		{"lines in order", netip.MustParseAddr("10.0.0.1"), []string{"6.6.6.6", "198.51.100.7, 10.0.0.2"}, netip.MustParseAddr("198.51.100.7")},
		{"garbage", netip.MustParseAddr("10.0.0.1"), []string{"198.51.100.7, garbage"}, netip.MustParseAddr("10.0.0.1")},
	}
	for _, tt := range tests {
		if got := c.AddrFrom(tt.peer, tt.lines); got != tt.want {
			t.Errorf("%s: AddrFrom(%v, %q) = %v, want %v", tt.name, tt.peer, tt.lines, got, tt.want)
		}
	}
}

// TestClientIPTrusts: the trusted networks, after unmapping and dropping
// the zone; nothing for the zero ClientIP or the zero Addr.
func TestClientIPTrusts(t *testing.T) {
	c := httplimit.ClientIP{TrustedProxies: proxies}
	tests := []struct {
		c    httplimit.ClientIP
		a    string // "" for the zero Addr
		want bool
	}{
		{c, "10.0.0.1", true},
		{c, "::ffff:10.0.0.1", true},
		{c, "2001:db8:ffff::1%eth0", true},
		{c, "203.0.113.9", false},
		{c, "", false},
		{httplimit.ClientIP{}, "10.0.0.1", false},
	}
	for _, tt := range tests {
		var a netip.Addr
		if tt.a != "" {
			a = netip.MustParseAddr(tt.a)
		}
		if got := tt.c.Trusts(a); got != tt.want {
			t.Errorf("%v.Trusts(%v) = %v, want %v", tt.c.TrustedProxies, a, got, tt.want)
		}
	}
}

// TestClientIPKey: the key of a client address, masked to its network.
func TestClientIPKey(t *testing.T) {
	tests := []struct {
		c      httplimit.ClientIP
		remote string
		want   string
	}{
		{httplimit.ClientIP{}, "198.51.100.7:1", "ip:198.51.100.7"},
		{httplimit.ClientIP{IPv4Bits: 24}, "198.51.100.7:1", "ip:198.51.100.0/24"},
		{httplimit.ClientIP{IPv4Bits: 99}, "198.51.100.7:1", "ip:198.51.100.7"},
		{httplimit.ClientIP{IPv4Bits: -1}, "198.51.100.7:1", "ip:198.51.100.7"},
		{httplimit.ClientIP{}, "[2001:db8:1:2:3:4:5:6]:1", "ip:2001:db8:1:2::/64"},
		{httplimit.ClientIP{IPv6Bits: 48}, "[2001:db8:1:2:3:4:5:6]:1", "ip:2001:db8:1::/48"},
		{httplimit.ClientIP{IPv6Bits: 128}, "[2001:db8:1:2:3:4:5:6]:1", "ip:2001:db8:1:2:3:4:5:6"},
		{httplimit.ClientIP{IPv6Bits: 999}, "[2001:db8:1:2:3:4:5:6]:1", "ip:2001:db8:1:2:3:4:5:6"},
		{httplimit.ClientIP{}, "[::ffff:198.51.100.7]:1", "ip:198.51.100.7"},
		{httplimit.ClientIP{}, "[fe80::1%eth0]:1", "ip:fe80::/64"},
		{httplimit.ClientIP{}, "pipe", "ip:pipe"},
		{httplimit.ClientIP{}, "", "ip:unknown"},
	}
	for _, tt := range tests {
		got, err := tt.c.Key(request("/", tt.remote))
		if got != tt.want || err != nil {
			t.Errorf("%+v.Key(RemoteAddr %q) = %q, %v, want %q", tt.c, tt.remote, got, err, tt.want)
		}
		// AddrKey keys the address as Key does.
		if a := peerOf(tt.remote); a.IsValid() {
			if got := tt.c.AddrKey(a); got != tt.want {
				t.Errorf("%+v.AddrKey(%v) = %q, want %q", tt.c, a, got, tt.want)
			}
		}
	}
	if got := (httplimit.ClientIP{}).AddrKey(netip.Addr{}); got != "ip:unknown" {
		t.Errorf("AddrKey(zero Addr) = %q, want ip:unknown", got)
	}
	// Two hosts of one /64 share a key; another /64 does not.
	c := httplimit.ClientIP{}
	a, _ := c.Key(request("/", "[2001:db8:1:2::a]:1"))
	b, _ := c.Key(request("/", "[2001:db8:1:2::b]:1"))
	d, _ := c.Key(request("/", "[2001:db8:1:3::a]:1"))
	if a != b || a == d {
		t.Errorf("keys %q, %q, %q: want the first two equal and the third different", a, b, d)
	}
}
