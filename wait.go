package hybrid

import (
	"context"
	"fmt"
	"time"

	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/internal/limit"
	"github.com/hybridlimit/hybrid/reconcile"
)

// Wait blocks until one token may be taken for key under lim, and takes it.
// It is WaitN(ctx, key, lim, 1).
func (l *Limiter) Wait(ctx context.Context, key string, lim Limit) error {
	return l.WaitN(ctx, key, lim, 1)
}

// WaitN blocks until n tokens may be taken for key under lim, and takes them.
// It returns ctx's error if ctx ends first, and ErrWouldWait at once, taking
// nothing, if the tokens would come after ctx's deadline, or more than
// Config.MaxDebt's refill from now. n of 0 returns nil at once.
//
// A waiter takes its tokens when it asks, as x/time/rate's WaitN does, and
// then sleeps until they are due, with no second decision: from this
// instance's allowance if it holds them (a lease, an optimistic budget),
// else from the key's bucket in Redis, which goes into debt by what the
// waiter needs (one script call, all or nothing, never deeper than the
// waiter's deadline allows). So the fleet's waiters on one key are served
// in the order Redis saw them, each one token's time after the last, and the
// fleet admits no more than B + R*T in every mode. A waiter whose ctx ends
// before its tokens are due gives them back, so that those behind it move
// up.
//
// While the key's Redis is down (or does not answer), the fallback policy
// decides: the waiter sleeps until its local bucket holds the tokens (the
// denial's RetryAfter) and asks again, the waiters of one key on this
// Limiter in line.
func (l *Limiter) WaitN(ctx context.Context, key string, lim Limit, n int64) error {
	e := l.keys.Get(key)
	var res Result
	if _, ok := l.fast(&res, key, lim, n, e); ok {
		return nil // from the allowance
	}
	sp, err := l.specFor(key, lim, e)
	if err != nil {
		return err
	}
	if n == 0 { // nothing to wait for, as x/time/rate's WaitN
		return nil
	}
	cost, err := sp.Limit.Cost(n)
	if err != nil {
		return fmt.Errorf("hybrid: key %q: %w", key, err)
	}
	if l.r.Closed() {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if l.r.DegradedKey(key) {
		return l.waitDecided(ctx, key, lim, n)
	}
	// The most the bucket may owe after the take: what refills before the
	// deadline.
	debt := l.r.Debt(sp)
	if dl, ok := ctx.Deadline(); ok {
		debt = min(debt, l.r.Refill(sp, max(time.Until(dl), 0)))
	}
	var rep global.Reply
	err = l.r.Do(ctx, key, func(ctx context.Context) (err error) {
		rep, err = l.g.TakeAhead(ctx, key, sp.Limit, cost, debt)
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return l.waitDecided(ctx, key, lim, n) // Redis did not answer: the fallback decides
	}
	s := global.Settlement{Key: key, Limit: sp.Limit, Want: cost, MinGrant: cost}
	l.r.Took(sp, &s, &rep) // if Redis loses the write, charged again
	if rep.Granted == 0 {
		l.stats.redisDenied.Add(1)
		return fmt.Errorf("%w: %q needs about %v", ErrWouldWait, key, limit.DurationFor(cost-rep.Tokens, sp.Limit.Rate))
	}
	l.stats.redisAllowed.Add(1)
	return l.sleepDue(ctx, key, sp, cost, global.Due(sp.Limit, rep.Tokens))
}

// sleepDue sleeps for wait, until the cost micro-tokens a waiter took ahead
// of key's bucket under sp are due. If ctx ends first they go back to
// Redis at once (they were charged there), and ctx's error is returned.
func (l *Limiter) sleepDue(ctx context.Context, key string, sp *reconcile.Spec, cost int64, wait time.Duration) error {
	if wait <= 0 {
		return nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		l.r.ReturnNow(key, sp, cost)
		l.stats.refunds.Add(1)
		return ctx.Err()
	}
}

// waitDecided is WaitN while the fallback decides: decide, sleep until the
// denial's tokens are due, decide again. The WaitN calls of one key on this
// Limiter wait in line: each sleeps until the tokens of those before it are
// due too, so that they wake one by one as the local bucket refills rather
// than all at once whenever a token is due.
func (l *Limiter) waitDecided(ctx context.Context, key string, lim Limit, n int64) error {
	var t *time.Timer
	inLine, hadTurn := false, false
	defer func() {
		if t != nil {
			t.Stop()
		}
		if inLine {
			l.waits.leave(key)
		}
	}()
	for {
		res, err := l.AllowN(ctx, key, lim, n)
		if err != nil || res.Allowed {
			return err
		}
		if !inLine {
			l.waits.join(key)
			inLine = true
		}
		// The request's own refill: how long the bucket takes to refill
		// n tokens, the spacing of the waiters in line.
		each := time.Duration(float64(n) / lim.Rate * float64(time.Second))
		wait := l.waits.turn(key, l.clock.Now(), res.RetryAfter, each, hadTurn)
		hadTurn = true
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return fmt.Errorf("%w: %q needs about %v", ErrWouldWait, key, wait)
		}
		if t == nil {
			t = time.NewTimer(wait)
		} else {
			t.Reset(wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
