package runner

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/envoyrls/config"
	"github.com/hybridlimit/hybrid/envoyrls/rls"
)

// Config configures a Service. A zero field means its documented default,
// the original's where it has one; FromEnv fills it from the original's
// environment variables and Flags lets the command line override it.
type Config struct {
	// GRPCAddr is where the RateLimitService listens: "host:port", or
	// "unix:/path" for a Unix socket (GRPC_UDS). "" means
	// "0.0.0.0:8081", the original's GRPC_HOST and GRPC_PORT.
	GRPCAddr string
	// HTTPAddr is where /healthcheck, /json and /metrics are served. ""
	// means "0.0.0.0:8080", the original's HOST and PORT.
	HTTPAddr string
	// DebugAddr is where /rlconfig, /stats and /debug/pprof/ are served.
	// "" means "0.0.0.0:6070", the original's DEBUG_HOST and DEBUG_PORT.
	DebugAddr string
	// PrometheusAddr, if not "", serves /metrics on a port of its own too,
	// at PrometheusPath, where the original's USE_PROMETHEUS serves it
	// (PROMETHEUS_ADDR). "" serves it on HTTPAddr only.
	PrometheusAddr string
	// PrometheusPath is the path of PrometheusAddr's metrics. "" means
	// "/metrics".
	PrometheusPath string

	// MaxConnectionAge closes a gRPC connection after about this long
	// (GRPC_MAX_CONNECTION_AGE), so that clients re-resolve the service.
	// 0 means 24h.
	MaxConnectionAge time.Duration
	// MaxConnectionAgeGrace is how long a connection past its age may
	// finish its calls (GRPC_MAX_CONNECTION_AGE_GRACE). 0 means 1h.
	MaxConnectionAgeGrace time.Duration

	// ConfigDir is the directory whose files (in subdirectories too) are
	// the rate limit configuration, watched while the Service runs. FromEnv
	// sets it to $RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/$RUNTIME_APPDIRECTORY.
	// It must be set.
	ConfigDir string
	// Options says how the files are read: MERGE_DOMAIN_CONFIG and
	// RUNTIME_IGNOREDOTFILES.
	Options config.Options
	// ReloadInterval is how often ConfigDir is checked for a change. 0
	// means a second.
	ReloadInterval time.Duration
	// HealthyWithConfig makes the Service unhealthy until a configuration
	// with at least one domain is in force, and again whenever one without
	// any is loaded: the original's HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED.
	HealthyWithConfig bool
	// OnLoad, if not nil, is called after each attempt to load ConfigDir,
	// at start and on every change seen: with the rules now in force and
	// nil, or with the rules still in force (nil if none) and why the
	// files were refused. It runs on the watching goroutine with no lock
	// held; the Service waits for it before it checks again.
	OnLoad func(rules *config.Rules, err error)

	// Redis says where the buckets are kept. Its zero value starts an
	// embedded, in-memory Redis (miniredis) for this process alone.
	Redis Redis

	// KeyPrefix starts every Redis key of the Limiter (CACHE_KEY_PREFIX).
	// "" means "hybrid".
	KeyPrefix string
	// Mode is the settlement mode of the limits whose rate_limit names
	// none. The zero value is hybrid.Lease.
	Mode hybrid.Mode
	// Fallback decides while Redis is unreachable. The zero value is
	// hybrid.LocalShare.
	Fallback hybrid.Fallback
	// MaxKeys bounds the buckets the Limiter keeps in memory. 0 means
	// hybrid's default, 100,000.
	MaxKeys int
	// RedisTimeout is the least deadline of a call to Redis (the
	// breaker's call timeout), which adapts to Redis's latency above it.
	// 0 means 50ms.
	RedisTimeout time.Duration
	// ColdWait bounds how long a request waits for Redis, in all. 0 means
	// RedisTimeout. Envoy's timeout for the service must be above it.
	ColdWait time.Duration
	// RefillPace is how much of a saturated descriptor's refill the
	// Limiter asks Redis for at once (hybrid.Config.RefillPace): a
	// descriptor whose demand exceeds its limit costs Redis about one call
	// per RefillPace, and its tokens come in lumps of that much refill.
	// 0 means 50ms, the shortest refill of Envoy's own local rate limit:
	// a route of 10,000 a second costs about 20 calls a second, where the
	// library's default of 1ms costs 170 to 450.
	RefillPace time.Duration

	// Independent decides each descriptor of a request on its own, as the
	// original does: a request one limit refuses still spends the others
	// (rls.Config.Independent). The default decides them all or nothing.
	Independent bool

	// ShadowMode is the original's SHADOW_MODE: every response is OK.
	ShadowMode bool
	// QuotaMode is the original's QUOTA_MODE: every descriptor in quota
	// mode.
	QuotaMode bool
	// NearLimitRatio is the original's NEAR_LIMIT_RATIO. 0 means 0.8.
	NearLimitRatio float64
	// Headers, if not nil, adds the original's rate-limit headers
	// (LIMIT_RESPONSE_HEADERS_ENABLED and the LIMIT_*_HEADER names).
	Headers *rls.Headers

	// MaxSeries bounds the label sets of the per-descriptor metrics
	// (ratelimit_service_rate_limit_*): the hits of those past it are
	// counted under an empty domain. 0 means 10,000.
	MaxSeries int

	// DrainTimeout bounds the drain of the calls under way at shutdown,
	// for the gRPC server and then for the HTTP servers. 0 means 10s.
	DrainTimeout time.Duration
	// CloseTimeout bounds the Limiter's last settlement with Redis at
	// shutdown. 0 means 5s.
	CloseTimeout time.Duration

	// HeapFloor is the heap the garbage collector lets the process grow to
	// before it runs, while GOGC=100 would run it sooner (see
	// StartHeapFloor), in bytes; 0 is none, GOGC's 100 alone. hybrid-rls
	// starts it; Run does not, as GOGC is the process's. FromEnv sets
	// DefaultHeapFloor, or 0 where GOGC is set.
	HeapFloor int64

	// LogLevel is the least level logged (LOG_LEVEL). The zero value is
	// slog.LevelInfo.
	LogLevel slog.Level
	// LogJSON logs JSON lines, as the original's LOG_FORMAT=json does,
	// instead of text.
	LogJSON bool
	// Logger, if not nil, receives the log; nil means NewLogger(os.Stderr).
	Logger *slog.Logger

	// Ignored lists the original's environment variables that FromEnv
	// found set but that this service does not apply; Start logs them.
	Ignored []string

	// hold, if not nil, runs before every unary call (tests).
	hold func()
}

