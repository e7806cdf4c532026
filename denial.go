package hybrid

import (
	"context"
	"errors"
	"time"

	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

// deniedHere is denied for a request refused here, with no round trip, on
// the view v of the global bucket, at now.
func (l *Limiter) deniedHere(sp *reconcile.Spec, lim Limit, wait time.Duration, v local.View, held int64, now time.Duration) Result {
	l.stats.localDenied.Add(1)
	l.yield(now)
	return l.denied(sp, lim, wait, v, held, SourceLocal)
}

// fetchFailed decides a request whose fetch or take for e failed with err:
// the caller's own end (ctx), a closed Limiter and an entry evicted
// meanwhile (ok false: look the key up again) are told apart from Redis not
// answering (unanswered).
func (l *Limiter) fetchFailed(ctx context.Context, err error, e *reconcile.Entry, sp *reconcile.Spec, lim Limit, cost int64) (res Result, ok bool, _ error) {
	switch {
	case ctx.Err() != nil:
		return Result{}, false, ctx.Err()
	case errors.Is(err, reconcile.ErrClosed):
		return Result{}, false, ErrClosed
	case errors.Is(err, reconcile.ErrGone):
		return Result{}, false, nil
	}
	return l.unanswered(err, e, sp, lim, cost), true, nil
}

// unanswered decides a request whose round trip to Redis failed with err.
// The fallback policy decides while the key's breaker judges Redis
// unreachable, and when Redis refused or failed the call (a refused
// connection, a refused password): the breaker counts those, and Redis is
// down. A Redis that did not answer in time (reconcile.Slow) with its
// breaker closed is slow or busy, which is no outage: the request is denied,
// rather than admitted from a share that the bucket does not account for,
// and told to retry after a quarter of a round when the bucket's state is
// not known (the round trip it waited for may still bring it), else when
// the last view says a token is due.
func (l *Limiter) unanswered(err error, e *reconcile.Entry, sp *reconcile.Spec, lim Limit, cost int64) Result {
	if !reconcile.Slow(err) || l.r.DegradedKey(e.Key()) {
		return l.fallback(e, sp, lim, cost, e.Key())
	}
	l.stats.unanswered.Add(1)
	v := e.View()
	held := leaseHeld(e, sp)
	res := l.denied(sp, lim, untilHolds(sp, v, cost-held, l.clock.Now()), v, held, SourceRedis)
	if v.Seen == 0 {
		res.RetryAfter = l.r.SyncInterval() / 4
	}
	return res
}

// leaseHeld returns the allowance e holds in lease mode, in micro-tokens: tokens
// of the global bucket reserved for this instance. 0 in the other modes,
// whose allowance is a budget (optimistic) or nothing.
func leaseHeld(e *reconcile.Entry, sp *reconcile.Spec) int64 {
	if sp.Mode != Lease {
		return 0
	}
	return e.Allowance.Load()
}
