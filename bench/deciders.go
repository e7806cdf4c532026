package bench

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/hybridlimit/hybrid"
)

// decider is one instance's limiter under test.
type decider interface {
	// decide asks for n tokens of key.
	decide(ctx context.Context, key string, n int64) (ok bool, src hybrid.Source, err error)
	// tracked returns the keys held in memory.
	tracked() int
	close(ctx context.Context) error
}

// hybridDecider is the hybrid Limiter, in the mode of lim.
type hybridDecider struct {
	l   *hybrid.Limiter
	lim hybrid.Limit
}

func (d *hybridDecider) decide(ctx context.Context, key string, n int64) (bool, hybrid.Source, error) {
	res, err := d.l.AllowN(ctx, key, d.lim, n)
	return res.Allowed, res.Source, err
}

func (d *hybridDecider) tracked() int { return d.l.Stats().Reconcile.Keys }

func (d *hybridDecider) close(ctx context.Context) error { return d.l.Close(ctx) }

// localDecider is a golang.org/x/time/rate limiter per key, in this
// instance alone.
type localDecider struct {
	lim   rate.Limit
	burst int
	m     sync.Map // key -> *rate.Limiter
	n     atomic.Int64
}

func (d *localDecider) decide(_ context.Context, key string, n int64) (bool, hybrid.Source, error) {
	v, ok := d.m.Load(key)
	if !ok {
		var loaded bool
		if v, loaded = d.m.LoadOrStore(key, rate.NewLimiter(d.lim, d.burst)); !loaded {
			d.n.Add(1)
		}
	}
	return v.(*rate.Limiter).AllowN(time.Now(), int(n)), hybrid.SourceLocal, nil
}

func (d *localDecider) tracked() int { return int(d.n.Load()) }

func (d *localDecider) close(context.Context) error { return nil }

// redisRateDecider is go-redis/redis_rate: GCRA in one script call, on
// the instance's client or on its automatic pipeline (ap).
type redisRateDecider struct {
	l   *redis_rate.Limiter
	lim redis_rate.Limit
	ap  *redis.AutoPipeliner // nil: the plain client
}

func (d *redisRateDecider) decide(ctx context.Context, key string, n int64) (bool, hybrid.Source, error) {
	res, err := d.l.AllowN(ctx, key, d.lim, int(n))
	if err != nil {
		return false, hybrid.SourceRedis, err
	}
	return res.Allowed > 0, hybrid.SourceRedis, nil
}

func (d *redisRateDecider) tracked() int { return 0 }

func (d *redisRateDecider) close(context.Context) error {
	if d.ap != nil {
		return d.ap.Close()
	}
	return nil
}

// gcraLimit returns the redis_rate limit of rate tokens per second and
// burst: per second if the rate is whole, else per 10^6 seconds.
func gcraLimit(r float64, burst int64) redis_rate.Limit {
	if r == math.Trunc(r) {
		return redis_rate.Limit{Rate: int(r), Burst: int(burst), Period: time.Second}
	}
	return redis_rate.Limit{Rate: int(math.Round(r * 1e6)), Burst: int(burst), Period: 1e6 * time.Second}
}
