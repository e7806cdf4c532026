// Server is an example JSON API behind the httplimit middleware, with plans,
// composite limits and Prometheus metrics.
//
// Usage:
//
//	go run ./examples/server [flags]
//
// It listens on 127.0.0.1:8080 and keeps its buckets in an embedded Redis
// (miniredis) that it starts and stops, or in the Redis at -redis. The rules
// are rules.json, embedded in the binary, unless -rules names another file
// (the format is the one of package policy, docs/policy.md).
//
// Flags:
//
//	-addr ADDR             address to listen on (default 127.0.0.1:8080)
//	-redis ADDR            Redis to keep the buckets in; default: an embedded miniredis
//	-redis-timeout D       bound of each Redis call (default 50ms, the limiter's);
//	                       past it the limiter's fallback policy decides
//	-rules FILE            rules as JSON; default: the embedded rules.json
//	-trusted-proxies LIST  comma-separated networks of the proxies in front of the
//	                       service (10.0.0.0/8,fd00::/8): X-Forwarded-For is read
//	                       only from them; default: none, the peer is the client
//	-shadow                decide and count every request, but serve it whatever
//	                       the decision (for rolling out new limits)
//	-max-wait D            let a request over its limit wait up to D for its
//	                       tokens before it is refused (default 0: refuse at
//	                       once); for smoothing bursts, not queueing floods
//	-log-level LEVEL       debug, info, warn or error (default info); denials are
//	                       logged at debug, shadow denials at info
//
// Endpoints (all JSON; errors are RFC 9457 problem objects):
//
//	GET  /v1/items       the catalogue                         cost 1
//	GET  /v1/items/{id}  one item                              cost 1
//	POST /v1/reports     a stock report; needs an API key      cost 10 in the report tiers
//	GET  /v1/me          who the service thinks the caller is  cost 1
//	GET  /metrics        Prometheus metrics (below)            not limited
//	GET  /healthz        liveness                              not limited
//
// /metrics serves the Limiter's metrics (package hybridprom,
// docs/observability.md), the middleware's counters as
// hybrid_http_requests_total{outcome="allowed|waited|denied|shadow_denied|error|exempt"}
// (waited: served after waiting for its tokens, -max-wait),
// the denials by the tier that denied as hybrid_http_denials_total{tier=...},
// and the Go runtime's go_* metrics.
//
// A caller identifies itself with the X-API-Key header. The demo keys, from
// a table in memory (a real service would look a key up in its own store):
//
//	X-API-Key              user   plan        key id
//	demo-free-alice-1      alice  free        alice-1
//	demo-free-alice-2      alice  free        alice-2
//	demo-free-dave         dave   free        dave-1
//	demo-pro-bob           bob    pro         bob-1
//	demo-enterprise-carol  carol  enterprise  carol-1
//
// A request without a key, or with an unknown one, is anonymous: it is
// limited on the rules' default plan ("anonymous" in rules.json) by its
// client address, and an unknown key is then answered 401. With the embedded
// rules, an anonymous client may make 10 requests at once and then one every
// 6 seconds; a free key 10, then one every 6 seconds, and its user 15 (all
// its keys together); a report costs 10 tokens in the report tiers, of which
// a free user holds 20 and all free users together 30. The free and
// anonymous limits are in exact mode (one Redis call per rule and request),
// pro's are leased, enterprise's per-user and per-key limits and the
// service-wide one optimistic.
//
// SIGINT or SIGTERM stops the server: it stops accepting connections and
// drains the requests in flight (at most 10 s), closes the Limiter, which
// settles its buckets with Redis (at most 5 s), then closes the Redis client
// and the embedded Redis (at most 2 s each).
package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/httplimit"
	"github.com/hybridlimit/hybrid/hybridprom"
	"github.com/hybridlimit/hybrid/policy"
)

// defaultRules are the rules served unless -rules names a file.
//
//go:embed rules.json
var defaultRules []byte

