package runner

import (
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/hybridlimit/hybrid"
)

// Flags defines on fs the command-line flags of hybrid-rls, each bound to
// a field of c and defaulting to its value, so that flags parsed after
// FromEnv override the environment:
//
//	-config DIR          the configuration directory (ConfigDir)
//	-redis URL           REDIS_URL; a single Redis's socket type follows it:
//	                     a path starting with / is a Unix socket, else TCP
//	-grpc ADDR           GRPCAddr ("unix:/path" for a Unix socket)
//	-http ADDR           HTTPAddr
//	-debug ADDR          DebugAddr
//	-mode MODE           lease, optimistic or exact (Mode)
//	-fallback POLICY     localshare, failopen, failclosed or static:RATE,BURST
//	                     (RATE tokens a second, BURST tokens; Fallback)
//	-independent         each descriptor decided on its own, as the
//	                     original does (Independent)
//	-max-keys N          MaxKeys
//	-max-series N        MaxSeries
//	-reload-interval D   ReloadInterval
//	-redis-timeout D     RedisTimeout
//	-cold-wait D         ColdWait
//	-refill-pace D       RefillPace
//	-drain-timeout D     DrainTimeout
//	-heap-floor SIZE     HeapFloor: bytes, or with a unit KiB, MiB or GiB;
//	                     0 for none
func (c *Config) Flags(fs *flag.FlagSet) {
	fs.StringVar(&c.ConfigDir, "config", c.ConfigDir, "`DIR` of the configuration files, watched for changes")
	fs.Var(redisValue{&c.Redis}, "redis", "Redis `URL` as REDIS_URL reads it (default: an embedded, in-memory Redis)")
	fs.StringVar(&c.GRPCAddr, "grpc", c.GRPCAddr, "`ADDR` of the gRPC service (unix:/path for a Unix socket)")
	fs.StringVar(&c.HTTPAddr, "http", c.HTTPAddr, "`ADDR` of /healthcheck, /json and /metrics")
	fs.StringVar(&c.DebugAddr, "debug", c.DebugAddr, "`ADDR` of /rlconfig, /stats and /debug/pprof/")
	fs.Var(modeValue{&c.Mode}, "mode", "settlement `MODE` of the limits that name none: lease, optimistic or exact")
	fs.Var(&fallbackValue{f: &c.Fallback, text: fallbackText(c.Fallback)}, "fallback",
		"`POLICY` while Redis is unreachable: localshare, failopen, failclosed or static:RATE,BURST")
	fs.BoolVar(&c.Independent, "independent", c.Independent, "decide each descriptor of a request on its own, as envoyproxy/ratelimit does (default: all or nothing)")
	fs.IntVar(&c.MaxKeys, "max-keys", c.MaxKeys, "most buckets kept in memory (0: 100000)")
	fs.IntVar(&c.MaxSeries, "max-series", c.MaxSeries, "most label sets of the per-descriptor metrics (0: 10000)")
	fs.DurationVar(&c.ReloadInterval, "reload-interval", c.ReloadInterval, "how often the configuration directory is checked (0: 1s)")
	fs.DurationVar(&c.RedisTimeout, "redis-timeout", c.RedisTimeout, "least deadline of a Redis call (0: 50ms)")
	fs.DurationVar(&c.ColdWait, "cold-wait", c.ColdWait, "longest a request waits for Redis (0: the Redis timeout)")
	fs.DurationVar(&c.RefillPace, "refill-pace", c.RefillPace, "how much of a saturated descriptor's refill is asked of Redis at once (0: 50ms)")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", c.DrainTimeout, "longest the calls under way are drained at shutdown (0: 10s)")
	fs.Var(sizeValue{&c.HeapFloor}, "heap-floor", "`SIZE` the heap may grow to before the garbage collector runs, while GOGC=100 would run it sooner (bytes, KiB, MiB or GiB; 0: none, GOGC alone; default 32MiB unless GOGC is set)")
}

// sizeValue is a flag of a size in bytes: a number, optionally followed by
// B, KiB, MiB or GiB.
type sizeValue struct{ n *int64 }

