package runner

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hybridlimit/hybrid/envoyrls/rls"
)

// FromEnv returns the Config that the environment environ (os.Environ's
// "NAME=value" form) describes, read as envoyproxy/ratelimit reads its
// settings (its src/settings/settings.go): the same names, the same
// defaults and the same syntax (booleans as strconv.ParseBool reads them,
// integers in any base Go writes, durations as time.ParseDuration). A
// variable set to "" is set, as there: an empty PORT is an error, an empty
// RUNTIME_SUBDIRECTORY no subdirectory.
//
// It differs where the package documentation says: no REDIS_URL means an
// embedded Redis, LOG_LEVEL defaults to info, and settings that would
// change what a request is answered in a way this service cannot honour
// (another backend, configuration over xDS, TLS on the gRPC port) are
// errors rather than ignored. The other settings it does not apply are
// listed in Config.Ignored. Errors wrap ErrConfig and name the variable.
func FromEnv(environ []string) (Config, error) {
	e := env{vars: map[string]string{}}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			e.vars[k] = v
		}
	}
	var c Config

	c.HTTPAddr = e.hostPort("HOST", "0.0.0.0", "PORT", "8080")
	c.DebugAddr = e.hostPort("DEBUG_HOST", "0.0.0.0", "DEBUG_PORT", "6070")
	c.GRPCAddr = e.hostPort("GRPC_HOST", "0.0.0.0", "GRPC_PORT", "8081")
	if uds := e.str("GRPC_UDS", ""); uds != "" {
		c.GRPCAddr = "unix:" + uds
	}
	c.MaxConnectionAge = e.duration("GRPC_MAX_CONNECTION_AGE", "24h")
	c.MaxConnectionAgeGrace = e.duration("GRPC_MAX_CONNECTION_AGE_GRACE", "1h")
	if e.boolean("GRPC_SERVER_USE_TLS", "false") {
		e.fail("GRPC_SERVER_USE_TLS", "TLS on the gRPC port is not supported; terminate it in front of the service")
	}
	if e.boolean("USE_PROMETHEUS", "false") {
		c.PrometheusAddr = e.str("PROMETHEUS_ADDR", ":9090")
		c.PrometheusPath = e.str("PROMETHEUS_PATH", "/metrics")
		if !strings.HasPrefix(c.PrometheusPath, "/") {
			e.fail("PROMETHEUS_PATH", "does not start with /")
		}
	}

	c.LogLevel = e.logLevel("LOG_LEVEL", "info")
	c.LogJSON = strings.EqualFold(e.str("LOG_FORMAT", "text"), "json")

	if t := e.str("CONFIG_TYPE", "FILE"); t != "FILE" {
		e.fail("CONFIG_TYPE", "only FILE is supported")
	}
	c.ConfigDir = filepath.Join(
		e.str("RUNTIME_ROOT", "/srv/runtime_data/current"),
		e.str("RUNTIME_SUBDIRECTORY", ""),
		e.str("RUNTIME_APPDIRECTORY", "config"),
	)
	c.Options.IgnoreDotFiles = e.boolean("RUNTIME_IGNOREDOTFILES", "false")
	c.Options.MergeDomains = e.boolean("MERGE_DOMAIN_CONFIG", "false")
	_ = e.boolean("RUNTIME_WATCH_ROOT", "true") // checked; every change is watched either way
	c.HealthyWithConfig = e.boolean("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "false")

	if b := e.str("BACKEND_TYPE", "redis"); b != "redis" && b != "" {
		e.fail("BACKEND_TYPE", "only redis is supported")
	}
	c.KeyPrefix = e.str("CACHE_KEY_PREFIX", "")
	c.ShadowMode = e.boolean("SHADOW_MODE", "false")
	c.QuotaMode = e.boolean("QUOTA_MODE", "false")
	c.NearLimitRatio = e.float32("NEAR_LIMIT_RATIO", "0.8")
	if c.NearLimitRatio == 0 {
		// The original's 0: every hit within the limit is near it. A
		// Config's 0 means the default, so the least ratio above 0, which
		// rounds every threshold down to 0 all the same, stands in for it.
		c.NearLimitRatio = math.SmallestNonzeroFloat32
	}
	if e.boolean("LIMIT_RESPONSE_HEADERS_ENABLED", "false") {
		c.Headers = &rls.Headers{
			Limit:     e.str("LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
			Remaining: e.str("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"),
			Reset:     e.str("LIMIT_RESET_HEADER", "RateLimit-Reset"),
		}
	}

	// GOGC set says how the operator wants the collector run: no floor.
	if _, ok := e.vars["GOGC"]; !ok {
		c.HeapFloor = DefaultHeapFloor
	}

	r := &c.Redis
	r.Network = e.str("REDIS_SOCKET_TYPE", "unix")
	r.Type = e.str("REDIS_TYPE", "SINGLE")
	r.URL = e.str("REDIS_URL", "") // the original's default, a twemproxy socket, is not assumed
	r.PoolSize = e.integer("REDIS_POOL_SIZE", "10", 0, math.MaxInt32)
	r.Auth = e.str("REDIS_AUTH", "")
	r.SentinelAuth = e.str("REDIS_SENTINEL_AUTH", "")
	r.TLS = e.boolean("REDIS_TLS", "false")
	r.TLSClientCert = e.str("REDIS_TLS_CLIENT_CERT", "")
	r.TLSClientKey = e.str("REDIS_TLS_CLIENT_KEY", "")
	r.TLSCACert = e.str("REDIS_TLS_CACERT", "")
	r.TLSSkipHostnameVerification = e.boolean("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "false")

	for k := range e.vars {
		if ignored(k) {
			c.Ignored = append(c.Ignored, k)
		}
	}
	slices.Sort(c.Ignored)
	return c, errors.Join(e.errs...)
}

// env reads variables, collecting the errors.
type env struct {
	vars map[string]string
	errs []error
}

// fail records an error of the variable name.
func (e *env) fail(name, why string) {
	e.errs = append(e.errs, fmt.Errorf("%w: %s=%q: %s", ErrConfig, name, e.vars[name], why))
}

// str returns the variable name, or def if it is not set.
func (e *env) str(name, def string) string {
	if v, ok := e.vars[name]; ok {
		return v
	}
	return def
}

// boolean returns the variable name as strconv.ParseBool reads it, or
// def's value if it is not set.
func (e *env) boolean(name, def string) bool {
	b, err := strconv.ParseBool(e.str(name, def))
	if err != nil {
		e.fail(name, "not a boolean")
	}
	return b
}

// integer returns the variable name as an integer in [lo, hi], or def's
// value if it is not set.
func (e *env) integer(name, def string, lo, hi int64) int {
	n, err := strconv.ParseInt(e.str(name, def), 0, 64)
	switch {
	case err != nil:
		e.fail(name, "not an integer")
	case n < lo || n > hi:
		e.fail(name, fmt.Sprintf("outside [%d, %d]", lo, hi))
	}
	return int(n)
}

// float32 returns the variable name as a float32, or def's value.
func (e *env) float32(name, def string) float64 {
	f, err := strconv.ParseFloat(e.str(name, def), 32)
	if err != nil {
		e.fail(name, "not a number")
	}
	return f
}

// duration returns the variable name as a duration, or def's value.
func (e *env) duration(name, def string) time.Duration {
	d, err := time.ParseDuration(e.str(name, def))
	if err != nil {
		e.fail(name, "not a duration such as 90s or 1h")
	}
	return d
}

// hostPort joins the host and port variables.
func (e *env) hostPort(host, defHost, port, defPort string) string {
	p := e.integer(port, defPort, 0, 65535)
	return net.JoinHostPort(e.str(host, defHost), strconv.Itoa(p))
}

// logLevel reads a log level as the original does (logrus's names, in any
// case): trace and debug are slog.LevelDebug, info Info, warn and warning
// Warn, error, fatal and panic Error.
func (e *env) logLevel(name, def string) slog.Level {
	switch strings.ToLower(e.str(name, def)) {
	case "trace", "debug":
		return slog.LevelDebug
	case "info":
		return slog.LevelInfo
	case "warn", "warning":
		return slog.LevelWarn
	case "error", "fatal", "panic":
		return slog.LevelError
	}
	e.fail(name, "not a log level (debug, info, warn, error)")
	return slog.LevelInfo
}

// ignoredNames are the original's settings that FromEnv does not apply,
// and ignoredPrefixes the families of them.
var (
	ignoredNames = []string{
		"DISABLE_STATS", "EXPIRATION_JITTER_MAX_SECONDS", "EXTRA_TAGS",
		"FORCE_START_WITHOUT_INITIAL_CONFIG", "GRPC_CLIENT_TLS_CACERT", "GRPC_CLIENT_TLS_SAN",
		"GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "LOCAL_CACHE_SIZE_IN_BYTES",
		"PROMETHEUS_MAPPER_YAML", "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
		"REDIS_CLUSTER_PIPELINE_PARALLELISM", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
		"REDIS_PIPELINE_LIMIT", "REDIS_PIPELINE_WINDOW", "REDIS_POOL_ON_EMPTY_BEHAVIOR",
		"REDIS_POOL_ON_EMPTY_WAIT_DURATION", "REDIS_TIMEOUT", "RESPONSE_DYNAMIC_METADATA",
		"STATSD_HOST", "STATSD_PORT", "STATS_FLUSH_INTERVAL", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
		"USE_DOG_STATSD", "USE_DOG_STATSD_MOGRIFIERS", "USE_STATSD",
	}
	ignoredPrefixes = []string{
		"CONFIG_GRPC_XDS_", "DOG_STATSD_MOGRIFIER", "MEMCACHE_", "REDIS_PERSECOND",
		"REDIS_STARTUP_", "TRACING_", "XDS_CLIENT_",
	}
)

// ignored reports whether name is a setting of the original that FromEnv
// does not apply.
func ignored(name string) bool {
	if slices.Contains(ignoredNames, name) {
		return true
	}
	for _, p := range ignoredPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}
