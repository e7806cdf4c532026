package runner_test

import (
	"errors"
	"flag"
	"io"
	"log/slog"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/envoyrls/config"
	"github.com/hybridlimit/hybrid/envoyrls/rls"
	"github.com/hybridlimit/hybrid/envoyrls/runner"
)

// defaults is the Config of an empty environment: the original's
// defaults, but for the differences the package documentation lists.
func defaults() runner.Config {
	return runner.Config{
		GRPCAddr:              "0.0.0.0:8081",
		HTTPAddr:              "0.0.0.0:8080",
		DebugAddr:             "0.0.0.0:6070",
		MaxConnectionAge:      24 * time.Hour,
		MaxConnectionAgeGrace: time.Hour,
		ConfigDir:             "/srv/runtime_data/current/config",
		NearLimitRatio:        float64(float32(0.8)),
		LogLevel:              slog.LevelInfo,
		Redis:                 runner.Redis{Type: "SINGLE", Network: "unix", PoolSize: 10},
		HeapFloor:             runner.DefaultHeapFloor,
	}
}

// TestFromEnv reads the original's settings.
func TestFromEnv(t *testing.T) {
	for _, c := range []struct {
		name string
		env  []string
		want func(*runner.Config)
	}{
		{"empty", nil, func(*runner.Config) {}},
		{"addresses", []string{"HOST=127.0.0.1", "PORT=9000", "DEBUG_HOST=::1", "DEBUG_PORT=0x1770", "GRPC_HOST=localhost", "GRPC_PORT=9001"},
			func(c *runner.Config) {
				c.HTTPAddr, c.DebugAddr, c.GRPCAddr = "127.0.0.1:9000", "[::1]:6000", "localhost:9001"
			}},
		{"unix socket", []string{"GRPC_UDS=/tmp/rl.sock", "GRPC_PORT=1"}, func(c *runner.Config) { c.GRPCAddr = "unix:/tmp/rl.sock" }},
		{"connection age", []string{"GRPC_MAX_CONNECTION_AGE=10m", "GRPC_MAX_CONNECTION_AGE_GRACE=30s"},
			func(c *runner.Config) { c.MaxConnectionAge, c.MaxConnectionAgeGrace = 10*time.Minute, 30*time.Second }},
		{"runtime", []string{"RUNTIME_ROOT=/data/current", "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_APPDIRECTORY=conf",
			"RUNTIME_IGNOREDOTFILES=true", "RUNTIME_WATCH_ROOT=false", "MERGE_DOMAIN_CONFIG=1"},
			func(c *runner.Config) {
				c.ConfigDir = "/data/current/ratelimit/conf"
				c.Options = config.Options{IgnoreDotFiles: true, MergeDomains: true}
			}},
		{"runtime root only", []string{"RUNTIME_ROOT=/data"}, func(c *runner.Config) { c.ConfigDir = "/data/config" }},
		{"GOGC set: no heap floor", []string{"GOGC=200"}, func(c *runner.Config) { c.HeapFloor = 0 }},
		{"empty subdirectory set", []string{"RUNTIME_SUBDIRECTORY="}, func(*runner.Config) {}},
		{"modes", []string{"SHADOW_MODE=t", "QUOTA_MODE=TRUE", "NEAR_LIMIT_RATIO=0.5", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true"},
			func(c *runner.Config) {
				c.ShadowMode, c.QuotaMode, c.NearLimitRatio, c.HealthyWithConfig = true, true, 0.5, true
			}},
		{"near limit ratio 0", []string{"NEAR_LIMIT_RATIO=0"}, func(c *runner.Config) { c.NearLimitRatio = math.SmallestNonzeroFloat32 }},
		{"headers", []string{"LIMIT_RESPONSE_HEADERS_ENABLED=true", "LIMIT_REMAINING_HEADER=X-Left"},
			func(c *runner.Config) {
				c.Headers = &rls.Headers{Limit: "RateLimit-Limit", Remaining: "X-Left", Reset: "RateLimit-Reset"}
			}},
		{"headers off", []string{"LIMIT_REMAINING_HEADER=X-Left"}, func(*runner.Config) {}},
		{"logging", []string{"LOG_LEVEL=WARNING", "LOG_FORMAT=JSON"}, func(c *runner.Config) { c.LogLevel, c.LogJSON = slog.LevelWarn, true }},
		{"log level trace", []string{"LOG_LEVEL=trace"}, func(c *runner.Config) { c.LogLevel = slog.LevelDebug }},
		{"prometheus", []string{"USE_PROMETHEUS=true"}, func(c *runner.Config) { c.PrometheusAddr, c.PrometheusPath = ":9090", "/metrics" }},
		{"prometheus off", []string{"PROMETHEUS_ADDR=:1"}, func(*runner.Config) {}},
		{"redis single", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=redis:6379", "REDIS_AUTH=user:pa:ss", "REDIS_POOL_SIZE=20",
			"REDIS_TLS=true", "REDIS_TLS_CACERT=/ca.pem", "REDIS_TLS_CLIENT_CERT=/c.pem", "REDIS_TLS_CLIENT_KEY=/k.pem",
			"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true", "CACHE_KEY_PREFIX=rl"},
			func(c *runner.Config) {
				c.Redis = runner.Redis{Type: "SINGLE", Network: "tcp", URL: "redis:6379", Auth: "user:pa:ss", PoolSize: 20,
					TLS: true, TLSCACert: "/ca.pem", TLSClientCert: "/c.pem", TLSClientKey: "/k.pem", TLSSkipHostnameVerification: true}
				c.KeyPrefix = "rl"
			}},
		{"redis sentinel", []string{"REDIS_TYPE=sentinel", "REDIS_URL=mymaster,s1:26379,s2:26379", "REDIS_SENTINEL_AUTH=secret"},
			func(c *runner.Config) {
				c.Redis.Type, c.Redis.URL, c.Redis.SentinelAuth = "sentinel", "mymaster,s1:26379,s2:26379", "secret"
			}},
		{"ignored", []string{"USE_STATSD=false", "REDIS_PERSECOND=true", "REDIS_PERSECOND_URL=x", "TRACING_ENABLED=true", "UNRELATED=1"},
			func(c *runner.Config) {
				c.Ignored = []string{"REDIS_PERSECOND", "REDIS_PERSECOND_URL", "TRACING_ENABLED", "USE_STATSD"}
			}},
		{"backend redis", []string{"BACKEND_TYPE=redis", "CONFIG_TYPE=FILE"}, func(*runner.Config) {}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := runner.FromEnv(c.env)
			if err != nil {
				t.Fatalf("FromEnv(%q): %v", c.env, err)
			}
			want := defaults()
			c.want(&want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("FromEnv(%q) =\n%+v\nwant\n%+v", c.env, got, want)
			}
		})
	}
}