// sizeUnits are the units of a size, largest first.
var sizeUnits = []struct {
	name  string
	shift uint
}{{"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}}

// String returns the size in the largest unit that divides it; 0 as 0.
func (v sizeValue) String() string {
	if v.n == nil {
		return ""
	}
	n := *v.n
	for _, u := range sizeUnits {
		if n != 0 && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}

// Set parses a size.
func (v sizeValue) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	*v.n = n
	return nil
}

// parseSize parses a number of bytes, optionally followed by B, KiB, MiB
// or GiB (in any case).
func parseSize(s string) (int64, error) {
	num, shift := s, uint(0)
	for _, u := range sizeUnits {
		if len(s) >= len(u.name) && strings.EqualFold(s[len(s)-len(u.name):], u.name) {
			num, shift = s[:len(s)-len(u.name)], u.shift
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64>>shift {
		return 0, fmt.Errorf("%q is not a size: want bytes, or a number with KiB, MiB or GiB", s)
	}
	return n << shift, nil
}

// redisValue is the -redis flag.
type redisValue struct{ r *Redis }

// String returns the URL.
func (v redisValue) String() string {
	if v.r == nil {
		return ""
	}
	return v.r.URL
}

// Set sets the URL, and the socket type of a single Redis from its form.
func (v redisValue) Set(s string) error {
	v.r.URL = s
	v.r.Network = "tcp"
	if strings.HasPrefix(s, "/") {
		v.r.Network = "unix"
	}
	return nil
}

// modeValue is the -mode flag.
type modeValue struct{ m *hybrid.Mode }

// String returns the mode's name.
func (v modeValue) String() string {
	if v.m == nil {
		return ""
	}
	return v.m.String()
}

// Set parses a mode's name, in any case.
func (v modeValue) Set(s string) error {
	m, err := parseMode(s)
	if err != nil {
		return err
	}
	*v.m = m
	return nil
}

// parseMode parses lease, optimistic or exact, in any case.
func parseMode(s string) (hybrid.Mode, error) {
	for _, m := range []hybrid.Mode{hybrid.Lease, hybrid.Optimistic, hybrid.Exact} {
		if strings.EqualFold(s, m.String()) {
			return m, nil
		}
	}
	return 0, fmt.Errorf("%q is not lease, optimistic or exact", s)
}

// fallbackValue is the -fallback flag; text is its value as given.
type fallbackValue struct {
	f    *hybrid.Fallback
	text string
}

// String returns the policy as it was given.
func (v *fallbackValue) String() string { return v.text }

// Set parses a policy.
func (v *fallbackValue) Set(s string) error {
	f, err := parseFallback(s)
	if err != nil {
		return err
	}
	*v.f, v.text = f, s
	return nil
}

// fallbackText names the three policies without a parameter as -fallback
// spells them.
func fallbackText(f hybrid.Fallback) string {
	switch f {
	case hybrid.LocalShare:
		return "localshare"
	case hybrid.FailOpen:
		return "failopen"
	case hybrid.FailClosed:
		return "failclosed"
	}
	return f.String()
}

// parseFallback parses localshare, failopen, failclosed (in any case) or
// static:RATE,BURST.
func parseFallback(s string) (hybrid.Fallback, error) {
	switch strings.ToLower(s) {
	case "localshare":
		return hybrid.LocalShare, nil
	case "failopen":
		return hybrid.FailOpen, nil
	case "failclosed":
		return hybrid.FailClosed, nil
	}
	spec, ok := strings.CutPrefix(strings.ToLower(s), "static:")
	if !ok {
		return hybrid.Fallback{}, fmt.Errorf("%q is not localshare, failopen, failclosed or static:RATE,BURST", s)
	}
	rate, burst, ok := strings.Cut(spec, ",")
	r, err1 := strconv.ParseFloat(rate, 64)
	b, err2 := strconv.ParseInt(burst, 10, 64)
	if !ok || err1 != nil || err2 != nil || !(r > 0) || b < 1 {
		return hybrid.Fallback{}, fmt.Errorf("%q: want static:RATE,BURST with RATE tokens a second above 0 and BURST tokens at least 1", s)
	}
	return hybrid.Static(hybrid.Limit{Rate: r, Burst: b}), nil
}
