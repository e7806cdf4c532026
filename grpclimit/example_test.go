package grpclimit_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/grpclimit"
	"github.com/hybridlimit/hybrid/httplimit"
	"github.com/hybridlimit/hybrid/policy"
)

// exampleLimiter returns a Limiter on an in-process Redis, which stands in
// for a real one in these examples, and a func that stops both.
func exampleLimiter() (*hybrid.Limiter, func()) {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	// Generous call timeouts: on a busy machine, an in-process Redis may
	// answer later than a real one does.
	lim, err := hybrid.New(rdb, hybrid.Config{Breaker: breaker.Config{CallTimeout: 10 * time.Second}})
	if err != nil {
		panic(err)
	}
	return lim, func() {
		lim.Close(context.Background())
		rdb.Close()
		m.Close()
	}
}

// serveHealth serves the health service with srv on an in-memory listener
// and returns a client of it, dialled with opts, and a func that stops
// both.
func serveHealth(srv *grpc.Server, opts ...grpc.DialOption) (healthpb.HealthClient, func()) {
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis := bufconn.Listen(1 << 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(lis)
	}()
	dial := func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }
	opts = append(opts, grpc.WithContextDialer(dial), grpc.WithTransportCredentials(insecure.NewCredentials()))
	conn, err := grpc.NewClient("passthrough:///bufconn", opts...)
	if err != nil {
		panic(err)
	}
	return healthpb.NewHealthClient(conn), func() {
		conn.Close()
		srv.Stop()
		<-done
	}
}

func Example() {
	lim, stop := exampleLimiter()
	defer stop()

	// Two calls at once, then one a minute, per client and method.
	rl, err := grpclimit.New(lim, grpclimit.Config{
		Name:  "per-client",
		Key:   grpclimit.Join(grpclimit.ByMethod(), grpclimit.ByPeer(nil)),
		Limit: hybrid.Limit{Rate: 1.0 / 60, Burst: 2},
	})
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(rl.Unary()), grpc.ChainStreamInterceptor(rl.Stream()))
	client, stopServer := serveHealth(srv)
	defer stopServer()

	for range 3 {
		var header metadata.MD
		_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.Header(&header))
		fmt.Println(status.Code(err), header.Get("ratelimit-policy"), header.Get("ratelimit"))
		for _, d := range status.Convert(err).Details() {
			switch d := d.(type) {
			case *errdetails.RetryInfo:
				fmt.Println("retry in", d.GetRetryDelay().AsDuration().Round(time.Second))
			case *errdetails.QuotaFailure:
				fmt.Println("quota:", d.GetViolations()[0].GetSubject())
			}
		}
	}
	fmt.Printf("%+v\n", rl.Stats())
	// Output:
	// OK ["per-client";q=2;w=120] ["per-client";r=1;t=60]
	// OK ["per-client";q=2;w=120] ["per-client";r=0;t=120]
	// ResourceExhausted ["per-client";q=2;w=120] ["per-client";r=0;t=60]
	// retry in 1m0s
	// quota: per-client
	// {Allowed:2 Denied:1 ShadowDenied:0 Errors:0 Exempt:0 Waited:0}
}

func ExampleRetry() {
	lim, stop := exampleLimiter()
	defer stop()

	// The server admits 10 calls a second, one at a time.
	rl, err := grpclimit.New(lim, grpclimit.Config{Limit: hybrid.Limit{Rate: 10, Burst: 1}})
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(rl.Unary()))

	// The client waits for the delay a denial asks for (up to 100ms here),
	// up to a second, and calls again, up to three times in all: the
	// second call, denied at first, passes.
	retry := grpclimit.Retry{MaxAttempts: 3, MaxDelay: time.Second}
	client, stopServer := serveHealth(srv, grpc.WithChainUnaryInterceptor(retry.Unary()))
	defer stopServer()

	for range 2 {
		resp, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
		fmt.Println(resp.GetStatus(), err)
	}
	// Output:
	// SERVING <nil>
	// SERVING <nil>
}

func ExampleHTTPChecks() {
	lim, stop := exampleLimiter()
	defer stop()

	// Rules in the format of package policy: a gRPC call is a POST to
	// /package.Service/Method, so routes match methods, and header tiers
	// read the metadata.
	rules, err := policy.Load(strings.NewReader(`{
  "default_plan": "free",
  "plans": [{"name": "free", "rules": [
    {"name": "checks", "tier": "header:X-Tenant-ID", "route": "POST /grpc.health.v1.Health/Check", "rate": "1/min", "burst": 1},
    {"name": "per-tenant", "tier": "header:X-Tenant-ID", "rate": "100/min", "burst": 100}
  ]}]
}`))
	if err != nil {
		panic(err)
	}
	rl, err := grpclimit.New(lim, grpclimit.Config{
		Checks: grpclimit.HTTPChecks(rules.ChecksFunc(func(r *http.Request) (policy.Identity, error) {
			return policy.Identity{}, nil // a real service names the caller's plan and user
		})),
	})
	if err != nil {
		panic(err)
	}
	client, stopServer := serveHealth(grpc.NewServer(grpc.ChainUnaryInterceptor(rl.Unary())))
	defer stopServer()

	for _, tenant := range []string{"acme", "acme", "initech"} {
		ctx := metadata.AppendToOutgoingContext(context.Background(), "x-tenant-id", tenant)
		var header metadata.MD
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
		fmt.Println(tenant, status.Code(err), header.Get("ratelimit"))
	}
	// Output:
	// acme OK ["checks";r=0;t=60, "per-tenant";r=99;t=1]
	// acme ResourceExhausted ["checks";r=0;t=60]
	// initech OK ["checks";r=0;t=60, "per-tenant";r=99;t=1]
}

func ExampleByPeer() {
	// The service runs behind a load balancer in 10.0.0.0/8 that sends the
	// client's address in the x-forwarded-for metadata.
	key := grpclimit.ByPeer(&httplimit.ClientIP{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
	})
	for _, from := range []string{"10.0.0.1:4711", "203.0.113.9:4711"} {
		// The context of a call as the server sees it: the peer, and the
		// metadata, whose first element the client forged.
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: net.TCPAddrFromAddrPort(netip.MustParseAddrPort(from))})
		ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("x-forwarded-for", "192.0.2.1, 198.51.100.7"))
		k, _ := key(ctx, "/grpc.health.v1.Health/Check")
		fmt.Println(from, "->", k)
	}
	// Output:
	// 10.0.0.1:4711 -> ip:198.51.100.7
	// 203.0.113.9:4711 -> ip:203.0.113.9
}
