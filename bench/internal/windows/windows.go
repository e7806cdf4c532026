// Package windows holds reference implementations of three window rate
// limiters on Redis, each one atomic Lua script written the way a careful
// user writes it: a fixed window (INCRBY and PEXPIRE), a sliding log
// (ZREMRANGEBYSCORE, ZCARD, ZADD with unique members and PEXPIRE) and a
// sliding-window counter (two counts, the previous one weighted by the part
// of its window that the sliding window still covers). Unscripted is the
// fixed window without a script, GET then INCRBY, to show what a race
// costs.
//
// The package is internal to the bench: it is what docs/windows.md measures
// hybrid's token bucket and go-redis/redis_rate's GCRA against, not part of
// hybrid's API, and not meant for production use.
//
// A limit is Count requests per Window. The scripts read the clock from
// Redis TIME, so the clocks of the callers do not matter; tests fix it with
// miniredis's SetTime (and FastForward, which expires keys).
package windows

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Algorithm is one of the window algorithms the scripts implement.
type Algorithm int

// The algorithms.
const (
	// FixedWindow counts per window of the clock, windows aligned on
	// multiples of the window's length since the Unix epoch: up to Count
	// just before a boundary and Count again just after it.
	FixedWindow Algorithm = iota + 1
	// SlidingLog keeps one entry per admitted token and counts those of the
	// last Window: never more than Count in any Window, for memory that
	// grows with Count.
	SlidingLog
	// SlidingCounter keeps the counts of the current and the previous fixed
	// window, and weighs the previous one by the part of it that the sliding
	// window still covers.
	SlidingCounter
)

// String returns the algorithm's name: "fixed", "log" or "counter".
func (a Algorithm) String() string {
	switch a {
	case FixedWindow:
		return "fixed"
	case SlidingLog:
		return "log"
	case SlidingCounter:
		return "counter"
	}
	return fmt.Sprintf("Algorithm(%d)", int(a))
}

// Limit is a window limit: at most Count requests (tokens) per Window.
// Window is a whole number of milliseconds, at least one.
type Limit struct {
	Count  int64
	Window time.Duration
}

// maxInt is where the scripts' doubles stop being exact integers.
const maxInt = 1<<53 - 1

// Errors for misuse, reported before Redis is touched, and for a reply the
// scripts would not send.
var (
	// ErrInvalidLimit reports a Limit with a Count below 1, a Window that is
	// not a whole number of milliseconds (at least one), or Count times the
	// milliseconds at 2^53 or more.
	ErrInvalidLimit = errors.New("windows: invalid limit")
	// ErrInvalidCost reports a cost below 1 or above the limit's Count.
	ErrInvalidCost = errors.New("windows: invalid cost")
	// ErrReply wraps a script reply other than four integers.
	ErrReply = errors.New("windows: garbled script reply")
)

// check validates lim and a cost of n, and returns the window in
// milliseconds.
func (lim Limit) check(n int64) (int64, error) {
	ms := lim.Window.Milliseconds()
	switch {
	case lim.Count < 1 || ms < 1 || time.Duration(ms)*time.Millisecond != lim.Window || ms >= 1<<40:
		return 0, fmt.Errorf("%w: %d per %v (want a count of at least 1 per a whole number of milliseconds)", ErrInvalidLimit, lim.Count, lim.Window)
	case lim.Count > maxInt/ms:
		return 0, fmt.Errorf("%w: %d per %v (count times milliseconds must be below 2^53)", ErrInvalidLimit, lim.Count, lim.Window)
	case n < 1 || n > lim.Count:
		return 0, fmt.Errorf("%w: %d (want 1 to %d)", ErrInvalidCost, n, lim.Count)
	}
	return ms, nil
}

