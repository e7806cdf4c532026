package hybrid

import (
	"context"
	"errors"
	"runtime"
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

// yield gives up the processor (runtime.Gosched), at a denial answered here
// at now, once per yieldGap of this Limiter's denials, while a round trip
// to Redis is under way in the process (reconcile.Busy).
//
// Callers that ask again at once, in a loop, would otherwise keep every
// core busy with denials, and the goroutine whose reply ends the denial (a
// settlement round's, a fetch's, another Limiter's) would wait for the
// scheduler to preempt them: on saturated cores, past its call timeout, so
// that a healthy Redis looked down (round trips of 0.3 to 1.4 s were
// measured so). A yield sends one spinning caller to the back of the run
// queue, where the goroutines that Redis's replies woke wait, and the next
// yield comes soon after: those run within a few milliseconds. Spaced so,
// the yields cost the denials nothing that a benchmark shows.
func (l *Limiter) yield(now time.Duration) {
	last := l.lastYield.Load()
	if now-time.Duration(last) >= yieldGap && reconcile.Busy() && l.lastYield.CompareAndSwap(last, int64(now)) {
		runtime.Gosched()
	}
}

// yieldGap is the least time between two yields of a Limiter's denials.
const yieldGap = 250 * time.Microsecond

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
	held := l.lease(e, sp)
	res := l.denied(sp, lim, untilHolds(sp, v, cost-held, l.clock.Now()), v, held, SourceRedis)
	if v.Seen == 0 {
		res.RetryAfter = l.r.SyncInterval() / 4
	}
	return res
}
