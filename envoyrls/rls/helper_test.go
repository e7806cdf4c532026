package rls_test

import (
	"context"
	"net"
	"os"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	extpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/envoyrls/config"
	"github.com/hybridlimit/hybrid/envoyrls/rls"
)

// TestMain silences go-redis's own log, which reports the refused dials of
// the tests that kill Redis.
func TestMain(m *testing.M) {
	redis.SetLogger(quietLogger{})
	os.Exit(m.Run())
}

// quietLogger is a go-redis logger that drops everything.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// slowRedis bounds the Redis calls of the Limiters on miniredis: a machine
// busy with other tests may keep miniredis from answering within the 50ms
// of the default, and the Limiter would then deny a cold key (a slow Redis
// is no outage) or fall back.
var slowRedis = breaker.Config{CallTimeout: 10 * time.Second, MaxCallTimeout: 10 * time.Second}

// newLimiter returns a Limiter on a fresh miniredis, in real time, closed
// when t ends. Its settlement rounds come every hour, so never while a
// test runs: a lease then changes only by the requests' own fetches, and
// the tests that check a sequence of decisions in Lease mode see the
// same one every run (a round settling a key between two of its requests
// may make a Lease key refuse one and admit a later one, with the same
// total).
func newLimiter(t testing.TB) *hybrid.Limiter {
	t.Helper()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	lim, err := hybrid.New(rdb, hybrid.Config{
		Instances:    1,
		Breaker:      slowRedis,
		ColdWait:     10 * time.Second,
		SyncInterval: time.Hour,
		FirstRound:   time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		lim.Close(context.Background())
		rdb.Close()
	})
	return lim
}

// exactly is the settlement mode of the tests that check a status's
// limit_remaining to the request. An Exact limit's every decision is made
// by Redis, which says what its bucket holds, and a composite of Exact
// limits is one script call; a Lease limit's Remaining is this instance's
// estimate (its lease plus its last view of the bucket, hybrid.Result),
// which a settlement round may leave off by part of a lease until the
// key's next round trip.
const exactly = hybrid.Exact

// load returns the rules of the YAML documents, one file each.
func load(t testing.TB, docs ...string) *config.Rules {
	t.Helper()
	files := make([]config.File, len(docs))
	for i, d := range docs {
		files[i] = config.File{Name: "test.yaml", Data: []byte(d)}
	}
	r, err := config.Load(files, config.Options{})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return r
}

// newServer returns a Server on lim serving rules, with cfg.
func newServer(t testing.TB, lim *hybrid.Limiter, rules *rls.Rules, cfg rls.Config) *rls.Server {
	t.Helper()
	s, err := rls.New(lim, rules.Load, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

// serve serves srv on a free loopback TCP port, and returns a client
// connected to it over TCP; both stop when t ends. The gRPC server has the
// health service and reflection too (Server.RegisterAll), and the
// interceptors given.
func serve(t testing.TB, srv *rls.Server, interceptors ...grpc.UnaryServerInterceptor) rlspb.RateLimitServiceClient {
	t.Helper()
	return rlspb.NewRateLimitServiceClient(dial(t, listen(t, srv, interceptors...)))
}

// listen serves srv on a free loopback TCP port until t ends, and returns
// its address.
func listen(t testing.TB, srv *rls.Server, interceptors ...grpc.UnaryServerInterceptor) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.ChainUnaryInterceptor(interceptors...))
	srv.RegisterAll(g)
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.Serve(lis)
	}()
	t.Cleanup(func() {
		g.Stop()
		<-done
	})
	return lis.Addr().String()
}

// dial returns a client connection to addr, closed when t ends.
func dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// req builds a request of domain with the descriptors given.
func req(domain string, descs ...*extpb.RateLimitDescriptor) *rlspb.RateLimitRequest {
	return &rlspb.RateLimitRequest{Domain: domain, Descriptors: descs}
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *extpb.RateLimitDescriptor {
	d := &extpb.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &extpb.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// hits sets the descriptor's own hits_addend.
func hits(d *extpb.RateLimitDescriptor, n uint64) *extpb.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// override sets the descriptor's limit override.
func override(d *extpb.RateLimitDescriptor, n uint32, unit typepb.RateLimitUnit) *extpb.RateLimitDescriptor {
	d.Limit = &extpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: unit}
	return d
}

// call makes one ShouldRateLimit call, failing t on an error.
func call(t testing.TB, c rlspb.RateLimitServiceClient, r *rlspb.RateLimitRequest) *rlspb.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, r)
	if err != nil {
		t.Fatalf("ShouldRateLimit(%v): %v", r, err)
	}
	return resp
}

// st is the part of a descriptor status that the tests compare: code,
// limit (requests per unit, unit, name; all zero for none), remaining, and
// the reset in whole seconds.
type st struct {
	code      rlspb.RateLimitResponse_Code
	rpu       uint32
	unit      rlspb.RateLimitResponse_RateLimit_Unit
	name      string
	remaining uint32
	reset     int64
}

// statuses returns the statuses of resp as sts.
func statuses(resp *rlspb.RateLimitResponse) []st {
	var out []st
	for _, s := range resp.GetStatuses() {
		out = append(out, st{
			code:      s.GetCode(),
			rpu:       s.GetCurrentLimit().GetRequestsPerUnit(),
			unit:      s.GetCurrentLimit().GetUnit(),
			name:      s.GetCurrentLimit().GetName(),
			remaining: s.GetLimitRemaining(),
			reset:     s.GetDurationUntilReset().GetSeconds(),
		})
	}
	return out
}

// Shorthands for the codes and units of a response.
const (
	ok     = rlspb.RateLimitResponse_OK
	over   = rlspb.RateLimitResponse_OVER_LIMIT
	second = rlspb.RateLimitResponse_RateLimit_SECOND
	minute = rlspb.RateLimitResponse_RateLimit_MINUTE
	hour   = rlspb.RateLimitResponse_RateLimit_HOUR
	day    = rlspb.RateLimitResponse_RateLimit_DAY
)

// noLimit is the status of a descriptor no limit applies to.
var noLimit = st{code: ok}
