package grpclimit_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/grpclimit"
)

// warmup is the number of calls a benchmark makes before it measures: the
// first call fetches a lease, and the lease grows with the rate at which
// the key is used.
const warmup = 20_000

// huge is a limit that never denies within a benchmark.
var huge = hybrid.Limit{Rate: 1e9, Burst: 1e9}

// deniedOrFail returns 1 for a denial, and fails b for any other error. A
// Limiter may deny a call now and then even under a limit this large: the
// benchmarks report how often (denied/op) rather than fail.
func deniedOrFail(b *testing.B, err error) int {
	if status.Code(err) != codes.ResourceExhausted {
		b.Fatal(err)
	}
	return 1
}

// BenchmarkUnary: one allowed unary call (the health service's Check) over
// bufconn, client and server in this process, with no interceptor and
// through the Interceptor, for a key whose lease this instance holds.
func BenchmarkUnary(b *testing.B) {
	lim := newLimiter(b)
	three := []hybrid.Check{
		{Tier: "plan", Key: "plan:acme", Limit: huge},
		{Tier: "user", Key: "user:42", Limit: huge},
		{Tier: "method", Key: "method:/grpc.health.v1.Health/Check", Limit: huge},
	}
	cases := []struct {
		name string
		cfg  *grpclimit.Config // nil: no interceptor
	}{
		{"no interceptor", nil},
		{"peer, metadata", &grpclimit.Config{Name: "a", Limit: huge}},
		{"peer, no metadata", &grpclimit.Config{Name: "b", Limit: huge, NoHeaders: true}},
		{"method and peer, metadata", &grpclimit.Config{Name: "c", Limit: huge, Key: grpclimit.Join(grpclimit.ByMethod(), grpclimit.ByPeer(nil))}},
		{"3 tiers, metadata", &grpclimit.Config{Checks: func(context.Context, string) ([]hybrid.Check, error) { return three, nil }}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var ic *grpclimit.Interceptor
			if c.cfg != nil {
				ic = newInterceptor(b, lim, *c.cfg)
			}
			s := serve(b, ic, options{peer: tcpAddr(client)})
			ctx := context.Background()
			req := &healthpb.HealthCheckRequest{}
			for range warmup {
				if _, err := s.health.Check(ctx, req); err != nil {
					deniedOrFail(b, err)
				}
			}
			b.ReportAllocs()
			var denied int
			for b.Loop() {
				if _, err := s.health.Check(ctx, req); err != nil {
					denied += deniedOrFail(b, err)
				}
			}
			b.ReportMetric(float64(denied)/float64(b.N), "denied/op")
		})
	}
}

// transportStream is a grpc.ServerTransportStream that keeps the header
// metadata set on it, as a server's does, and nothing else.
type transportStream struct{ header metadata.MD }

func (s *transportStream) Method() string { return "/grpc.health.v1.Health/Check" }
func (s *transportStream) SetHeader(md metadata.MD) error {
	s.header = metadata.Join(s.header, md)
	return nil
}
func (s *transportStream) SendHeader(md metadata.MD) error { return s.SetHeader(md) }
func (s *transportStream) SetTrailer(metadata.MD) error    { return nil }

// BenchmarkInterceptor: the unary interceptor alone, called as a server
// calls it, for an allowed call whose key this instance holds a lease for:
// what the interceptor costs, without gRPC's own work for the call.
func BenchmarkInterceptor(b *testing.B) {
	lim := newLimiter(b)
	cases := []struct {
		name string
		cfg  grpclimit.Config
	}{
		{"peer, metadata", grpclimit.Config{Name: "a", Limit: huge}},
		{"peer, no metadata", grpclimit.Config{Name: "b", Limit: huge, NoHeaders: true}},
		{"method and peer, metadata", grpclimit.Config{Name: "c", Limit: huge, Key: grpclimit.Join(grpclimit.ByMethod(), grpclimit.ByPeer(nil))}},
		{"API key, metadata", grpclimit.Config{Name: "d", Limit: huge, Key: grpclimit.ByMetadata("x-api-key")}},
	}
	info := &grpc.UnaryServerInfo{FullMethod: "/grpc.health.v1.Health/Check"}
	handler := func(context.Context, any) (any, error) { return nil, nil }
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			unary := newInterceptor(b, lim, c.cfg).Unary()
			ts := &transportStream{}
			ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: tcpAddr(client)})
			ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("x-api-key", "k-0123456789"))
			ctx = grpc.NewContextWithServerTransportStream(ctx, ts)
			for range warmup {
				ts.header = nil
				if _, err := unary(ctx, nil, info, handler); err != nil {
					deniedOrFail(b, err)
				}
			}
			b.ReportAllocs()
			var denied int
			for b.Loop() {
				ts.header = nil
				if _, err := unary(ctx, nil, info, handler); err != nil {
					denied += deniedOrFail(b, err)
				}
			}
			b.ReportMetric(float64(denied)/float64(b.N), "denied/op")
		})
	}
}
