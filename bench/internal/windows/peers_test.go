package windows

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid"
)

// The limiters compared on a real redis-server, side by side, in one run:
// the three window scripts, the fixed window without a script, go-redis's
// redis_rate (GCRA), and hybrid's Limiter in Exact and Lease mode.

// envFull, set to "full", makes the real-Redis measurements run at the
// sizes docs/windows.md quotes; unset, they run small, as a check.
const envFull = "HYBRID_WINDOWS"

// full reports whether HYBRID_WINDOWS is "full".
func full() bool { return os.Getenv(envFull) == "full" }

// spec is a limit as each algorithm is given it: Count per Window for the
// windows, and for the token buckets a rate of Count per Window and a burst
// of Burst.
type spec struct {
	Count  int64
	Window time.Duration
	Burst  int64
}

// rate returns the spec's rate in tokens per second.
func (s spec) rate() float64 { return float64(s.Count) / s.Window.Seconds() }

// peer is one instance of a limiter: it asks for one token of a key.
type peer interface {
	// allow reports whether the token was given, and the time the
	// algorithm decided by: Redis TIME for the window scripts, the
	// caller's clock for the others (for redis_rate and hybrid, read when
	// the answer came).
	allow(ctx context.Context, key string) (ok bool, at time.Time, err error)
	close(ctx context.Context) error
}

// contender is a limiter under comparison.
type contender struct {
	name string
	// top names the commands its clients send, as INFO commandstats names
	// them; the others Redis counts ran inside them (scripts, MULTI).
	top []string
	// peer returns one instance of it on rdb, an instance of a fleet of n.
	peer func(rdb *redis.Client, s spec, id, n int) (peer, error)
}

// scripts are the commands that run a script.
var scripts = []string{"evalsha", "eval"}

// contenders are the limiters compared, in the order of the tables.
var contenders = []contender{
	{"fixed window", scripts, windowPeer(FixedWindow)},
	{"sliding log", scripts, windowPeer(SlidingLog)},
	{"sliding counter", scripts, windowPeer(SlidingCounter)},
	{"fixed, GET+INCR", []string{"get", "multi", "exec"}, unscriptedPeer},
	{"GCRA (redis_rate)", scripts, gcraPeer},
	{"token bucket exact", scripts, hybridPeer(hybrid.Exact)},
	{"token bucket lease", scripts, hybridPeer(hybrid.Lease)},
}

// windowsPeer asks a window script.
type windowsPeer struct {
	l   *Limiter
	lim Limit
}

func windowPeer(alg Algorithm) func(*redis.Client, spec, int, int) (peer, error) {
	return func(rdb *redis.Client, s spec, _, _ int) (peer, error) {
		l, err := New(rdb, alg)
		return &windowsPeer{l: l, lim: Limit{s.Count, s.Window}}, err
	}
}

func (p *windowsPeer) allow(ctx context.Context, key string) (bool, time.Time, error) {
	res, err := p.l.Allow(ctx, key, p.lim, 1)
	return res.Allowed, res.Now, err
}

func (p *windowsPeer) close(context.Context) error { return nil }

// getIncrPeer asks the fixed window without a script.
type getIncrPeer struct {
	u   *Unscripted
	lim Limit
}

func unscriptedPeer(rdb *redis.Client, s spec, _, _ int) (peer, error) {
	u, err := NewUnscripted(rdb)
	return &getIncrPeer{u: u, lim: Limit{s.Count, s.Window}}, err
}

func (p *getIncrPeer) allow(ctx context.Context, key string) (bool, time.Time, error) {
	res, err := p.u.Allow(ctx, time.Now(), key, p.lim, 1)
	return res.Allowed, res.Now, err
}

func (p *getIncrPeer) close(context.Context) error { return nil }

// redisRatePeer asks go-redis/redis_rate.
type redisRatePeer struct {
	l   *redis_rate.Limiter
	lim redis_rate.Limit
}

func gcraPeer(rdb *redis.Client, s spec, _, _ int) (peer, error) {
	return &redisRatePeer{
		l:   redis_rate.NewLimiter(rdb),
		lim: redis_rate.Limit{Rate: int(s.Count), Burst: int(s.Burst), Period: s.Window},
	}, nil
}

func (p *redisRatePeer) allow(ctx context.Context, key string) (bool, time.Time, error) {
	res, err := p.l.Allow(ctx, key, p.lim)
	if err != nil {
		return false, time.Time{}, err
	}
	return res.Allowed > 0, time.Now(), nil
}

func (p *redisRatePeer) close(context.Context) error { return nil }

// hybridLimiterPeer asks a hybrid Limiter.
type hybridLimiterPeer struct {
	l   *hybrid.Limiter
	lim hybrid.Limit
}

func hybridPeer(mode hybrid.Mode) func(*redis.Client, spec, int, int) (peer, error) {
	return func(rdb *redis.Client, s spec, id, n int) (peer, error) {
		l, err := hybrid.New(rdb, hybrid.Config{Instances: n, InstanceID: fmt.Sprintf("i%d", id)})
		if err != nil {
			return nil, err
		}
		return &hybridLimiterPeer{l: l, lim: hybrid.Limit{Rate: s.rate(), Burst: s.Burst, Mode: mode}}, nil
	}
}

func (p *hybridLimiterPeer) allow(ctx context.Context, key string) (bool, time.Time, error) {
	res, err := p.l.Allow(ctx, key, p.lim)
	return res.Allowed, time.Now(), err
}

func (p *hybridLimiterPeer) close(ctx context.Context) error { return p.l.Close(ctx) }
