package hybrid

import (
	"context"
	"fmt"
	"time"

	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/internal/limit"
	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

// taken is what a request that takes its tokens ahead of time got (see
// takeAhead).
type taken struct {
	res  Result           // allowed (now or ahead), or the denial
	e    *reconcile.Entry // the entry whose allowance paid, else nil
	sp   *reconcile.Spec
	cost int64         // micro-tokens
	due  time.Duration // on l.clock: when the tokens are due (now, or later)
	// redis is true for tokens taken ahead of the key's bucket in Redis,
	// which go back there if given back.
	redis bool
}

// takeAhead takes n (at least 1) tokens of key under lim for a caller that
// waits for them until ctx's deadline at most, and no longer than
// Config.MaxDebt's refill: from this instance's allowance if it holds them
// (due now), else ahead of time from the key's bucket in Redis, which goes
// into debt by what the caller needs, all or nothing (global.Limiter.
// TakeAhead, one script call). A take that would come too late takes
// nothing: its Result is a denial, with the wait it would have needed as its
// RetryAfter. decided is false, with nothing taken, while the fallback
// decides for the key (its Redis down, or not answering).
func (l *Limiter) takeAhead(ctx context.Context, key string, lim Limit, n int64) (t taken, decided bool, err error) {
	e := l.keys.Get(key)
	if e, ok := l.fast(&t.res, key, lim, n, e); ok {
		t.e, t.due = e, l.clock.Now()
		if e != nil {
			t.sp = e.X.Spec()
		}
		return t, true, nil
	}
	sp, err := l.specFor(key, lim, e)
	if err != nil {
		return taken{}, false, err
	}
	cost, err := sp.Limit.Cost(n)
	if err != nil {
		return taken{}, false, fmt.Errorf("hybrid: key %q: %w", key, err)
	}
	if l.r.Closed() {
		return taken{}, false, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return taken{}, false, err
	}
	if l.r.DegradedKey(key) {
		return taken{}, false, nil
	}
	// The most the bucket may owe after the take: what refills from when
	// Redis takes it (half a round trip from now: Lead) to the deadline.
	debt := l.r.Debt(sp)
	lead := l.r.Lead()
	if dl, ok := ctx.Deadline(); ok {
		debt = min(debt, l.r.Refill(sp, max(time.Until(dl)-lead, 0)))
	}
	// What this instance spent of the bucket and Redis has not charged yet
	// (an optimistic budget's spending, what the fallback admitted) is
	// owed ahead of the take: the take may owe that much less, and its
	// tokens are due that much later.
	var unsettled int64
	if e != nil && e.X.Spec() == sp {
		unsettled = l.r.Unsettled(e)
	}
	if debt -= unsettled; debt < 0 {
		l.stats.localDenied.Add(1)
		t.res = l.denied(sp, lim, limit.DurationFor(cost-debt, sp.Limit.Rate), local.View{}, 0, SourceLocal)
		return t, true, nil
	}
	if res, ok := l.tooLate(e, sp, lim, cost, debt); ok {
		t.res = res // the view shows it: no round trip to be told
		return t, true, nil
	}
	var rep global.Reply
	err = l.r.Do(ctx, key, func(ctx context.Context) (err error) {
		rep, err = l.g.TakeAhead(ctx, key, sp.Limit, cost, debt)
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return taken{}, false, ctx.Err()
		}
		return taken{}, false, nil // Redis did not answer: the fallback decides
	}
	s := global.Settlement{Key: key, Limit: sp.Limit, Want: cost, MinGrant: cost}
	l.r.Took(sp, &s, &rep) // if Redis loses the write, charged again
	rep.Tokens -= unsettled
	now := l.clock.Now()
	t = taken{sp: sp, cost: cost, due: now, redis: rep.Granted > 0}
	t.res = l.fromBucket(sp, lim, rep.Tokens, cost, t.redis, now)
	if !t.redis {
		l.stats.redisDenied.Add(1)
		return t, true, nil
	}
	l.stats.redisAllowed.Add(1)
	// Due on Redis's clock a wait after it took them, half a round trip
	// before the reply came back.
	t.due = max(t.due+global.Due(sp.Limit, rep.Tokens)-lead, t.due)
	return t, true, nil
}

// untake gives back cost micro-tokens of key under sp that a caller took
// ahead of the bucket in Redis and did not use (due: they were due
// already). A lease key's that are due are what a lease is: they join its
// allowance, spent here next. Others go back to the bucket now (one script
// call), so that the waiters behind move up, and this instance's view of the
// bucket counts them, so that it does not deny what the bucket holds again.
func (l *Limiter) untake(key string, sp *reconcile.Spec, cost int64, due bool) {
	l.stats.refunds.Add(1)
	e := l.keys.Get(key)
	if e != nil && e.X.Spec() != sp {
		e = nil
	}
	if e != nil && due && sp.Mode == Lease && e.Allowance.Add(cost) {
		return
	}
	l.r.ReturnNow(key, sp, cost)
	if e != nil {
		if v := e.View(); v.Seen != 0 {
			l.r.SetView(e, local.View{Tokens: min(v.Tokens+cost, sp.Limit.Burst), Seen: v.Seen})
		}
	}
}

// tooLate reports whether e's fresh view of the bucket shows already that a
// take ahead of cost micro-tokens would owe more than debt, and so be
// refused: the bucket, as last seen and refilled since (and, for a lease,
// with what this instance holds of it), lacks more than debt. res is then
// the denial, told here with no round trip, as a lease's heldBack tells its
// own (a caller with a short deadline, asking often, would cost Redis a
// call for each). A view from before a reset, or stale, tells nothing.
func (l *Limiter) tooLate(e *reconcile.Entry, sp *reconcile.Spec, lim Limit, cost, debt int64) (res Result, ok bool) {
	if e == nil || e.X.Spec() != sp {
		return Result{}, false
	}
	now := l.clock.Now()
	v := e.View()
	if v.Seen == 0 || v.Seen < l.r.ResetSeen() || v.Age(now) > l.r.Fresh(e, sp) {
		return Result{}, false
	}
	held := leaseHeld(e, sp)
	if v.Tokens+l.r.Refill(sp, v.Age(now))+held >= cost-debt {
		return Result{}, false
	}
	return l.deniedHere(sp, lim, untilHolds(sp, v, cost-held, now), v, held, now), true
}
