package grpclimit

import (
	"context"
	"net/http"
	"net/url"
	"strings"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/hybridlimit/hybrid"
)

// HTTPChecks adapts f, a function that returns the checks of an HTTP
// request, to Config.Checks: each call is handed to f as the HTTP/2 request
// it travels as (gRPC over HTTP/2), built for the purpose:
//
//   - Method is POST, and URL.Path and RequestURI are the full method,
//     "/package.Service/Method";
//   - Host is the call's :authority;
//   - Header holds the call's metadata, with keys in canonical form
//     ("x-tenant-id" is "X-Tenant-Id") and values as gRPC decoded them (so
//     the values of "-bin" keys are binary, not base64), but for the
//     pseudo-headers;
//   - RemoteAddr is the address of the peer (peer.FromContext) as its
//     String method gives it, "198.51.100.7:4711" over TCP;
//   - Proto is "HTTP/2.0", Body is http.NoBody, and Context returns the
//     call's context.
//
// So the rules of package policy apply to gRPC calls as they are:
//
//	Checks: grpclimit.HTTPChecks(rules.ChecksFunc(identify))
//
// with route patterns such as "POST /pkg.Service/Method" (one method) or
// "/pkg.Service/" (the service's methods that no more specific pattern
// matches: as for HTTP, a call matches the most specific pattern only, and
// the rules without a route), header tiers that read metadata, and an
// identify function that may find the client's address with
// httplimit.ClientIP.Addr, which reads X-Forwarded-For from the metadata of
// a trusted peer. The request is built anew for each call (a Request, its
// URL and its Header: a few allocations, the metadata's copy included); f
// may keep it.
func HTTPChecks(f func(r *http.Request) ([]hybrid.Check, error)) func(ctx context.Context, method string) ([]hybrid.Check, error) {
	return func(ctx context.Context, method string) ([]hybrid.Check, error) {
		return f(httpRequest(ctx, method))
	}
}

// httpRequest returns the call of method with context ctx as an HTTP/2
// request, as HTTPChecks describes it.
func httpRequest(ctx context.Context, method string) *http.Request {
	md, _ := metadata.FromIncomingContext(ctx) // a copy, ours to keep
	h := make(http.Header, len(md))
	host := ""
	for k, vs := range md {
		if strings.HasPrefix(k, ":") {
			if k == ":authority" && len(vs) > 0 {
				host = vs[0]
			}
			continue
		}
		h[http.CanonicalHeaderKey(k)] = vs
	}
	remote := ""
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		remote = p.Addr.String()
	}
	r := &http.Request{
		Method:     http.MethodPost,
		URL:        &url.URL{Path: method},
		Proto:      "HTTP/2.0",
		ProtoMajor: 2,
		Header:     h,
		Body:       http.NoBody,
		Host:       host,
		RemoteAddr: remote,
		RequestURI: method,
	}
	return r.WithContext(ctx)
}
