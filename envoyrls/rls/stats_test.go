package rls_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	extpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"github.com/hybridlimit/hybrid/envoyrls/rls"
)

// TestHits checks the stats of a descriptor as the original counts them,
// with requests of several hits: those within the limit, those near it
// (past NearLimitRatio of it), and those over it, in part when a request
// crosses it.
func TestHits(t *testing.T) {
	for _, tt := range []struct {
		name  string
		ratio float64
		steps []uint32 // the hits of each request
		want  rls.Hits
	}{
		// 10 an hour, near from 8: 7 within; 5 refused, 2 of them past
		// the limit, 2 near it; 3 within, 2 near; 1 over.
		{"default ratio", 0, []uint32{7, 5, 3, 1}, rls.Hits{Total: 16, WithinLimit: 10, NearLimit: 4, OverLimit: 3}},
		// Near from 5: 7 within, 2 near.
		{"ratio 0.5", 0.5, []uint32{7}, rls.Hits{Total: 7, WithinLimit: 7, NearLimit: 2}},
		// Near from 10: never near while within.
		{"ratio 1", 1, []uint32{10, 1}, rls.Hits{Total: 11, WithinLimit: 10, OverLimit: 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var counters rls.Counters
			srv := newServer(t, newLimiter(t), rls.NewRules(load(t, anotherYAML)), rls.Config{Mode: exactly, NearLimitRatio: tt.ratio, Observer: &counters})
			c := serve(t, srv)
			for _, h := range tt.steps {
				call(t, c, &rlspb.RateLimitRequest{Domain: "another", Descriptors: []*extpb.RateLimitDescriptor{desc("key3", "x")}, HitsAddend: h})
			}
			if got := counters.Get("another.key3"); got != tt.want {
				t.Errorf("another.key3: %+v, want %+v", got, tt.want)
			}
			n := 0
			counters.Range(func(string, rls.Hits) bool { n++; return true })
			if n != 1 {
				t.Errorf("Range: %d keys, want 1", n)
			}
			if st := srv.Stats(); st.Requests != uint64(len(tt.steps)) {
				t.Errorf("Stats().Requests = %d, want %d", st.Requests, len(tt.steps))
			}
		})
	}
}

// TestHeaders checks the original's rate-limit headers (Config.Headers):
// those of the descriptor with the fewest remaining, or of the one over its
// limit.
func TestHeaders(t *testing.T) {
	defaults := serve(t, newServer(t, newLimiter(t), rls.NewRules(load(t, anotherYAML)), rls.Config{Mode: exactly, Headers: &rls.Headers{}}))
	named := serve(t, newServer(t, newLimiter(t), rls.NewRules(load(t, anotherYAML)), rls.Config{Mode: exactly, Headers: &rls.Headers{Limit: "X-Limit", Remaining: "X-Remaining", Reset: "X-Reset"}}))
	// key4 (20 a day) is left with 5.
	call(t, defaults, req("another", hits(desc("key4", "h"), 15)))
	for i, step := range []struct {
		c    rlspb.RateLimitServiceClient
		r    *rlspb.RateLimitRequest
		want []string // name, value; name, value; name, reset in seconds
	}{
		{defaults, req("another", desc("key2", "h"), desc("key3", "h")),
			[]string{"RateLimit-Limit", "10", "RateLimit-Remaining", "9", "RateLimit-Reset", "360"}},
		{named, req("another", desc("key2", "h")),
			[]string{"X-Limit", "20", "X-Remaining", "19", "X-Reset", "180"}},
		// No limit: no header.
		{defaults, req("another", desc("none", "h")), nil},
		// key3 is over (10 asked, 9 left); key4, which the refusal left
		// as it was, has fewer remaining: the one over its limit wins.
		{defaults, req("another", hits(desc("key4", "h"), 1), hits(desc("key3", "h"), 10)),
			[]string{"RateLimit-Limit", "10", "RateLimit-Remaining", "9", "RateLimit-Reset", "360"}},
		{defaults, req("another", desc("key2", "h"), desc("key4", "h")),
			[]string{"RateLimit-Limit", "20", "RateLimit-Remaining", "4", "RateLimit-Reset", "69120"}},
	} {
		hs := call(t, step.c, step.r).GetResponseHeadersToAdd()
		if len(hs) != len(step.want)/2 {
			t.Errorf("step %d: headers %v, want %q", i, hs, step.want)
			continue
		}
		for j, h := range hs {
			name, value := step.want[2*j], step.want[2*j+1]
			if j == 2 && h.GetKey() == name {
				// The reset may be a second short: the bucket refills
				// meanwhile.
				got, _ := strconv.Atoi(h.GetValue())
				want, _ := strconv.Atoi(value)
				if got == want-1 {
					continue
				}
			}
			if h.GetKey() != name || h.GetValue() != value {
				t.Errorf("step %d: header %d is %s: %s, want %s: %s", i, j, h.GetKey(), h.GetValue(), name, value)
			}
		}
	}
}

// TestHealthAndReflection checks the services RegisterAll adds: health,
// SERVING for the server and for "ratelimit", and reflection, which lists
// the rate limit service.
func TestHealthAndReflection(t *testing.T) {
	conn := dial(t, listen(t, newServer(t, newLimiter(t), new(rls.Rules), rls.Config{})))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	health := healthpb.NewHealthClient(conn)
	for _, service := range []string{"", rls.HealthService} {
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health of %q: %v, %v; want SERVING", service, resp, err)
		}
	}
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	for _, want := range []string{"envoy.service.ratelimit.v3.RateLimitService", "grpc.health.v1.Health"} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v, without %s", names, want)
		}
	}
}
