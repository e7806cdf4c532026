package hybrid

import (
	"context"

	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

// alone decides a request for cost micro-tokens of key under sp that has
// no entry to decide from: the store churns faster than the key can keep
// one (a long tail of keys far beyond MaxKeys, asked by many callers at
// once, evicts each entry before its request is decided). Redis decides
// it, whatever the key's mode, as it decides an Exact limit: one script
// call that takes the cost or denies, batched with the other requests that
// need Redis now. The fallback policy decides only while the key's node is
// down, or refused the call: a healthy Redis, however busy, is no outage. A
// Redis that did not answer in time denies, as it does any request that
// waited for it (Stats.Unanswered).
func (l *Limiter) alone(ctx context.Context, key string, sp *reconcile.Spec, lim Limit, cost int64) (Result, error) {
	if l.r.DegradedKey(key) {
		return l.fallback(nil, sp, lim, cost, key), nil
	}
	l.stats.fetched.Add(1)
	gr, err := l.once(ctx, key, sp, cost, l.r.ColdBy())
	if err != nil {
		if ctx.Err() != nil {
			return Result{}, ctx.Err()
		}
		if !reconcile.Slow(err) || l.r.DegradedKey(key) {
			return l.fallback(nil, sp, lim, cost, key), nil
		}
		l.stats.unanswered.Add(1)
		return l.denied(sp, lim, l.r.SyncInterval()/4, local.View{}, 0, SourceRedis), nil
	}
	if gr.Allowed {
		l.stats.redisAllowed.Add(1)
	} else {
		l.stats.redisDenied.Add(1)
	}
	return l.answered(lim, gr, l.clock.Now()), nil
}
