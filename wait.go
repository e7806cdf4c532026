package hybrid

import (
	"context"
	"fmt"
	"time"

	"github.com/hybridlimit/hybrid/internal/limit"
)

// Wait blocks until one token may be taken for key under lim, and takes it.
// It is WaitN(ctx, key, lim, 1).
func (l *Limiter) Wait(ctx context.Context, key string, lim Limit) error {
	return l.WaitN(ctx, key, lim, 1)
}

// WaitN blocks until n tokens may be taken for key under lim, and takes them.
// It returns ctx's error if ctx ends first, and ErrWouldWait at once if ctx's
// deadline comes before the limiter expects the tokens. n of 0 returns nil
// at once.
//
// A denied WaitN sleeps until the tokens are due (the denial's RetryAfter:
// the bucket's refill, not the next round). The WaitN calls of one key on
// this Limiter wait in line: each sleeps until the tokens of those before
// it are due too, so that they wake one by one as the bucket refills rather
// than all at once whenever a token is due.
func (l *Limiter) WaitN(ctx context.Context, key string, lim Limit, n int64) error {
	if n == 0 { // nothing to wait for, as x/time/rate's WaitN: the key and limit checked
		if err := limit.CheckKey(key); err != nil {
			return fmt.Errorf("hybrid: %w", err)
		}
		if _, err := l.spec(lim); err != nil {
			return fmt.Errorf("hybrid: key %q: %w", key, err)
		}
		return nil
	}
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
