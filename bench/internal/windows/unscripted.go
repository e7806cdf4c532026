package windows

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Client is what Unscripted needs from go-redis: GET, and MULTI/EXEC.
// redis.UniversalClient satisfies it.
type Client interface {
	Get(ctx context.Context, key string) *redis.StringCmd
	TxPipeline() redis.Pipeliner
}

// Unscripted is the fixed window without a script, as the rate-limiter
// pattern of Redis's INCR documentation writes it: GET the count of the
// window's key (named by the window, from the caller's clock), and if there
// is room, INCRBY and PEXPIRE it in one MULTI/EXEC. The GET and the INCRBY
// are two round trips: clients that read the same count between them all
// admit, and the window holds more than its limit. It is safe for
// concurrent use, as a race is. Create one with NewUnscripted; the zero
// Unscripted is not usable.
type Unscripted struct {
	rdb Client
}

// NewUnscripted returns an Unscripted that keeps its keys in rdb.
func NewUnscripted(rdb Client) (*Unscripted, error) {
	if rdb == nil {
		return nil, errors.New("windows: nil client")
	}
	return &Unscripted{rdb: rdb}, nil
}

// Key returns the Redis key of key's window that holds now:
// "win:getincr:{key}:" and the window's index since the Unix epoch. A
// Window under a millisecond counts as one.
func (u *Unscripted) Key(key string, lim Limit, now time.Time) string {
	ms := max(lim.Window.Milliseconds(), 1)
	return "win:getincr:{" + key + "}:" + strconv.FormatInt(now.UnixMilli()/ms, 10)
}

// Allow admits a request of n tokens for key under lim if the window that
// holds now, by the caller's clock, had room for it when its count was
// read. Its errors are Limiter.Allow's.
func (u *Unscripted) Allow(ctx context.Context, now time.Time, key string, lim Limit, n int64) (Result, error) {
	ms, err := lim.check(n)
	if err != nil {
		return Result{}, err
	}
	if err := checkKey(key); err != nil {
		return Result{}, err
	}
	k := u.Key(key, lim, now)
	count, err := u.rdb.Get(ctx, k).Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return Result{}, fmt.Errorf("windows: getincr %q: %w", key, err)
	}
	if count+n > lim.Count {
		left := ms - now.UnixMilli()%ms
		return Result{Count: count, RetryAfter: time.Duration(left) * time.Millisecond, Now: now}, nil
	}
	tx := u.rdb.TxPipeline()
	incr := tx.IncrBy(ctx, k, n)
	tx.PExpire(ctx, k, lim.Window)
	if _, err := tx.Exec(ctx); err != nil {
		return Result{}, fmt.Errorf("windows: getincr %q: %w", key, err)
	}
	return Result{Allowed: true, Count: incr.Val(), Now: now}, nil
}
