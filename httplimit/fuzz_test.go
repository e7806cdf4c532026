package httplimit_test

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/hybridlimit/hybrid/httplimit"
)

// FuzzClientIP: whatever the peer and the proxy header lines, Addr does not
// panic, ignores the headers of an untrusted peer, and otherwise returns the
// peer or an address that appears in the headers (once the backslashes of
// quoted-pairs are removed); Key never fails and is never empty. The seed
// corpus is in testdata/fuzz/FuzzClientIP.
func FuzzClientIP(f *testing.F) {
	f.Add("10.0.0.1:5000", "198.51.100.7, 10.0.0.2", "", false)
	f.Add("203.0.113.9:1", "198.51.100.7", "", false)
	f.Add("10.0.0.1:5000", "for=198.51.100.7;proto=https", "for=10.0.0.2", true)
	f.Add("[2001:db8:ffff::1]:443", `for="[2001:db8:cafe::17]:4711"`, "", true)
	f.Add("10.0.0.1:5000", `for="6.6.6.6, for=7.7.7.7", for=_hidden`, "", true)
	f.Add("10.0.0.1:5000", "::ffff:198.51.100.7, fe80::1%eth0", "garbage", false)
	f.Fuzz(func(t *testing.T, remote, line1, line2 string, forwarded bool) {
		c := httplimit.ClientIP{TrustedProxies: proxies}
		name := "X-Forwarded-For"
		if forwarded {
			c.Header = httplimit.Forwarded
			name = "Forwarded"
		}
		r := &http.Request{RemoteAddr: remote, Header: http.Header{name: {line1, line2}}}
		got := c.Addr(r)
		peer := c.Addr(&http.Request{RemoteAddr: remote})
		if !peer.IsValid() || !trusted(peer) {
			if got != peer {
				t.Fatalf("untrusted peer %q: Addr = %v, want the peer %v", remote, got, peer)
			}
		} else if got != peer && !inHeader(got, strings.ReplaceAll(line1+","+line2, `\`, "")) {
			t.Fatalf("Addr(%q, %q, %q) = %v: neither the peer %v nor in the header", remote, line1, line2, got, peer)
		}
		if key, err := c.Key(r); key == "" || err != nil {
			t.Fatalf("Key = %q, %v", key, err)
		}
	})
}

// trusted reports whether a is in proxies.
func trusted(a netip.Addr) bool {
	for _, p := range proxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// inHeader reports whether a appears in s: as one of its runs of the bytes
// that may spell an address, a zone or a port, parsed as an address or an
// address and a port, unmapped and without zone.
func inHeader(a netip.Addr, s string) bool {
	isAddrByte := func(b byte) bool {
		return '0' <= b && b <= '9' || 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || b == ':' || b == '.' || b == '%' || b == '_' || b == '-'
	}
	for i := 0; i < len(s); {
		if !isAddrByte(s[i]) {
			i++
			continue
		}
		j := i
		for j < len(s) && isAddrByte(s[j]) {
			j++
		}
		run := s[i:j]
		i = j
		// A run may be the address alone, the address and a port, an
		// IPv6 address whose port follows a bracket (a separate run), or
		// an address and a zone of other bytes than a run's ("::%!"),
		// which ends the run but not the element: the zone is dropped.
		cands := []string{run, trimPort(run)}
		if k := strings.IndexByte(run, '%'); k >= 0 {
			cands = append(cands, run[:k])
		}
		for _, cand := range cands {
			if b, err := netip.ParseAddr(cand); err == nil && b.Unmap().WithZone("") == a {
				return true
			}
		}
	}
	return false
}

// trimPort removes a ":port" after an IPv4 address.
func trimPort(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] == ':' {
			return s[:i]
		}
	}
	return s
}
