package global

import (
	"context"
	"fmt"
	"time"

	"github.com/hybridlimit/hybrid/internal/limit"
)

// Peek reports what Allow(ctx, key, lim, n) would decide now, and takes
// nothing: Allowed reports whether the bucket holds n tokens, Remaining is
// what it holds, RetryAfter how long until it holds n (0 if it does). n may
// be 0, for the bucket's state alone. It reads the bucket with one script
// call that writes nothing (Tokens). Its errors are Allow's.
func (l *Limiter) Peek(ctx context.Context, key string, lim Limit, n int64) (Result, error) {
	m, cost, err := checkPeek(key, lim, n)
	if err != nil {
		return Result{}, fmt.Errorf("global: peek %q: %w", key, err)
	}
	tokens, now, err := l.Tokens(ctx, key, m)
	if err != nil {
		return Result{}, err
	}
	rep := Reply{Tokens: tokens, Now: now}
	if tokens >= cost {
		rep.Granted = cost // what a decision would take: Remaining is before it
	}
	return result(rep, m, lim, cost), nil
}

// checkPeek validates the arguments of Peek: Allow's, with n from 0.
func checkPeek(key string, lim Limit, n int64) (limit.MicroLimit, int64, error) {
	if n != 0 {
		return check(key, lim, n)
	}
	if err := limit.CheckKey(key); err != nil {
		return limit.MicroLimit{}, 0, err
	}
	m, err := lim.Micro()
	return m, 0, err
}

// Tokens returns the micro-tokens the bucket of key holds now under m, in
// [-2^50, m.Burst], and the Redis time it was read at: the bucket refilled
// as Settle would refill it at that time, a missing bucket (or one Settle
// would replace) full. It writes nothing, in one script call (lua.Peek).
// Errors are Settle's for an invalid key or limit, ErrReply for a reply
// out of range, or Redis's.
func (l *Limiter) Tokens(ctx context.Context, key string, m MicroLimit) (tokens int64, now time.Time, err error) {
	s := Settlement{Key: key, Limit: m} // checked as Settle checks it
	if err := s.check(); err != nil {
		return 0, time.Time{}, fmt.Errorf("global: tokens %q: %w", key, err)
	}
	x, err := l.runInts(ctx, l.peek, []string{l.Key(key)}, 2, m.Rate, m.Burst)
	if err == nil {
		tokens, now, err = peekReply(x[0], x[1], m.Burst)
	}
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("global: tokens %q: %w", key, err)
	}
	return tokens, now, nil
}

// peekReply checks the reply {tokens, now_us} of lua.Peek for a bucket of
// burst micro-tokens.
func peekReply(tokens, now, burst int64) (int64, time.Time, error) {
	switch {
	case tokens < -MaxDebt || tokens > burst:
		return 0, time.Time{}, fmt.Errorf("%w: tokens %d is outside [-2^50, %d]", ErrReply, tokens, burst)
	case now < 0 || now > maxAmount:
		return 0, time.Time{}, fmt.Errorf("%w: time %d µs is outside [0, 2^53)", ErrReply, now)
	}
	return tokens, time.UnixMicro(now), nil
}