// Redis says which Redis keeps the buckets, as the original's REDIS_*
// settings do.
type Redis struct {
	// Type is single, sentinel or cluster, in any case (REDIS_TYPE). ""
	// means single.
	Type string
	// Network is tcp or unix (REDIS_SOCKET_TYPE), for a single Redis. ""
	// means tcp.
	Network string
	// URL is REDIS_URL: for single, "host:port", a Unix socket's path, or
	// a redis:// or rediss:// URL; for sentinel, the master's name and
	// then the sentinels, "mymaster,host1:26379,host2:26379"; for cluster,
	// the nodes, "host1:6379,host2:6379". "" means an embedded Redis.
	URL string
	// Auth is REDIS_AUTH: "password", or "user:password" for an ACL user.
	Auth string
	// SentinelAuth is REDIS_SENTINEL_AUTH, the sentinels' own
	// "password" or "user:password".
	SentinelAuth string
	// PoolSize is the connections kept per node (REDIS_POOL_SIZE). 0
	// means 10.
	PoolSize int
	// TLS connects with TLS (REDIS_TLS).
	TLS bool
	// TLSClientCert and TLSClientKey are the files of the client's
	// certificate and key, sent if both are set (REDIS_TLS_CLIENT_CERT,
	// REDIS_TLS_CLIENT_KEY).
	TLSClientCert, TLSClientKey string
	// TLSCACert is a file of PEM certificates trusted besides the system's
	// (REDIS_TLS_CACERT).
	TLSCACert string
	// TLSSkipHostnameVerification checks the server's certificate chain
	// but not its name (REDIS_TLS_SKIP_HOSTNAME_VERIFICATION).
	TLSSkipHostnameVerification bool
}

