package grpclimit_test

import (
	"context"
	"net"
	"net/netip"
	"reflect"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/grpclimit"
	"github.com/hybridlimit/hybrid/httplimit"
)

// serveTCP starts a server with ic in front of the health service on a
// free loopback port, and returns it with a client connected over TCP;
// both stop when t ends.
func serveTCP(t *testing.T, ic *grpclimit.Interceptor) *server {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := start(t, lis, ic)
	s.connect(t, lis.Addr().String())
	return s
}

// TestTCP: unary calls and streams over loopback TCP, in real time, with
// limits that do not refill meanwhile: the peer's address keys them, and
// the metadata and the details arrive as over bufconn. A client of an
// untrusted peer cannot escape its bucket with x-forwarded-for; behind a
// trusted one (loopback, here), each forwarded client has its own.
func TestTCP(t *testing.T) {
	lim := newLimiter(t)
	two := hybrid.Limit{Rate: slow, Burst: 2}

	t.Run("untrusted", func(t *testing.T) {
		var keys []string
		ic := newInterceptor(t, lim, grpclimit.Config{
			Name:     "tcp-untrusted",
			Limit:    two,
			OnDenied: func(_ context.Context, d grpclimit.Denial) { keys = append(keys, d.Key) },
		})
		s := serveTCP(t, ic)
		header, _, err := s.check(context.Background(), "x-forwarded-for", "198.51.100.7")
		if err != nil {
			t.Fatal(err)
		}
		policy, rl := limits(t, header)
		if want := []item{{"tcp-untrusted", map[string]int64{"q": 2, "w": 2000}}}; !reflect.DeepEqual(policy, want) {
			t.Errorf("ratelimit-policy %v, want %v", policy, want)
		}
		if want := []item{{"tcp-untrusted", map[string]int64{"r": 1, "t": 1000}}}; !reflect.DeepEqual(rl, want) {
			t.Errorf("ratelimit %v, want %v", rl, want)
		}
		if _, err := s.watch(t, "x-forwarded-for", "198.51.100.8"); err != nil {
			t.Fatal(err)
		}
		header, trailer, err := s.check(context.Background(), "x-forwarded-for", "198.51.100.9")
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("third call: %v, want ResourceExhausted", err)
		}
		if _, rl := limits(t, header); len(rl) != 1 || rl[0].params["r"] != 0 {
			t.Errorf("denied call: ratelimit %v, want r=0", rl)
		}
		if ri, qf := details(t, err); ri.GetRetryDelay().AsDuration() <= 0 || qf.GetViolations()[0].GetSubject() != "tcp-untrusted" {
			t.Errorf("details %v, %v", ri, qf)
		}
		if len(trailer.Get("grpc-retry-pushback-ms")) != 1 {
			t.Errorf("trailer %v: no pushback", trailer)
		}
		if header, err := s.watch(t); status.Code(err) != codes.ResourceExhausted || len(header.Get("ratelimit")) != 1 {
			t.Errorf("denied Watch: %v, header %v; want ResourceExhausted with the metadata", err, header)
		}
		if want := []string{"tcp-untrusted:ip:127.0.0.1", "tcp-untrusted:ip:127.0.0.1"}; !reflect.DeepEqual(keys, want) {
			t.Errorf("denied keys %q, want %q", keys, want)
		}
	})

	t.Run("trusted", func(t *testing.T) {
		ic := newInterceptor(t, lim, grpclimit.Config{
			Name:  "tcp-trusted",
			Key:   grpclimit.ByPeer(&httplimit.ClientIP{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}),
			Limit: two,
		})
		s := serveTCP(t, ic)
		for i, st := range []struct {
			xff  string
			code codes.Code
		}{
			{"198.51.100.7", codes.OK},
			{"198.51.100.7", codes.OK},
			{"198.51.100.7", codes.ResourceExhausted},
			{"198.51.100.8", codes.OK},
			{"", codes.OK}, // the proxy itself
		} {
			var md []string
			if st.xff != "" {
				md = []string{"x-forwarded-for", st.xff}
			}
			if _, _, err := s.check(context.Background(), md...); status.Code(err) != st.code {
				t.Errorf("step %d, x-forwarded-for %q: %v, want %v", i, st.xff, err, st.code)
			}
		}
	})
}
