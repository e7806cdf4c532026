package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/envoyrls/rls"
)

// Service is a running hybrid-rls: the RateLimitService on its gRPC port,
// /healthcheck, /json and /metrics on its HTTP port, /rlconfig and pprof on
// its debug port, and the watch of its configuration directory, on one
// Limiter. Create one with Start and stop it with Close. It is safe for
// concurrent use.
type Service struct {
	cfg    Config
	log    *slog.Logger
	rdb    redis.UniversalClient
	mini   *miniredis.Miniredis // nil unless embedded
	lim    *hybrid.Limiter
	rules  *rls.Rules
	srv    *rls.Server
	health *healthState
	grpc   *grpc.Server
	gLis   net.Listener
	https  []*httpPort
	watch  *watcher
	addrs  Addrs

	serving   bool // the servers own their listeners
	stopWatch context.CancelFunc
	wg        sync.WaitGroup // the serving goroutines and the watch
	failed    chan error     // the first serving error
	closeOnce sync.Once
	closeErr  error
}

// httpPort is one HTTP server and its listener.
type httpPort struct {
	name string
	srv  *http.Server
	lis  net.Listener
}

// Addrs are the addresses a Service listens on, as "host:port" (or
// "unix:/path" for a gRPC Unix socket).
type Addrs struct {
	GRPC, HTTP, Debug string
	// Prometheus is "" unless Config.PrometheusAddr is set.
	Prometheus string
}

// Start starts a Service as cfg says and returns it serving: its ports
// are listening, its configuration is loaded (a configuration the loader
// refuses is logged and counted, and the Service answers every request
// with the original's error for a missing configuration until a valid one
// is in place; a directory that does not exist is an error), and its
// Limiter is running. An unreachable Redis is logged, not an error: the
// Limiter's fallback answers until it is back. Errors of cfg wrap
// ErrConfig.
func Start(cfg Config) (_ *Service, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, log: cfg.Logger, failed: make(chan error, 1)}
	if s.log == nil {
		s.log = cfg.NewLogger(os.Stderr)
	}
	if len(cfg.Ignored) > 0 {
		s.log.Warn("settings of envoyproxy/ratelimit not applied by this service", "vars", strings.Join(cfg.Ignored, ","))
	}
	if fi, err := os.Stat(cfg.ConfigDir); err != nil || !fi.IsDir() {
		if err == nil {
			err = errors.New("not a directory")
		}
		return nil, fmt.Errorf("%w: configuration directory: %v", ErrConfig, err)
	}
	defer func() {
		if err != nil {
			s.closeStarted()
		}
	}()
	if err := s.listen(); err != nil {
		return nil, err
	}
	if err := s.startLimiter(); err != nil {
		return nil, err
	}

	stats := newDescStats(cfg.MaxSeries)
	s.rules = new(rls.Rules)
	s.srv, err = rls.New(s.lim, s.rules.Load, rls.Config{
		Mode:           cfg.Mode,
		Independent:    cfg.Independent,
		ShadowMode:     cfg.ShadowMode,
		QuotaMode:      cfg.QuotaMode,
		NearLimitRatio: cfg.NearLimitRatio,
		Headers:        cfg.Headers,
		Observer:       stats,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	gm := newGRPCMetrics()
	interceptors := []grpc.UnaryServerInterceptor{gm.unary}
	if cfg.hold != nil {
		interceptors = append([]grpc.UnaryServerInterceptor{func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			cfg.hold()
			return h(ctx, req)
		}}, interceptors...)
	}
	s.grpc = grpc.NewServer(
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionAge:      cfg.MaxConnectionAge,
			MaxConnectionAgeGrace: cfg.MaxConnectionAgeGrace,
		}),
		grpc.ChainUnaryInterceptor(interceptors...),
		// Calls run on goroutines kept for them, not on a new one each:
		// a new goroutine grows its stack through gRPC's handling of
		// the call, and copying it was a sixth of the service's CPU under
		// a hot descriptor's load. One busy with a call that waits for
		// Redis is not waited for: the next call gets a goroutine of its
		// own, as without workers.
		grpc.NumStreamWorkers(uint32(max(minStreamWorkers, streamWorkers*runtime.GOMAXPROCS(0)))),
	)
	s.health = newHealth(s.srv.RegisterAll(s.grpc), cfg.HealthyWithConfig)

	ld := new(loads)
	s.watch = &watcher{
		dir: cfg.ConfigDir, opts: cfg.Options, interval: cfg.ReloadInterval,
		rules: s.rules, loads: ld, health: s.health, log: s.log, onLoad: cfg.OnLoad,
	}
	s.watch.start()

	reg, err := newRegistry(s.lim, newCollector(stats, ld, s.srv), gm)
	if err != nil {
		return nil, fmt.Errorf("runner: metrics: %w", err)
	}
	s.https[0].srv = newHTTPServer(s.mainHandler(reg), s.log)
	s.https[1].srv = newHTTPServer(s.debugHandler(), s.log)
	if len(s.https) > 2 {
		metrics, path := metricsHandler(reg, s.log), cfg.PrometheusPath
		s.https[2].srv = newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != path {
				http.NotFound(w, r)
				return
			}
			metrics.ServeHTTP(w, r)
		}), s.log)
	}
	s.serve()
	s.serving = true
	s.log.Info("serving", "grpc", s.addrs.GRPC, "http", s.addrs.HTTP, "debug", s.addrs.Debug,
		"prometheus", s.addrs.Prometheus, "mode", cfg.Mode.String(), "fallback", cfg.Fallback.String())
	return s, nil
}