// TestFromEnvErrors: a setting that does not parse, or that the service
// cannot honour, is an error that names it.
func TestFromEnvErrors(t *testing.T) {
	for _, env := range []string{
		"PORT=http", "PORT=", "GRPC_PORT=70000", "DEBUG_PORT=-1",
		"SHADOW_MODE=yes", "RUNTIME_IGNOREDOTFILES=", "RUNTIME_WATCH_ROOT=maybe",
		"LOG_LEVEL=loud", "GRPC_MAX_CONNECTION_AGE=5", "NEAR_LIMIT_RATIO=much",
		"REDIS_POOL_SIZE=-1", "REDIS_TLS=on",
		"BACKEND_TYPE=memcache", "CONFIG_TYPE=GRPC_XDS_SOTW", "GRPC_SERVER_USE_TLS=true",
		"USE_PROMETHEUS=true PROMETHEUS_PATH=metrics",
	} {
		vars := strings.Fields(env)
		_, err := runner.FromEnv(vars)
		name, _, _ := strings.Cut(vars[len(vars)-1], "=")
		if !errors.Is(err, runner.ErrConfig) || !strings.Contains(err.Error(), name+"=") {
			t.Errorf("FromEnv(%q) = %v, want an ErrConfig naming %s", vars, err, name)
		}
	}
}

