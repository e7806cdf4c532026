package rls_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/alicebob/miniredis/v2"
	extpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/envoyrls/config"
	"github.com/hybridlimit/hybrid/envoyrls/rls"
)

func Example() {
	// An in-process Redis stands in for a real one.
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	defer rdb.Close()
	// Generous call timeouts: on a busy machine, an in-process Redis may
	// answer later than a real one does.
	lim, err := hybrid.New(rdb, hybrid.Config{Breaker: breaker.Config{CallTimeout: 10 * time.Second}})
	if err != nil {
		panic(err)
	}
	defer lim.Close(context.Background())

	// The original's configuration, as it reads it, and the mode field of
	// this project's own.
	loaded, err := config.Load([]config.File{{Name: "messaging.yaml", Data: []byte(`
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 2
          mode: exact # a strict, slow limit: Redis decides every request
`)}}, config.Options{})
	if err != nil {
		panic(err)
	}
	rules := rls.NewRules(loaded) // rules.Store(reloaded) swaps it while serving
	srv, err := rls.New(lim, rules.Load, rls.Config{})
	if err != nil {
		panic(err)
	}

	g := grpc.NewServer()
	srv.RegisterAll(g) // the rate limit service, health and reflection
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go g.Serve(lis)
	defer g.Stop()

	// What Envoy sends for a marketing message to one number.
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := rlspb.NewRateLimitServiceClient(conn)
	req := &rlspb.RateLimitRequest{
		Domain: "messaging",
		Descriptors: []*extpb.RateLimitDescriptor{{Entries: []*extpb.RateLimitDescriptor_Entry{
			{Key: "message_type", Value: "marketing"},
			{Key: "to_number", Value: "2061111111"},
		}}},
	}
	for range 3 {
		resp, err := client.ShouldRateLimit(context.Background(), req)
		if err != nil {
			panic(err)
		}
		s := resp.GetStatuses()[0]
		fmt.Printf("%v: %d of %d per %v left, full again in %v\n", resp.GetOverallCode(),
			s.GetLimitRemaining(), s.GetCurrentLimit().GetRequestsPerUnit(), s.GetCurrentLimit().GetUnit(),
			s.GetDurationUntilReset().AsDuration().Round(time.Hour))
	}
	// Output:
	// OK: 1 of 2 per DAY left, full again in 12h0m0s
	// OK: 0 of 2 per DAY left, full again in 24h0m0s
	// OVER_LIMIT: 0 of 2 per DAY left, full again in 24h0m0s
}