// streamWorkers is the number of goroutines kept for gRPC calls, per
// processor (grpc.NumStreamWorkers), and minStreamWorkers the least: the
// calls in flight at once are the proxies' (each Envoy worker thread's
// connection carries many), not a number of processors. With four a
// processor, 32 callers on two processors had most calls on new
// goroutines still, and copying their stacks was 10.6% of the service's
// CPU under the hot descriptor's load; with 64, 2.5% (envoyrls/bench, a
// profile of hybrid-rls in the hot cell). An idle worker costs its stack.
const (
	streamWorkers    = 4
	minStreamWorkers = 64
)

// listen opens the Service's listeners.
func (s *Service) listen() error {
	network, addr := "tcp", s.cfg.GRPCAddr
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, addr = "unix", path
	}
	var err error
	if s.gLis, err = net.Listen(network, addr); err != nil {
		return fmt.Errorf("runner: gRPC: %w", err)
	}
	s.addrs.GRPC = s.gLis.Addr().String()
	if network == "unix" {
		s.addrs.GRPC = "unix:" + s.addrs.GRPC
	}
	ports := []struct{ name, addr string }{{"http", s.cfg.HTTPAddr}, {"debug", s.cfg.DebugAddr}}
	if s.cfg.PrometheusAddr != "" {
		ports = append(ports, struct{ name, addr string }{"prometheus", s.cfg.PrometheusAddr})
	}
	for _, p := range ports {
		lis, err := net.Listen("tcp", p.addr)
		if err != nil {
			return fmt.Errorf("runner: %s: %w", p.name, err)
		}
		s.https = append(s.https, &httpPort{name: p.name, lis: lis})
	}
	s.addrs.HTTP = s.https[0].lis.Addr().String()
	s.addrs.Debug = s.https[1].lis.Addr().String()
	if len(s.https) > 2 {
		s.addrs.Prometheus = s.https[2].lis.Addr().String()
	}
	return nil
}

// startLimiter connects to Redis, or starts the embedded one, starts the
// Limiter and warms it (its script loaded, a connection open), for at most
// 2 s: a Redis that does not answer then is logged, and the fallback
// decides until it does.
func (s *Service) startLimiter() error {
	var desc string
	var err error
	s.rdb, desc, s.mini, err = newRedis(s.cfg.Redis)
	if err != nil {
		return err
	}
	if s.mini != nil {
		s.log.Warn("no Redis given (REDIS_URL unset, no -redis): buckets are kept in an embedded, in-memory Redis; "+
			"the limits hold for this process alone and are lost when it stops", "redis", desc)
	}
	s.lim, err = hybrid.New(s.rdb, hybrid.Config{
		Prefix:     s.cfg.KeyPrefix,
		MaxKeys:    s.cfg.MaxKeys,
		ColdWait:   s.cfg.ColdWait,
		RefillPace: s.cfg.RefillPace,
		Fallback:   s.cfg.Fallback,
		Breaker:    breaker.Config{CallTimeout: s.cfg.RedisTimeout},
		Logger:     s.log,
	})
	if err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	// Before serving: the first calls then find a connection open and the
	// script loaded, rather than wait for them (hybrid.Limiter.Warm).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.lim.Warm(ctx); err != nil {
		attrs := []any{"redis", desc, "err", err}
		if r := s.cfg.Redis; r.Type == "single" && r.Network == "unix" && !strings.Contains(r.URL, "/") {
			attrs = append(attrs, "hint", "REDIS_SOCKET_TYPE is unix (the original's default): set it to tcp for a host:port")
		}
		s.log.Warn("Redis does not answer; the fallback policy decides until it does", attrs...)
	}
	s.log.Info("limiter started", "redis", desc, "key_prefix", s.cfg.KeyPrefix)
	return nil
}