// The bounds of the shutdown steps.
const (
	drainTimeout   = 10 * time.Second // in-flight requests
	limiterTimeout = 5 * time.Second  // the Limiter's last settlement
	closeTimeout   = 2 * time.Second  // the Redis client, the embedded Redis
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// go-redis logs on its own (a refused dial, say) through the log
	// package: send those lines to the same place as ours.
	redis.SetLogger(redisLogger{slog.New(slog.NewTextHandler(os.Stderr, nil))})
	err := run(ctx, os.Args[1:], os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case errors.Is(err, errUsage):
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// run serves with the flags in args until ctx is done, then shuts down. It
// logs to logw.
func run(ctx context.Context, args []string, logw io.Writer) error {
	s, err := start(args, logw)
	if err != nil {
		return err
	}
	return s.serve(ctx)
}

// errUsage marks an error in the flags.
var errUsage = errors.New("server: usage")

// options are the parsed flags.
type options struct {
	addr         string
	redis        string
	redisTimeout time.Duration
	rules        string
	proxies      []netip.Prefix
	shadow       bool
	maxWait      time.Duration
	logLevel     slog.Level
}

// parseFlags parses args. Errors wrap errUsage, or are flag.ErrHelp.
func parseFlags(args []string, out io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8080", "address to listen on")
	fs.StringVar(&o.redis, "redis", "", "Redis `ADDR` to keep the buckets in; default: an embedded miniredis")
	fs.DurationVar(&o.redisTimeout, "redis-timeout", 0, "bound of each Redis call; past it the fallback policy decides (0: 50ms)")
	fs.StringVar(&o.rules, "rules", "", "rules `FILE` (JSON, docs/policy.md); default: the embedded rules.json")
	fs.Func("trusted-proxies", "comma-separated `CIDRs` of the proxies in front of the service; X-Forwarded-For is read only from them", func(v string) error {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f == "" {
				continue
			}
			p, err := netip.ParsePrefix(f)
			if err != nil {
				return fmt.Errorf("%q is not a network such as 10.0.0.0/8", f)
			}
			o.proxies = append(o.proxies, p.Masked())
		}
		return nil
	})
	fs.BoolVar(&o.shadow, "shadow", false, "decide and count every request but serve it whatever the decision")
	fs.DurationVar(&o.maxWait, "max-wait", 0, "let a request over its limit wait up to `D` for its tokens before it is refused (0: refuse at once)")
	fs.TextVar(&o.logLevel, "log-level", slog.LevelInfo, "log `LEVEL`: debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, err
		}
		return o, fmt.Errorf("%w: %v", errUsage, err)
	}
	if o.redisTimeout < 0 {
		return o, fmt.Errorf("%w: -redis-timeout %v is negative", errUsage, o.redisTimeout)
	}
	if o.maxWait < 0 {
		return o, fmt.Errorf("%w: -max-wait %v is negative", errUsage, o.maxWait)
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	return o, nil
}

// server is the running service and what it owns.
type server struct {
	log  *slog.Logger
	ln   net.Listener
	srv  *http.Server
	lim  *hybrid.Limiter
	mw   *httplimit.Middleware
	rdb  *redis.Client
	mini *miniredis.Miniredis // nil with -redis
}

// start parses args, loads the rules, starts the Redis (or connects to
// one), the Limiter and the listener. It serves nothing until serve.
func start(args []string, logw io.Writer) (_ *server, err error) {
	o, err := parseFlags(args, logw)
	if err != nil {
		return nil, err
	}
	log := slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: o.logLevel}))
	rules, rulesName, err := loadRules(o.rules)
	if err != nil {
		return nil, err
	}
	if err := checkRules(rules, demoAccounts); err != nil {
		return nil, fmt.Errorf("server: rules %s: %w", rulesName, err)
	}

	s := &server{log: log}
	defer func() {
		if err != nil {
			if s.ln != nil {
				s.ln.Close()
			}
			s.closeStarted()
		}
	}()
	if s.ln, err = net.Listen("tcp", o.addr); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	redisAddr := o.redis
	if redisAddr == "" {
		if s.mini, err = miniredis.Run(); err != nil {
			return nil, fmt.Errorf("server: embedded Redis: %w", err)
		}
		redisAddr = s.mini.Addr()
	}
	s.rdb = redis.NewClient(&redis.Options{
		Addr:                  redisAddr,
		MaxRetries:            -1,   // a settlement must not be sent twice
		ContextTimeoutEnabled: true, // so the limiter's short call timeouts hold
	})
	if o.redis != "" {
		// The Limiter runs without Redis (its fallback policy decides), so
		// an unreachable Redis is worth a warning, not a refusal to start.
		pctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := s.rdb.Ping(pctx).Err(); err != nil {
			log.Warn("Redis does not answer; the limiter's fallback policy decides until it does", "redis", redisAddr, "err", err)
		}
		cancel()
	}
	s.lim, err = hybrid.New(s.rdb, hybrid.Config{
		Logger:  log,
		Breaker: breaker.Config{CallTimeout: o.redisTimeout}, // ColdWait follows it
	})
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}

	api := newAPI(demoAccounts, httplimit.ClientIP{TrustedProxies: o.proxies})
	denials := newTierCounter()
	s.mw, err = httplimit.New(s.lim, httplimit.Config{
		Checks:  rules.ChecksFunc(api.identify),
		Shadow:  o.shadow,
		MaxWait: o.maxWait,
		OnDenied: func(d httplimit.Denial) {
			denials.add(d.Tier)
			level := slog.LevelDebug
			if d.Shadow {
				level = slog.LevelInfo
			}
			log.Log(d.Request.Context(), level, "request denied",
				"method", d.Request.Method, "path", d.Request.URL.Path,
				"tier", d.Tier, "key", d.Key, "cost", d.Cost, "remaining", d.Remaining,
				"retry_after", d.RetryAfter, "shadow", d.Shadow)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	reg, err := s.metrics(denials)
	if err != nil {
		return nil, err
	}

	mux := http.NewServeMux()
	mux.Handle("/v1/", s.mw.Handler(api.handler()))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	s.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	redisName := redisAddr
	if s.mini != nil {
		redisName = "embedded " + redisAddr
	}
	log.Info("server started", "addr", s.Addr(), "redis", redisName, "rules", rulesName,
		"plans", strings.Join(rules.Plans(), ","), "trusted_proxies", fmt.Sprint(o.proxies), "shadow", o.shadow)
	return s, nil
}

// loadRules loads the rules file at path, or the embedded rules if path is
// empty, and returns them with a name for the log.
func loadRules(path string) (*policy.Rules, string, error) {
	if path == "" {
		rules, err := policy.Load(strings.NewReader(string(defaultRules)))
		if err != nil {
			return nil, "", fmt.Errorf("server: embedded rules.json: %w", err)
		}
		return rules, "rules.json (embedded)", nil
	}
	rules, err := policy.LoadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("server: %w", err)
	}
	return rules, path, nil
}

// metrics returns the registry that /metrics serves: the Limiter's
// statistics, the middleware's counters, denials by tier and the Go runtime.
func (s *server) metrics(denials *tierCounter) (*prometheus.Registry, error) {
	c, err := hybridprom.New(s.lim, hybridprom.Config{Extras: []hybridprom.Extra{
		{
			Name:  "http_requests_total",
			Help:  "Requests decided by the HTTP middleware, by outcome.",
			Label: "outcome",
			Read: func() map[string]uint64 {
				st := s.mw.Stats()
				return map[string]uint64{
					"allowed": st.Allowed - st.Waited, "waited": st.Waited, "denied": st.Denied,
					"shadow_denied": st.ShadowDenied, "error": st.Errors, "exempt": st.Exempt,
				}
			},
		},
		{
			Name:  "http_denials_total",
			Help:  "Requests denied by the HTTP middleware (shadow denials included), by the tier that denied.",
			Label: "tier",
			Read:  denials.read,
		},
	}})
	if err != nil {
		return nil, fmt.Errorf("server: metrics: %w", err)
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(c); err != nil {
		return nil, fmt.Errorf("server: metrics: %w", err)
	}
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("server: metrics: %w", err)
	}
	return reg, nil
}

// Addr returns the address the server listens on.
func (s *server) Addr() string { return s.ln.Addr().String() }

// serve serves until ctx is done, then shuts down: see shutdown. It also
// shuts down, and returns the error, if serving fails.
func (s *server) serve(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	var serveErr error
	select {
	case <-ctx.Done():
		s.log.Info("shutting down", "cause", context.Cause(ctx))
	case serveErr = <-errc:
		errc = nil
		s.log.Error("serving failed; shutting down", "err", serveErr)
		serveErr = fmt.Errorf("server: %w", serveErr)
	}
	return errors.Join(serveErr, s.shutdown(errc))
}

// shutdown stops the server in order, each step within its bound: the
// HTTP server stops accepting and drains the requests in flight (those
// still running at the bound have their connections closed), then the
// Limiter settles its buckets and stops, then the Redis client and the
// embedded Redis close. errc, if not nil, receives the result of
// http.Server.Serve once it returns.
func (s *server) shutdown(errc <-chan error) error {
	var errs []error
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	err := s.srv.Shutdown(ctx)
	cancel()
	if err != nil {
		s.srv.Close()
		errs = append(errs, fmt.Errorf("server: draining requests: %w", err))
	}
	if errc != nil {
		if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, fmt.Errorf("server: %w", err))
		}
	}
	s.log.Info("http server stopped", "took", time.Since(t0).Round(time.Microsecond))
	errs = append(errs, s.closeStarted())
	return errors.Join(errs...)
}

