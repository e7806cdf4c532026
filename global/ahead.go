package global

import (
	"context"
	"fmt"
	"time"

	"github.com/hybridlimit/hybrid/internal/limit"
)

// TakeAhead takes cost micro-tokens from the bucket of key under m ahead of
// time, all or nothing: if the bucket, refilled to now, would owe no more
// than debt micro-tokens after the take, it takes cost (Reply.Granted is
// cost), else nothing (0, and nothing is written). Reply.Tokens is what the
// bucket holds after the call, below 0 while it owes: the taker's tokens
// are due once it is back at 0, Due(Tokens) after Reply.Now. A waiter takes
// its tokens so when it asks, and sleeps until they are due, rather than
// asking again (lua.Ahead, one script call).
//
// Errors are Settle's for an invalid key or limit, a cost outside [1,
// burst] or a debt outside [0, 2^50] (before Redis is touched), ErrReply
// for a reply out of range, or Redis's.
func (l *Limiter) TakeAhead(ctx context.Context, key string, m MicroLimit, cost, debt int64) (Reply, error) {
	s := Settlement{Key: key, Limit: m, Want: cost, MinGrant: cost, Debt: debt}
	err := s.check()
	if err == nil && (cost < 1 || debt > MaxDebt) {
		err = fmt.Errorf("%w: cost %d micro-tokens is outside [1, burst %d], or debt %d above 2^50", ErrInvalidCost, cost, m.Burst, debt)
	}
	if err != nil {
		return Reply{}, fmt.Errorf("global: take ahead %q: %w", key, err)
	}
	x, err := l.runInts(ctx, l.ahead, []string{l.Key(key)}, 3, m.Rate, m.Burst, cost, debt)
	var rep Reply
	if err == nil {
		rep, err = aheadReply(x, cost, debt, m.Burst)
	}
	if err != nil {
		return Reply{}, fmt.Errorf("global: take ahead %q: %w", key, err)
	}
	return rep, nil
}

// Due returns how long a bucket of m that holds tokens micro-tokens takes
// to be back at 0: when the tokens a take ahead left it owing are due (0
// for a bucket that owes nothing).
func Due(m MicroLimit, tokens int64) time.Duration {
	return limit.DurationFor(-tokens, m.Rate)
}

// aheadReply checks the reply {granted, tokens, now_us} of lua.Ahead to a
// take of cost within debt, of a bucket of burst micro-tokens.
func aheadReply(x []int64, cost, debt, burst int64) (Reply, error) {
	granted, tokens, now := x[0], x[1], x[2]
	switch {
	case granted != 0 && granted != cost:
		return Reply{}, fmt.Errorf("%w: granted %d, neither 0 nor %d", ErrReply, granted, cost)
	case granted == cost && (tokens < -debt || tokens > burst-cost):
		return Reply{}, fmt.Errorf("%w: tokens %d after a take of %d, outside [-%d, %d]", ErrReply, tokens, cost, debt, burst-cost)
	case tokens < -MaxDebt || tokens > burst:
		return Reply{}, fmt.Errorf("%w: tokens %d is outside [-2^50, %d]", ErrReply, tokens, burst)
	case now < 0 || now > maxAmount:
		return Reply{}, fmt.Errorf("%w: time %d µs is outside [0, 2^53)", ErrReply, now)
	}
	return Reply{Granted: granted, Tokens: tokens, Now: time.UnixMicro(now)}, nil
}
