package httplimit

import (
	"net/http"
	"net/netip"
	"strings"
)

// ProxyHeader names the request header in which trusted proxies record the
// address of the client they forward for.
type ProxyHeader uint8

// The proxy headers.
const (
	// XForwardedFor is "X-Forwarded-For: client, proxy1, proxy2": each proxy
	// appends the address of its own peer.
	XForwardedFor ProxyHeader = iota
	// Forwarded is the RFC 7239 header, "Forwarded: for=client,
	// for=proxy1": each proxy appends an element whose for= parameter is its
	// peer.
	Forwarded
)

// String returns the header's name.
func (h ProxyHeader) String() string {
	if h == Forwarded {
		return "Forwarded"
	}
	return "X-Forwarded-For"
}

// ClientIP finds the address of the client of a request, and keys requests
// by it. The zero ClientIP trusts no proxy: the client is the direct peer,
// RemoteAddr, whatever the headers say. It is safe for concurrent use as
// long as it is not modified.
//
// A proxy header is read only when the peer is inside TrustedProxies, and
// then from right to left: each trusted hop is skipped, and the first hop
// outside TrustedProxies is the client, since the hops to its right were
// written by proxies that are trusted to tell the truth and everything to
// its left came from the client and may be forged. When every hop is
// trusted, the leftmost is the client. When the chain cannot be followed
// (a malformed element, "unknown", an obfuscated identifier, an element
// without for=), the peer is the client: a broken header never gives a
// request a key of its own choosing, nor none.
//
// Only one header is read, the one the trusted proxies write: reading the
// other as well would let a client forge it, since a proxy passes on the
// headers it does not write.
type ClientIP struct {
	// TrustedProxies are the networks of the proxies in front of the
	// service (load balancers, CDNs). Addresses are compared after
	// unmapping IPv4-mapped IPv6 addresses, so give IPv4 networks in IPv4
	// form. nil trusts no proxy.
	TrustedProxies []netip.Prefix
	// Header is the header the trusted proxies write. The zero value is
	// XForwardedFor.
	Header ProxyHeader
	// IPv4Bits and IPv6Bits are the leading bits of the client address
	// that Key keeps: the clients of a network share one bucket. 0 means
	// 32 for IPv4 and 64 for IPv6, because a single IPv6 host usually
	// holds a whole /64. Values above the address length mean the
	// address length.
	IPv4Bits, IPv6Bits int
}

// Addr returns the address of the client of r as described on ClientIP,
// without zone and with an IPv4-mapped address unmapped. It is the zero Addr
// only if RemoteAddr is not an IP address (a Unix socket, say).
func (c ClientIP) Addr(r *http.Request) netip.Addr {
	peer := parsePeer(r.RemoteAddr)
	if !peer.IsValid() || !c.trusted(peer) {
		return peer
	}
	return c.follow(peer, r.Header[c.Header.String()])
}

// AddrFrom is Addr for a request that did not come through net/http: peer is
// its direct peer, and lines are the lines of its proxy header (c.Header),
// in the order they came. A gRPC server, say, finds the peer with
// peer.FromContext and the lines in the metadata under the header's name in
// lower case ("x-forwarded-for"). The lines are read only if peer is
// trusted. The result is peer, unmapped and without zone, or an address
// from lines; it is the zero Addr only if peer is.
func (c ClientIP) AddrFrom(peer netip.Addr, lines []string) netip.Addr {
	peer = norm(peer)
	if !peer.IsValid() || !c.trusted(peer) {
		return peer
	}
	return c.follow(peer, lines)
}

// follow walks the proxy header lines of a request from the trusted peer,
// from right to left, as described on ClientIP.
func (c ClientIP) follow(peer netip.Addr, lines []string) netip.Addr {
	client := peer
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		for len(line) > 0 {
			var elem string
			if j := strings.LastIndexByte(line, ','); j >= 0 {
				elem, line = line[j+1:], line[:j]
			} else {
				elem, line = line, ""
			}
			elem = trimOWS(elem)
			if elem == "" {
				continue // an empty list element (RFC 9110, 5.6.1)
			}
			var a netip.Addr
			var ok bool
			if c.Header == Forwarded {
				a, ok = forwardedFor(elem)
			} else {
				a, ok = parseHost(elem)
			}
			if !ok {
				return peer
			}
			if !c.trusted(a) {
				return a
			}
			client = a
		}
	}
	return client
}