// Defaults of the fields whose zero value means one.
const (
	defaultGRPCAddr       = "0.0.0.0:8081"
	defaultHTTPAddr       = "0.0.0.0:8080"
	defaultDebugAddr      = "0.0.0.0:6070"
	defaultPromPath       = "/metrics"
	defaultConnAge        = 24 * time.Hour
	defaultConnAgeGrace   = time.Hour
	defaultReloadInterval = time.Second
	defaultPoolSize       = 10
	defaultMaxSeries      = 10_000
	defaultDrainTimeout   = 10 * time.Second
	defaultCloseTimeout   = 5 * time.Second
	defaultRefillPace     = 50 * time.Millisecond
)

// ErrConfig marks an invalid Config, environment variable or flag.
var ErrConfig = errors.New("runner: invalid configuration")

// withDefaults returns c with every zero field that has a default set to
// it, or an error wrapping ErrConfig.
func (c Config) withDefaults() (Config, error) {
	orDefault(&c.GRPCAddr, defaultGRPCAddr)
	orDefault(&c.HTTPAddr, defaultHTTPAddr)
	orDefault(&c.DebugAddr, defaultDebugAddr)
	orDefault(&c.PrometheusPath, defaultPromPath)
	orDefault(&c.MaxConnectionAge, defaultConnAge)
	orDefault(&c.MaxConnectionAgeGrace, defaultConnAgeGrace)
	orDefault(&c.ReloadInterval, defaultReloadInterval)
	orDefault(&c.Redis.PoolSize, defaultPoolSize)
	orDefault(&c.MaxSeries, defaultMaxSeries)
	orDefault(&c.DrainTimeout, defaultDrainTimeout)
	orDefault(&c.CloseTimeout, defaultCloseTimeout)
	orDefault(&c.RefillPace, defaultRefillPace)
	orDefault(&c.Redis.Type, "single")
	orDefault(&c.Redis.Network, "tcp")
	c.Redis.Type = strings.ToLower(c.Redis.Type)
	c.Redis.Network = strings.ToLower(c.Redis.Network)

	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrConfig}, a...)...))
	}
	if c.ConfigDir == "" {
		bad("no configuration directory (RUNTIME_ROOT and the others, or -config)")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"MaxConnectionAge", c.MaxConnectionAge}, {"MaxConnectionAgeGrace", c.MaxConnectionAgeGrace},
		{"ReloadInterval", c.ReloadInterval}, {"RedisTimeout", c.RedisTimeout}, {"ColdWait", c.ColdWait},
		{"RefillPace", c.RefillPace}, {"DrainTimeout", c.DrainTimeout}, {"CloseTimeout", c.CloseTimeout},
	} {
		if d.v < 0 {
			bad("%s %v is negative", d.name, d.v)
		}
	}
	switch c.Redis.Type {
	case "single", "sentinel", "cluster":
	default:
		bad("redis type %q is not single, sentinel or cluster", c.Redis.Type)
	}
	switch c.Redis.Network {
	case "tcp", "unix":
	default:
		bad("redis socket type %q is not tcp or unix", c.Redis.Network)
	}
	if c.Redis.URL == "" && c.Redis.Type != "single" {
		bad("redis type %s needs a URL", c.Redis.Type)
	}
	if c.Redis.PoolSize < 0 {
		bad("redis pool size %d is negative", c.Redis.PoolSize)
	}
	if c.MaxKeys < 0 {
		bad("MaxKeys %d is negative", c.MaxKeys)
	}
	if c.MaxSeries < 0 {
		bad("MaxSeries %d is negative", c.MaxSeries)
	}
	if c.Mode > hybrid.Exact {
		bad("mode %v is not lease, optimistic or exact", c.Mode)
	}
	if r := c.NearLimitRatio; math.IsNaN(r) || r < 0 || r > 1 {
		bad("near limit ratio %v is outside [0, 1]", r)
	}
	return c, errors.Join(errs...)
}

// orDefault sets *v to def if it is the zero value.
func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}
