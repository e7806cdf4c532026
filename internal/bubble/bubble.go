// Package bubble runs tests of a hybrid.Limiter on miniredis inside a
// testing/synctest bubble, with Redis TIME following the bubble's fake
// clock: time moves only when every goroutine of the bubble waits, and the
// limiter's buckets in Redis refill by the same clock.
package bubble

import (
	"cmp"
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/reconcile"
)

// Clock is a go-redis hook that sets M's TIME to the caller's clock before
// every command: inside a synctest bubble, the bubble's fake clock.
type Clock struct{ M *miniredis.Miniredis }

// DialHook leaves dials as they are.
func (c Clock) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook sets M's time before a command.
func (c Clock) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.M.SetTime(time.Now())
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook sets M's time before a pipeline.
func (c Clock) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.M.SetTime(time.Now())
		return next(ctx, cmds)
	}
}

// Run starts miniredis (outside the bubble: its goroutines wait on the
// network), then runs test in a synctest bubble with a Limiter configured
// by cfg on it, whose Redis clock is the bubble's, once its first heartbeat
// is done and a millisecond has passed (a clock's very first reading, 0,
// would read as no time at all). The Limiter's rounds come on the sync
// interval, unless cfg sets FirstRound. It closes the Limiter and its client when
// test returns, inside the bubble.
func Run(t *testing.T, cfg hybrid.Config, test func(t *testing.T, lim *hybrid.Limiter)) {
	t.Helper()
	m := miniredis.RunT(t)
	synctest.Test(t, func(t *testing.T) {
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
		rdb.AddHook(Clock{m})
		if cfg.FirstRound == 0 { // rounds on the interval, as the tests time them
			cfg.FirstRound = cmp.Or(cfg.SyncInterval, reconcile.DefaultSyncInterval)
		}
		lim, err := hybrid.New(rdb, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer rdb.Close()
		defer lim.Close(context.Background()) // Close is idempotent
		synctest.Wait()
		time.Sleep(time.Millisecond)
		test(t, lim)
	})
}