// TestFlags: flags override the environment, and show its values as their
// defaults.
func TestFlags(t *testing.T) {
	env := []string{"GRPC_PORT=9001", "REDIS_SOCKET_TYPE=unix", "REDIS_URL=/run/redis.sock", "RUNTIME_ROOT=/data"}
	for _, c := range []struct {
		args []string
		want func(*runner.Config)
	}{
		{nil, func(*runner.Config) {}},
		{[]string{"-grpc", "127.0.0.1:0", "-http", "127.0.0.1:1", "-debug", "127.0.0.1:2", "-config", "/etc/rl"},
			func(c *runner.Config) {
				c.GRPCAddr, c.HTTPAddr, c.DebugAddr, c.ConfigDir = "127.0.0.1:0", "127.0.0.1:1", "127.0.0.1:2", "/etc/rl"
			}},
		{[]string{"-redis", "127.0.0.1:6379"}, func(c *runner.Config) { c.Redis.URL, c.Redis.Network = "127.0.0.1:6379", "tcp" }},
		{[]string{"-redis", "/tmp/r.sock"}, func(c *runner.Config) { c.Redis.URL, c.Redis.Network = "/tmp/r.sock", "unix" }},
		{[]string{"-mode", "OPTIMISTIC"}, func(c *runner.Config) { c.Mode = hybrid.Optimistic }},
		{[]string{"-mode", "exact"}, func(c *runner.Config) { c.Mode = hybrid.Exact }},
		{[]string{"-independent"}, func(c *runner.Config) { c.Independent = true }},
		{[]string{"-fallback", "failopen"}, func(c *runner.Config) { c.Fallback = hybrid.FailOpen }},
		{[]string{"-fallback", "FailClosed"}, func(c *runner.Config) { c.Fallback = hybrid.FailClosed }},
		{[]string{"-fallback", "static:2.5,10"}, func(c *runner.Config) { c.Fallback = hybrid.Static(hybrid.Limit{Rate: 2.5, Burst: 10}) }},
		{[]string{"-max-keys", "5000", "-max-series", "7", "-reload-interval", "250ms", "-redis-timeout", "20ms",
			"-cold-wait", "30ms", "-refill-pace", "5ms", "-drain-timeout", "3s"},
			func(c *runner.Config) {
				c.MaxKeys, c.MaxSeries, c.ReloadInterval = 5000, 7, 250*time.Millisecond
				c.RedisTimeout, c.ColdWait, c.DrainTimeout = 20*time.Millisecond, 30*time.Millisecond, 3*time.Second
				c.RefillPace = 5 * time.Millisecond
			}},
		{[]string{"-heap-floor", "0"}, func(c *runner.Config) { c.HeapFloor = 0 }},
		{[]string{"-heap-floor", "128MiB"}, func(c *runner.Config) { c.HeapFloor = 128 << 20 }},
		{[]string{"-heap-floor", "2gib"}, func(c *runner.Config) { c.HeapFloor = 2 << 30 }},
		{[]string{"-heap-floor", "1000"}, func(c *runner.Config) { c.HeapFloor = 1000 }},
		{[]string{"-heap-floor", "5 KiB"}, func(c *runner.Config) { c.HeapFloor = 5 << 10 }},
		{[]string{"-heap-floor", "7B"}, func(c *runner.Config) { c.HeapFloor = 7 }},
	} {
		cfg, err := runner.FromEnv(env)
		if err != nil {
			t.Fatal(err)
		}
		want := cfg
		c.want(&want)
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		cfg.Flags(fs)
		if err := fs.Parse(c.args); err != nil {
			t.Errorf("Parse(%q): %v", c.args, err)
			continue
		}
		if !reflect.DeepEqual(cfg, want) {
			t.Errorf("after %q:\n%+v\nwant\n%+v", c.args, cfg, want)
		}
	}

	cfg, _ := runner.FromEnv(env)
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	cfg.Flags(fs)
	for name, want := range map[string]string{"grpc": "0.0.0.0:9001", "redis": "/run/redis.sock", "config": "/data/config", "mode": "lease", "fallback": "localshare", "heap-floor": "32MiB"} {
		if got := fs.Lookup(name).DefValue; got != want {
			t.Errorf("-%s default %q, want %q", name, got, want)
		}
	}

	for _, args := range [][]string{
		{"-mode", "strict"}, {"-fallback", "open"}, {"-fallback", "static:1"}, {"-fallback", "static:0,5"},
		{"-fallback", "static:1,0"}, {"-max-keys", "many"},
		{"-heap-floor", "-1"}, {"-heap-floor", "64MB"}, {"-heap-floor", "MiB"}, {"-heap-floor", "9000000000GiB"},
	} {
		cfg, _ := runner.FromEnv(nil)
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cfg.Flags(fs)
		if err := fs.Parse(args); err == nil {
			t.Errorf("Parse(%q) succeeded", args)
		}
	}
}