// serve starts the serving goroutines and the watch.
func (s *Service) serve() {
	s.wg.Go(func() {
		if err := s.grpc.Serve(s.gLis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.fail(fmt.Errorf("runner: gRPC: %w", err))
		}
	})
	for _, p := range s.https {
		s.wg.Go(func() {
			if err := p.srv.Serve(p.lis); !errors.Is(err, http.ErrServerClosed) {
				s.fail(fmt.Errorf("runner: %s: %w", p.name, err))
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.stopWatch = cancel
	s.wg.Go(func() { s.watch.run(ctx) })
}

// fail records the first serving error.
func (s *Service) fail(err error) {
	select {
	case s.failed <- err:
	default:
	}
}

// Addrs returns the addresses s listens on.
func (s *Service) Addrs() Addrs { return s.addrs }

// Failed returns a channel that receives the error of a server of s that
// stopped serving on its own (a listener that failed). The Service goes on
// with its other servers; the caller closes it.
func (s *Service) Failed() <-chan error { return s.failed }

// Close stops s in order, each step within its bound, and returns what
// failed: it becomes unhealthy (/healthcheck answers 500, the gRPC health
// service NOT_SERVING), the gRPC server stops accepting and drains its
// calls (Config.DrainTimeout; calls still running then are ended), then
// the HTTP servers do the same (/json's calls, a profile), the watch stops,
// the Limiter settles with Redis for the last time (Config.CloseTimeout),
// and the Redis client and the embedded Redis close. Close is idempotent:
// later calls return the first one's result.
func (s *Service) Close() error {
	s.closeOnce.Do(func() {
		t0 := time.Now()
		s.log.Info("draining")
		s.health.drain()
		var errs []error
		if !s.drainGRPC() {
			errs = append(errs, fmt.Errorf("runner: gRPC calls still running after %v were ended", s.cfg.DrainTimeout))
		}
		var mu sync.Mutex // protects errs
		var wg sync.WaitGroup
		for _, p := range s.https {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), s.cfg.DrainTimeout)
				defer cancel()
				if err := p.srv.Shutdown(ctx); err != nil {
					p.srv.Close()
					mu.Lock()
					errs = append(errs, fmt.Errorf("runner: %s: draining: %w", p.name, err))
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		s.stopWatch()
		s.wg.Wait()
		s.log.Info("servers stopped", "took", time.Since(t0).Round(time.Millisecond).String())
		errs = append(errs, s.closeStarted())
		s.closeErr = errors.Join(errs...)
		s.log.Info("stopped", "took", time.Since(t0).Round(time.Millisecond).String(), "err", s.closeErr)
	})
	return s.closeErr
}

// drainGRPC stops the gRPC server gracefully within Config.DrainTimeout,
// then at once, and reports whether the calls all ended on their own.
func (s *Service) drainGRPC() bool {
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.grpc.GracefulStop()
	}()
	t := time.NewTimer(s.cfg.DrainTimeout)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		s.grpc.Stop()
		<-done
		return false
	}
}

// closeStarted closes what Start started, those that were: the listeners,
// unless the servers serve them, the Limiter, the Redis client and the embedded
// Redis.
func (s *Service) closeStarted() error {
	var errs []error
	if !s.serving {
		for _, p := range s.https {
			p.lis.Close()
		}
		if s.gLis != nil {
			s.gLis.Close()
		}
	}
	if s.lim != nil {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.CloseTimeout)
		if err := s.lim.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("runner: closing the limiter: %w", err))
		}
		cancel()
	}
	if s.rdb != nil {
		if err := s.rdb.Close(); err != nil {
			errs = append(errs, fmt.Errorf("runner: closing the Redis client: %w", err))
		}
	}
	if s.mini != nil {
		s.mini.Close()
	}
	return errors.Join(errs...)
}

// Run starts a Service (Start), serves until ctx ends or a server fails,
// and closes it (Close). It returns Start's error, or the serving error
// and Close's.
func Run(ctx context.Context, cfg Config) error {
	s, err := Start(cfg)
	if err != nil {
		return err
	}
	var serveErr error
	select {
	case <-ctx.Done():
		s.log.Info("shutting down", "cause", context.Cause(ctx))
	case serveErr = <-s.Failed():
		s.log.Error("a server failed; shutting down", "err", serveErr)
	}
	return errors.Join(serveErr, s.Close())
}