// Key returns the key of r's client: "ip:" and the client's address (see
// Addr), or for a shortened prefix the network, such as
// "ip:2001:db8:1:2::/64". A request whose RemoteAddr is not an IP address
// is keyed by "ip:" and RemoteAddr as it is. Key is a KeyFunc; its error is
// always nil.
func (c ClientIP) Key(r *http.Request) (string, error) {
	a := c.Addr(r)
	if !a.IsValid() {
		if r.RemoteAddr == "" {
			return "ip:unknown", nil
		}
		return "ip:" + r.RemoteAddr, nil
	}
	return c.AddrKey(a), nil
}

// AddrKey returns the key of the client address a, as Key does: "ip:" and
// a, or the network of its first IPv4Bits or IPv6Bits bits, such as
// "ip:2001:db8:1:2::/64", after unmapping an IPv4-mapped address and
// dropping a zone. It is "ip:unknown" for the zero Addr. With AddrFrom, it
// keys clients of other protocols as the middleware keys them.
func (c ClientIP) AddrKey(a netip.Addr) string {
	a = norm(a)
	if !a.IsValid() {
		return "ip:unknown"
	}
	bits := c.IPv4Bits
	if a.Is6() {
		bits = c.IPv6Bits
		if bits <= 0 {
			bits = 64
		}
	} else if bits <= 0 {
		bits = 32
	}
	var buf [64]byte
	b := append(buf[:0], "ip:"...)
	if bits >= a.BitLen() {
		b = a.AppendTo(b)
	} else {
		p, _ := a.Prefix(bits) // 0 < bits < BitLen: no error
		b = p.AppendTo(b)
	}
	return string(b)
}

// Trusts reports whether c trusts a as a proxy: whether a, unmapped and
// without zone, is inside TrustedProxies. Only for a peer it trusts does
// AddrFrom read the proxy header's lines, so a caller whose lines cost
// something to find can look for them only then.
func (c ClientIP) Trusts(a netip.Addr) bool {
	return c.trusted(norm(a))
}

// trusted reports whether a is in one of c's trusted networks.
func (c ClientIP) trusted(a netip.Addr) bool {
	for _, p := range c.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// parsePeer parses a RemoteAddr: "host:port" as net/http sets it, or a bare
// address.
func parsePeer(s string) netip.Addr {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return norm(ap.Addr())
	}
	if a, ok := parseHost(s); ok {
		return a
	}
	return netip.Addr{}
}

// parseHost parses one X-Forwarded-For element: an IPv4 or IPv6 address,
// with or without a port, an IPv6 address in brackets with or without.
func parseHost(s string) (netip.Addr, bool) {
	if s == "" || len(s) > maxNode {
		return netip.Addr{}, false
	}
	if s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 || !validPort(s[end+1:]) {
			return netip.Addr{}, false
		}
		a, err := netip.ParseAddr(s[1:end])
		if err != nil || !a.Is6() {
			return netip.Addr{}, false
		}
		return norm(a), true
	}
	if i := strings.IndexByte(s, ':'); i >= 0 && strings.IndexByte(s[i+1:], ':') < 0 {
		// One colon: an IPv4 address and a port.
		if !validPort(s[i:]) {
			return netip.Addr{}, false
		}
		s = s[:i]
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return norm(a), true
}

// maxNode bounds the length of one address in a header, with brackets, zone
// and port: anything longer is malformed.
const maxNode = 100

