package hybrid

import (
	"context"
	"fmt"
	"time"
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
	if n == 0 { // nothing to wait for, as x/time/rate's WaitN
		_, err := l.specFor(key, lim, l.keys.Get(key))
		return err
	}
	t, decided, err := l.takeAhead(ctx, key, lim, n)
	switch {
	case err != nil:
		return err
	case !decided:
		return l.waitDecided(ctx, key, lim, n)
	case !t.res.Allowed:
		return fmt.Errorf("%w: %q needs about %v", ErrWouldWait, key, t.res.RetryAfter)
	}
	return l.sleepDue(ctx, key, &t)
}

// sleepDue sleeps until the tokens t took are due. If ctx ends first they
// are given back (see untake), and ctx's error is returned.
func (l *Limiter) sleepDue(ctx context.Context, key string, t *taken) error {
	wait := t.due - l.clock.Now()
	if wait <= 0 {
		return nil
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		if l.clock.Now() >= t.due {
			// Due already, the timer not yet seen: a deadline that came
			// with the tokens (the take asked for no more) ends no wait.
			return nil
		}
		l.untake(key, t.sp, t.cost, false)
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
		if err := sleepFor(ctx, &t, wait, key); err != nil {
			return err
		}
	}
}

// WaitAll blocks until the tokens of every check may be taken, and takes
// them: AllowAll that waits, as WaitN is AllowN that waits. One check is
// WaitN's: it takes its tokens ahead of time and sleeps until they are due.
// With several, no tier's tokens are held while another's are awaited: it
// sleeps until the denying tier's tokens are due (its RetryAfter) and
// decides again, until every tier passes. It returns ctx's error if ctx
// ends first, and ErrWouldWait at once, with nothing taken, if a tier's
// tokens would come after ctx's deadline. Checks are validated as
// AllowAll's.
func (l *Limiter) WaitAll(ctx context.Context, checks ...Check) error {
	if len(checks) == 1 {
		c := &checks[0]
		if err := l.validCheck(c, l.keys.Get(c.Key)); err != nil {
			return err
		}
		return l.WaitN(ctx, c.Key, c.Limit, checkCost(c))
	}
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		d, err := l.AllowAll(ctx, checks...)
		if err != nil || d.Allowed {
			return err
		}
		if err := sleepFor(ctx, &t, d.Result().RetryAfter, checks[d.Denied].Key); err != nil {
			return err
		}
	}
}

// sleepFor sleeps for wait on *t (made at the first sleep), the wait of a
// request for key that asks again after it: ErrWouldWait at once if ctx's
// deadline comes first, ctx's error if it ends meanwhile.
func sleepFor(ctx context.Context, t **time.Timer, wait time.Duration, key string) error {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
		return fmt.Errorf("%w: %q needs about %v", ErrWouldWait, key, wait)
	}
	if *t == nil {
		*t = time.NewTimer(wait)
	} else {
		(*t).Reset(wait)
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-(*t).C:
		return nil
	}
}
