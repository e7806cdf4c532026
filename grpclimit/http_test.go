package grpclimit_test

import (
	"context"
	"net/http"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/grpclimit"
	"github.com/hybridlimit/hybrid/httplimit"
	"github.com/hybridlimit/hybrid/policy"
)

// TestHTTPChecks: the request HTTPChecks hands its function: a POST of the
// method's path to the :authority, with the metadata as header but for
// the pseudo-headers, the peer as RemoteAddr and the call's context.
func TestHTTPChecks(t *testing.T) {
	ctx := callCtx(tcpAddr(client), ":authority", "api.example.com", "x-tenant-id", "acme", "x-tenant-id", "beta", "trace-bin", "\x00\x01")
	var r *http.Request
	checks := grpclimit.HTTPChecks(func(req *http.Request) ([]hybrid.Check, error) {
		r = req
		return []hybrid.Check{{Key: "k"}}, nil
	})
	cs, err := checks(ctx, "/pkg.Service/Get")
	if err != nil || len(cs) != 1 || cs[0].Key != "k" {
		t.Fatalf("checks = %v, %v; want the function's", cs, err)
	}
	if r.Method != "POST" || r.URL.Path != "/pkg.Service/Get" || r.RequestURI != "/pkg.Service/Get" || r.Host != "api.example.com" ||
		r.RemoteAddr != client || r.ProtoMajor != 2 || r.Context() != ctx || r.Body != http.NoBody {
		t.Errorf("request %s %s %q, Host %q, RemoteAddr %q, HTTP/%d, same context %v",
			r.Method, r.URL.Path, r.RequestURI, r.Host, r.RemoteAddr, r.ProtoMajor, r.Context() == ctx)
	}
	want := http.Header{"X-Tenant-Id": {"acme", "beta"}, "Trace-Bin": {"\x00\x01"}}
	if !reflect.DeepEqual(r.Header, want) {
		t.Errorf("Header %v, want %v", r.Header, want)
	}
	// httplimit.ClientIP reads the request as it reads any other.
	if got := (httplimit.ClientIP{}).Addr(r); got != netip.MustParseAddr("198.51.100.7") {
		t.Errorf("ClientIP.Addr = %v, want 198.51.100.7", got)
	}
}

// rules are policy rules for the health service: a bucket per tenant for
// every call, Check per client address, the service's other methods per
// client address, and a rule for GET that a gRPC call never matches. As for
// HTTP requests, a call matches the most specific route only.
const rules = `{
  "default_plan": "free",
  "plans": [{"name": "free", "rules": [
    {"name": "per-tenant", "tier": "header:X-Tenant-ID", "rate": "1/h", "burst": 3},
    {"name": "checks", "tier": "ip", "route": "POST /grpc.health.v1.Health/Check", "rate": "1/h", "burst": 2},
    {"name": "service", "tier": "ip", "route": "/grpc.health.v1.Health/", "rate": "1/h", "burst": 5},
    {"name": "gets", "tier": "ip", "route": "GET /grpc.health.v1.Health/Check", "rate": "1/h", "burst": 1}
  ]}]
}`

// TestPolicy: the rules of package policy, through HTTPChecks, on calls
// through a real server behind a trusted proxy: route patterns match the
// method's path (a POST), header tiers read the metadata, and the identify
// function finds the client's address with httplimit.ClientIP.
func TestPolicy(t *testing.T) {
	rs, err := policy.Load(strings.NewReader(rules))
	if err != nil {
		t.Fatal(err)
	}
	clientIP := httplimit.ClientIP{TrustedProxies: proxies}
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		ic := newInterceptor(t, lim, grpclimit.Config{
			Checks: grpclimit.HTTPChecks(rs.ChecksFunc(func(r *http.Request) (policy.Identity, error) {
				return policy.Identity{IP: clientIP.Addr(r).String()}, nil
			})),
		})
		s := serve(t, ic, options{peer: tcpAddr("10.0.0.1:5000")})
		const xff = "x-forwarded-for"
		steps := []struct {
			stream bool
			md     []string
			code   codes.Code
			tiers  []string // in ratelimit-policy
			denier string
		}{
			{false, []string{xff, "198.51.100.7", "x-tenant-id", "acme"}, codes.OK, []string{"checks", "per-tenant"}, ""},
			{true, []string{xff, "198.51.100.7", "x-tenant-id", "acme"}, codes.OK, []string{"service", "per-tenant"}, ""},
			{false, []string{xff, "198.51.100.7"}, codes.OK, []string{"checks"}, ""},
			{false, []string{xff, "198.51.100.7", "x-tenant-id", "beta"}, codes.ResourceExhausted, []string{"checks", "per-tenant"}, "checks"},
			{false, []string{xff, "198.51.100.8", "x-tenant-id", "acme"}, codes.OK, []string{"checks", "per-tenant"}, ""},
			{true, []string{xff, "198.51.100.8", "x-tenant-id", "acme"}, codes.ResourceExhausted, []string{"service", "per-tenant"}, "per-tenant"},
		}
		for i, st := range steps {
			var header map[string][]string
			var err error
			if st.stream {
				header, err = s.watch(t, st.md...)
			} else {
				header, _, err = s.check(context.Background(), st.md...)
			}
			if status.Code(err) != st.code {
				t.Fatalf("step %d: %v, want %v", i, err, st.code)
			}
			policy, _ := limits(t, header)
			var tiers []string
			for _, it := range policy {
				tiers = append(tiers, it.name)
			}
			if !reflect.DeepEqual(tiers, st.tiers) {
				t.Errorf("step %d: ratelimit-policy tiers %q, want %q", i, tiers, st.tiers)
			}
			if st.denier != "" {
				if _, qf := details(t, err); qf.GetViolations()[0].GetSubject() != st.denier {
					t.Errorf("step %d: denied by %v, want %s", i, qf.GetViolations()[0], st.denier)
				}
			}
		}
	})
}