// closeStarted closes the Limiter, the Redis client and the embedded Redis,
// those that were started, each within its bound.
func (s *server) closeStarted() error {
	var errs []error
	if s.lim != nil {
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), limiterTimeout)
		if err := s.lim.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("server: closing the limiter: %w", err))
		}
		cancel()
		s.log.Info("limiter closed", "took", time.Since(t0).Round(time.Microsecond))
	}
	if s.rdb != nil {
		errs = append(errs, within(closeTimeout, "closing the Redis client", s.rdb.Close))
	}
	if s.mini != nil {
		errs = append(errs, within(closeTimeout, "stopping the embedded Redis", func() error {
			s.mini.Close()
			return nil
		}))
	}
	return errors.Join(errs...)
}

// within runs fn and returns its error, or an error if it has not returned
// after d. A step that overruns is left to finish on its own: it runs only
// at shutdown, as the process is about to exit.
func within(d time.Duration, what string, fn func() error) error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("server: %s: %w", what, err)
		}
		return nil
	case <-t.C:
		return fmt.Errorf("server: %s: not done after %v", what, d)
	}
}

// redisLogger sends go-redis's log lines to a slog.Logger.
type redisLogger struct{ log *slog.Logger }

// Printf logs one line of go-redis at warning level.
func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.WarnContext(ctx, fmt.Sprintf(format, v...), "from", "go-redis")
}