// validPort reports whether s is empty or a colon followed by a port: digits,
// or an RFC 7239 obfuscated port ("_" and letters, digits, ".", "_", "-").
func validPort(s string) bool {
	if s == "" {
		return true
	}
	if len(s) < 2 || s[0] != ':' {
		return false
	}
	s = s[1:]
	if s[0] == '_' {
		return obfuscated(s)
	}
	if len(s) > 5 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// obfuscated reports whether s is an RFC 7239 obfuscated identifier: "_"
// followed by letters, digits, ".", "_" or "-".
func obfuscated(s string) bool {
	if len(s) < 2 || s[0] != '_' {
		return false
	}
	for i := 1; i < len(s); i++ {
		b := s[i]
		if !('a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '.' || b == '_' || b == '-') {
			return false
		}
	}
	return true
}

// forwardedFor returns the address in the for= parameter of one Forwarded
// element (RFC 7239, section 4): "for=192.0.2.60;proto=http;by=203.0.113.43"
// or `for="[2001:db8:cafe::17]:4711"`. ok is false for a malformed element,
// one with no for= or more than one, and a node that is not an address:
// "unknown" or an obfuscated identifier.
func forwardedFor(elem string) (a netip.Addr, ok bool) {
	var value string
	found := false
	for elem != "" {
		pair, rest, ok := cutPair(elem)
		if !ok {
			return netip.Addr{}, false
		}
		elem = rest
		pair = trimOWS(pair)
		if pair == "" {
			continue
		}
		name, v, hasEq := strings.Cut(pair, "=")
		if !hasEq || !isToken(name) {
			return netip.Addr{}, false
		}
		if !strings.EqualFold(name, "for") {
			continue
		}
		if found {
			return netip.Addr{}, false // a parameter occurs once per element
		}
		found, value = true, v
	}
	if !found {
		return netip.Addr{}, false
	}
	var buf [maxNode]byte
	node, ok := unquote(value, buf[:0])
	if !ok || node == "" || node[0] == '_' || strings.EqualFold(node, "unknown") {
		return netip.Addr{}, false
	}
	return parseHost(node)
}

// cutPair cuts the first forwarded-pair off elem at the first semicolon
// outside a quoted string. ok is false if a quoted string is not closed.
func cutPair(elem string) (pair, rest string, ok bool) {
	quoted := false
	for i := 0; i < len(elem); i++ {
		switch b := elem[i]; {
		case quoted && b == '\\':
			i++ // a quoted-pair
		case b == '"':
			quoted = !quoted
		case !quoted && b == ';':
			return elem[:i], elem[i+1:], true
		}
	}
	if quoted {
		return "", "", false
	}
	return elem, "", true
}

// unquote returns v itself if it may be an unquoted node, or the content of
// v if it is a quoted string, with its quoted-pairs resolved (into buf when there are
// any). ok is false for anything else, or a content longer than buf.
func unquote(v string, buf []byte) (string, bool) {
	if v == "" || v[0] != '"' {
		if !isNode(v) {
			return "", false
		}
		return v, true
	}
	if len(v) < 2 || v[len(v)-1] != '"' {
		return "", false
	}
	v = v[1 : len(v)-1]
	if strings.IndexByte(v, '\\') < 0 {
		if strings.IndexByte(v, '"') >= 0 || !printable(v) {
			return "", false
		}
		return v, true
	}
	for i := 0; i < len(v); i++ {
		b := v[i]
		switch {
		case b == '\\':
			i++
			if i == len(v) {
				return "", false
			}
			b = v[i]
		case b == '"':
			return "", false
		}
		if b < 0x20 && b != '\t' || b == 0x7f || len(buf) == cap(buf) {
			return "", false
		}
		buf = append(buf, b)
	}
	return string(buf), true
}

// printable reports whether s holds only what a quoted string may: visible
// ASCII, space, tab and obs-text.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if b := s[i]; b < 0x20 && b != '\t' || b == 0x7f {
			return false
		}
	}
	return true
}

// isToken reports whether s is an RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tokenByte(s[i]) {
			return false
		}
	}
	return true
}

// isNode reports whether s may be an unquoted node: a token, or with the
// colon and brackets of "host:port" or "[v6]" that some proxies write
// unquoted although RFC 7239 asks for quotes.
func isNode(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if b := s[i]; !tokenByte(b) && b != ':' && b != '[' && b != ']' {
			return false
		}
	}
	return true
}

// tokenByte reports whether b is a tchar of RFC 9110.
func tokenByte(b byte) bool {
	if 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' {
		return true
	}
	switch b {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

// trimOWS trims the optional whitespace of RFC 9110: spaces and tabs.
func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// norm removes a zone and unmaps an IPv4-mapped IPv6 address.
func norm(a netip.Addr) netip.Addr {
	return a.Unmap().WithZone("")
}