// Result is a decision.
type Result struct {
	// Allowed reports whether the request was admitted.
	Allowed bool
	// Count is what the window holds after the decision: the requests of
	// the current window (FixedWindow), of the last Window (SlidingLog), or
	// the weighted count, rounded up (SlidingCounter).
	Count int64
	// RetryAfter is 0 if Allowed, else how long until the request would be
	// admitted (for SlidingCounter, an estimate: the weighted count may be
	// too high for it still).
	RetryAfter time.Duration
	// Now is the time of the decision: Redis TIME, to the millisecond, or
	// the caller's clock for Unscripted.
	Now time.Time
}

// Limiter decides requests with one of the scripts. It holds no state
// besides its configuration and is safe for concurrent use. Create one with
// New; the zero Limiter is not usable.
type Limiter struct {
	alg    Algorithm
	rdb    redis.Scripter
	script *redis.Script
	prefix string // "win:" + alg + ":{"
}

// New returns a Limiter of alg that keeps its keys in rdb.
func New(rdb redis.Scripter, alg Algorithm) (*Limiter, error) {
	var src string
	switch alg {
	case FixedWindow:
		src = fixedLua
	case SlidingLog:
		src = logLua
	case SlidingCounter:
		src = counterLua
	default:
		return nil, fmt.Errorf("windows: unknown %v", alg)
	}
	if rdb == nil {
		return nil, errors.New("windows: nil client")
	}
	return &Limiter{alg: alg, rdb: rdb, script: redis.NewScript(src), prefix: "win:" + alg.String() + ":{"}, nil
}

// Algorithm returns the Limiter's algorithm.
func (l *Limiter) Algorithm() Algorithm { return l.alg }

// Key returns the Redis key of key's window: "win:", the algorithm, ":{",
// key and "}", so that it is hash-tagged by key.
func (l *Limiter) Key(key string) string { return l.prefix + key + "}" }

// Allow admits a request of n tokens (1 for one request) for key under lim
// if the window has room for it, in one script call. A denial is a Result,
// not an error; errors are for invalid arguments (ErrInvalidLimit,
// ErrInvalidCost), for Redis failing and for a reply wrapping ErrReply.
func (l *Limiter) Allow(ctx context.Context, key string, lim Limit, n int64) (Result, error) {
	ms, err := lim.check(n)
	if err != nil {
		return Result{}, err
	}
	if err := checkKey(key); err != nil {
		return Result{}, err
	}
	v, err := l.script.Run(ctx, l.rdb, []string{l.Key(key)}, lim.Count, ms, n).Result()
	if err != nil {
		return Result{}, fmt.Errorf("windows: %v %q: %w", l.alg, key, err)
	}
	res, err := parseReply(v)
	if err != nil {
		return Result{}, fmt.Errorf("windows: %v %q: %w", l.alg, key, err)
	}
	return res, nil
}

// checkKey reports a key that is empty or holds a brace, which would
// change the hash tag of its Redis key.
func checkKey(key string) error {
	if key == "" || strings.ContainsAny(key, "{}") {
		return fmt.Errorf("windows: key %q: empty or has a brace", key)
	}
	return nil
}

// parseReply reads a script's reply {allowed, count, retry_ms, now_ms}.
func parseReply(v any) (Result, error) {
	a, ok := v.([]any)
	if !ok || len(a) != 4 {
		return Result{}, fmt.Errorf("%w: got %v, want 4 integers", ErrReply, v)
	}
	var x [4]int64
	for i, e := range a {
		if x[i], ok = e.(int64); !ok || x[i] < 0 {
			return Result{}, fmt.Errorf("%w: value %d is %v, want an integer of at least 0", ErrReply, i, e)
		}
	}
	if x[0] > 1 {
		return Result{}, fmt.Errorf("%w: allowed is %d", ErrReply, x[0])
	}
	return Result{
		Allowed:    x[0] == 1,
		Count:      x[1],
		RetryAfter: time.Duration(x[2]) * time.Millisecond,
		Now:        time.UnixMilli(x[3]),
	}, nil
}
