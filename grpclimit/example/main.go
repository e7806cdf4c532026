// Command example serves the gRPC health service (grpc.health.v1.Health)
// behind grpclimit's interceptors: each client may make -burst calls at
// once and -rate a second after that, per method, keyed by its API key
// (the x-api-key metadata) or else by its address, behind the proxies of
// -trusted-proxies.
//
//	go run ./example                       # 127.0.0.1:50051, embedded Redis (miniredis)
//	go run ./example -redis 127.0.0.1:6379 -trusted-proxies 10.0.0.0/8
//
// Flags: -addr, -redis (default: an embedded miniredis), -redis-timeout
// (the bound of a Redis call, past which the fallback policy decides; 50ms
// by default), -trusted-proxies, -rate, -burst, -shadow.
//
// Try it with grpcurl:
//
//	grpcurl -plaintext -v -H 'x-api-key: k1' 127.0.0.1:50051 grpc.health.v1.Health/Check
//
// The response header carries ratelimit-policy and ratelimit; a denied
// call is ResourceExhausted with RetryInfo and QuotaFailure details.
// SIGINT or SIGTERM stops it in order: the server drains its calls, then
// the Limiter settles with Redis and stops.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/grpclimit"
	"github.com/hybridlimit/hybrid/httplimit"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(1)
	}
}

// flags are the command's settings.
type flags struct {
	addr         string
	redisAddr    string
	redisTimeout time.Duration
	trusted      []netip.Prefix
	limit        hybrid.Limit
	shadow       bool
}

// parse parses the command line.
func parse(args []string, out io.Writer) (flags, error) {
	var f flags
	fs := flag.NewFlagSet("example", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&f.addr, "addr", "127.0.0.1:50051", "the address to serve on")
	fs.StringVar(&f.redisAddr, "redis", "", "the Redis to keep the buckets in (default: an embedded miniredis)")
	fs.DurationVar(&f.redisTimeout, "redis-timeout", 0, "bound of each Redis call; past it the fallback policy decides (0: 50ms)")
	trusted := fs.String("trusted-proxies", "", "comma-separated networks whose x-forwarded-for is read")
	fs.Float64Var(&f.limit.Rate, "rate", 1, "calls a second, per client and method")
	fs.Int64Var(&f.limit.Burst, "burst", 5, "calls at once, per client and method")
	fs.BoolVar(&f.shadow, "shadow", false, "decide and log, but serve every call")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	if f.redisTimeout < 0 {
		return f, fmt.Errorf("-redis-timeout %v is negative", f.redisTimeout)
	}
	for s := range strings.SplitSeq(*trusted, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return f, fmt.Errorf("-trusted-proxies: %w", err)
		}
		f.trusted = append(f.trusted, p)
	}
	return f, nil
}

// run serves until ctx ends, logging to logOut. If ready is not nil, it
// receives the address served on once the server listens.
func run(ctx context.Context, args []string, logOut io.Writer, ready chan<- net.Addr) error {
	f, err := parse(args, logOut)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(logOut, nil))

	redisAddr := f.redisAddr
	if redisAddr == "" {
		m, err := miniredis.Run()
		if err != nil {
			return err
		}
		defer m.Close()
		redisAddr = m.Addr()
	}
	rdb := redis.NewClient(&redis.Options{
		Addr:                  redisAddr,
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
	})
	defer rdb.Close()
	lim, err := hybrid.New(rdb, hybrid.Config{
		Logger:  log,
		Breaker: breaker.Config{CallTimeout: f.redisTimeout}, // ColdWait follows it
	})
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := lim.Close(ctx); err != nil {
			log.Error("closing the limiter", "err", err)
		}
	}()

	rl, err := grpclimit.New(lim, grpclimit.Config{
		Name: "per-client",
		Key: grpclimit.Join(
			grpclimit.ByMethod(),
			grpclimit.FirstKey(grpclimit.ByMetadata("x-api-key"), grpclimit.ByPeer(&httplimit.ClientIP{TrustedProxies: f.trusted})),
		),
		Limit:  f.limit,
		Shadow: f.shadow,
		OnDenied: func(ctx context.Context, d grpclimit.Denial) {
			log.Info("denied", "method", d.Method, "tier", d.Tier, "retry_after", d.RetryAfter, "shadow", d.Shadow)
		},
	})
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(rl.Unary()), grpc.ChainStreamInterceptor(rl.Stream()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	reflection.Register(srv)

	lis, err := net.Listen("tcp", f.addr)
	if err != nil {
		return err
	}
	log.Info("serving", "addr", lis.Addr().String(), "rate", f.limit.Rate, "burst", f.limit.Burst)
	if ready != nil {
		ready <- lis.Addr()
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	drained := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(drained)
	}()
	select {
	case <-drained:
	case <-time.After(10 * time.Second):
		srv.Stop()
		<-drained
	}
	if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	log.Info("stopped", "stats", fmt.Sprintf("%+v", rl.Stats()))
	return nil
}
