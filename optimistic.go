package hybrid

import (
	"context"

	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

// optimistic decides for an Optimistic key whose budget could not pay for
// cost; the caller tried it, and the key's breaker is closed.
//
// A key this instance holds no view of learns its bucket first, with one
// round trip that its concurrent requests share, and takes its budget from
// what the bucket holds: never from an assumed full bucket, which every
// entry made again after an eviction would grant anew. Only the first
// request of a key this instance does not remember evicting is admitted at
// once, within one budget's cap, and charged at the next round (see
// reconcile.Reconciler.Trust): a long tail of keys asked once each
// waits for nothing. A request that costs more than a budget may ever hold
// takes its cost from Redis alone, while the last view shows the bucket has
// it. Otherwise the budget is spent: the request is denied here until the
// next round renews the budget.
func (l *Limiter) optimistic(ctx context.Context, e *reconcile.Entry, sp *reconcile.Spec, lim Limit, cost int64) (Result, bool, error) {
	v := e.View()
	if v.Seen == 0 && l.r.Trust(e, sp, cost) {
		// Its first request is admitted on trust, charged at the next
		// round.
		if !e.Pending.Add(cost) {
			l.r.Orphan(e.Key(), sp, cost)
		}
		l.r.Trusted(e)
		l.stats.trusted.Add(1)
		return l.allowed(e, sp, lim, 0, SourceLocal), true, nil
	}
	if v.Seen == 0 {
		l.r.AwaitTrusted(e) // the budget to come counts the first request
		l.stats.fetched.Add(1)
		if err := l.r.Fetch(ctx, e, cost); err != nil {
			return l.fetchFailed(ctx, err, e, sp, lim, cost)
		}
		if left, ok := e.Allowance.SpendUncounted(cost); ok { // a decision made on Redis's answer
			if !e.Pending.Add(cost) {
				l.r.Orphan(e.Key(), sp, cost)
			}
			return l.allowed(e, sp, lim, left, SourceRedis), true, nil
		}
		if e.Retired() {
			return Result{}, false, nil
		}
		if v = e.View(); cost <= l.r.Cap(sp) || v.Tokens < cost {
			l.stats.redisDenied.Add(1)
			return l.denied(sp, lim, cost, v, 0, l.clock.Now(), SourceRedis), true, nil
		}
	}
	if cost > local.Micro && v.Tokens >= cost && cost > l.r.Cap(sp) { // a budget holds a token at least
		l.stats.fetched.Add(1)
		ok, err := l.r.Take(ctx, e, cost)
		if ok {
			return l.allowed(e, sp, lim, e.Allowance.Load(), SourceRedis), true, nil
		}
		if err != nil {
			return l.fetchFailed(ctx, err, e, sp, lim, cost)
		}
		l.stats.redisDenied.Add(1)
		return l.denied(sp, lim, cost, e.View(), 0, l.clock.Now(), SourceRedis), true, nil
	}
	return l.deniedHere(sp, lim, cost, v, 0, l.clock.Now()), true, nil
}
