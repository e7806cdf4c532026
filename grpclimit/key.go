package grpclimit

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/hybridlimit/hybrid/httplimit"
)

// KeyFunc returns the key a call is limited by: the name of its bucket.
// ctx is the call's context, from which peer.FromContext and
// metadata.FromIncomingContext read the peer and the metadata; method is
// the full method, "/package.Service/Method". It returns an error wrapping
// ErrNoKey when the call carries nothing to key it by (no API key, no
// user); FirstKey then tries the next KeyFunc, and the interceptor answers
// InvalidArgument. Other errors are answered Internal.
type KeyFunc func(ctx context.Context, method string) (string, error)

// ErrNoKey reports a call that carries nothing a KeyFunc can key it by.
var ErrNoKey = errors.New("grpclimit: no rate-limit key in the call")

// ByMethod returns a KeyFunc that keys a call by its full method: the key
// is "method:" and the method, such as "method:/pkg.Service/Get". Alone,
// it gives each method one bucket for all its callers; Join it with a
// caller's key for a bucket per method and caller.
func ByMethod() KeyFunc {
	return func(_ context.Context, method string) (string, error) {
		return "method:" + method, nil
	}
}

// ByPeer returns a KeyFunc that keys a call by the address of its client,
// found as c finds the client of an HTTP request: the peer of the
// connection (peer.FromContext), or, when c trusts that peer as a proxy,
// the address it forwards in the metadata that carries c.Header in lower
// case ("x-forwarded-for", or "forwarded"), read from right to left. The
// key is that of httplimit.ClientIP.AddrKey, such as "ip:198.51.100.7" or
// "ip:2001:db8:1:2::/64". A peer that is not an IP address (a Unix socket,
// an in-memory connection) is keyed by "ip:" and its address as it is, and
// a call with no peer by "ip:unknown". nil c means &httplimit.ClientIP{}:
// trust no proxy. c is copied: changing it later changes nothing. The
// KeyFunc never returns an error.
func ByPeer(c *httplimit.ClientIP) KeyFunc {
	var ci httplimit.ClientIP
	if c != nil {
		ci = *c
		ci.TrustedProxies = append([]netip.Prefix(nil), c.TrustedProxies...)
	}
	name := strings.ToLower(ci.Header.String())
	return func(ctx context.Context, _ string) (string, error) {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return "ip:unknown", nil
		}
		a := addrOf(p.Addr)
		if !a.IsValid() {
			return "ip:" + p.Addr.String(), nil
		}
		if ci.Trusts(a) {
			a = ci.AddrFrom(a, metadata.ValueFromIncomingContext(ctx, name))
		}
		return ci.AddrKey(a), nil
	}
}

// addrOf returns the IP address of a peer's net.Addr, or the zero Addr if
// it has none.
func addrOf(addr net.Addr) netip.Addr {
	switch a := addr.(type) {
	case *net.TCPAddr:
		return a.AddrPort().Addr()
	case *net.UDPAddr:
		return a.AddrPort().Addr()
	}
	s := addr.String()
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr()
	}
	a, _ := netip.ParseAddr(s)
	return a
}

// ByMetadata returns a KeyFunc that keys a call by the first value of the
// metadata key name (an API key, a tenant), matched in any case: the key
// is name in lower case, a colon and the value, such as "x-api-key:abc". A
// call without the metadata, or with an empty value, has no key (ErrNoKey).
// The value is used as it is; a long one is hashed (httplimit.BucketKey).
func ByMetadata(name string) KeyFunc {
	name = strings.ToLower(name)
	prefix := name + ":"
	return func(ctx context.Context, _ string) (string, error) {
		vs := metadata.ValueFromIncomingContext(ctx, name)
		if len(vs) == 0 || vs[0] == "" {
			return "", ErrNoKey
		}
		return prefix + vs[0], nil
	}
}

// FirstKey returns a KeyFunc that tries each of keys in turn and returns the
// first key found: the first result whose error is not ErrNoKey. For
// example, FirstKey(ByMetadata("x-api-key"), ByPeer(nil)) keys a client by
// its API key, else by its address. It has no key only if none has.
func FirstKey(keys ...KeyFunc) KeyFunc {
	keys = append([]KeyFunc(nil), keys...)
	return func(ctx context.Context, method string) (string, error) {
		for _, k := range keys {
			key, err := k(ctx, method)
			if err == nil && key != "" {
				return key, nil
			}
			if err != nil && !errors.Is(err, ErrNoKey) && !errors.Is(err, httplimit.ErrNoKey) {
				return "", err
			}
		}
		return "", ErrNoKey
	}
}

// Join returns a KeyFunc whose key is the keys of keys, in order, joined by
// "|": Join(ByMethod(), ByPeer(nil)) gives each client a bucket per method,
// keyed like "method:/pkg.Service/Get|ip:198.51.100.7". A "|" or a
// backslash in a key is escaped with a backslash, so that values a client
// chooses cannot make two different lists of keys join alike. The call has
// no key if one of keys finds none, or if keys is empty; the first error is
// returned.
func Join(keys ...KeyFunc) KeyFunc {
	keys = append([]KeyFunc(nil), keys...)
	return func(ctx context.Context, method string) (string, error) {
		var arr [128]byte
		b := arr[:0]
		for i, k := range keys {
			key, err := k(ctx, method)
			if err != nil {
				return "", err
			}
			if key == "" {
				return "", ErrNoKey
			}
			if i > 0 {
				b = append(b, '|')
			}
			if strings.ContainsAny(key, "|\\") {
				for j := 0; j < len(key); j++ {
					if key[j] == '|' || key[j] == '\\' {
						b = append(b, '\\')
					}
					b = append(b, key[j])
				}
			} else {
				b = append(b, key...)
			}
		}
		if len(b) == 0 {
			return "", ErrNoKey
		}
		return string(b), nil
	}
}
