// Command hybrid-rls is Envoy's external rate limit service
// (envoy.service.ratelimit.v3.RateLimitService), a drop-in replacement for
// envoyproxy/ratelimit: it reads that service's configuration files and
// environment variables, and keeps its limits as token buckets that hold
// across a fleet, answered in memory and settled with Redis in batches.
//
//	RUNTIME_ROOT=/srv/runtime_data/current RUNTIME_SUBDIRECTORY=ratelimit \
//	REDIS_SOCKET_TYPE=tcp REDIS_URL=redis:6379 hybrid-rls
//	hybrid-rls -config ./config              # an embedded Redis: nothing to install
//
// Flags override the environment: -config DIR, -redis URL, -grpc ADDR,
// -http ADDR, -debug ADDR, -mode lease|optimistic|exact, -fallback
// localshare|failopen|failclosed|static:RATE,BURST, -independent, -max-keys N,
// -max-series N, -reload-interval D, -redis-timeout D, -cold-wait D,
// -refill-pace D, -drain-timeout D, -heap-floor SIZE. docs/envoy.md has
// the settings, the metrics and an Envoy configuration.
//
// SIGTERM or SIGINT stops it in order: unhealthy at once, then the calls
// under way drain, then the Limiter settles with Redis. It exits 0 after a
// clean stop, 1 after a failure, 2 for invalid settings.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid/envoyrls/runner"
)

func main() {
	cfg, err := runner.FromEnv(os.Environ())
	if err != nil {
		fmt.Fprintln(os.Stderr, "hybrid-rls:", err)
		os.Exit(2)
	}
	fs := flag.NewFlagSet("hybrid-rls", flag.ContinueOnError)
	cfg.Flags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "hybrid-rls: unexpected argument %q\n", fs.Arg(0))
		os.Exit(2)
	}
	log := cfg.NewLogger(os.Stderr)
	cfg.Logger = log
	// go-redis logs on its own (a refused dial, say): into the same log.
	redis.SetLogger(redisLogger{log})

	// The garbage collector's heap floor: GOGC is the process's, so the
	// command sets it, not Run.
	stopFloor := runner.StartHeapFloor(cfg.HeapFloor)
	defer stopFloor()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := runner.Run(ctx, cfg); err != nil {
		log.Error("hybrid-rls failed", "err", err)
		if errors.Is(err, runner.ErrConfig) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// redisLogger sends go-redis's log lines to a slog.Logger.
type redisLogger struct{ log *slog.Logger }

// Printf logs one line of go-redis at warning level.
func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.WarnContext(ctx, fmt.Sprintf(format, v...), "from", "go-redis")
}
