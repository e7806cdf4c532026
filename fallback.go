package hybrid

import (
	"time"

	"github.com/hybridlimit/hybrid/reconcile"
)

// outageGap is how long before a breaker opens a fallback decision (a call
// refused before it did) still belongs to the outage it opened for: its
// local bucket goes on rather than start again.
const outageGap = time.Second

// outageFrom returns the clock reading from which a fallback decision of
// key at now belongs to the outage it is made in (see
// reconcile.Reconciler.OutageFrom): a local bucket started since goes on,
// one started before starts anew from the key's view. Bounded by the start
// of the outage alone, two outages a second apart (a master killed, and the
// replica promoted in its place killed soon after) went on with the first
// outage's buckets, which had refilled in between while the fleet spent
// through Redis: the shares started full, and the fleet admitted 6% to 16%
// beyond B + R*T.
func (l *Limiter) outageFrom(key string, now time.Duration) time.Duration {
	return l.r.OutageFrom(key, now, outageGap)
}

// takeShare takes cost micro-tokens from the local bucket of e's key under
// the fallback policy (LocalShare or Static), if it holds them, and writes
// the bucket's state in res. A request that waited for Redis may find that
// its entry left the store meanwhile, and that another request made the
// key's entry anew: it decides on the key's live entry, whose bucket started
// from what the ledger told of the one that left (see seed), so that the
// two requests do not each take from a share of their own. It returns the
// entry it decided on, nil if the key could not keep one.
func (l *Limiter) takeShare(res *Result, e *reconcile.Entry, sp *reconcile.Spec, cost int64) (*reconcile.Entry, bool) {
	share := l.shareOf(sp)
	share.Burst = max(share.Burst, cost)
	for range 3 {
		if e.Retired() {
			if e = l.keys.Get(e.Key()); e == nil || e.X.Spec() != sp {
				return nil, false // the next request makes it anew
			}
			continue
		}
		if e.Pending.Load() == 0 && l.r.Owed() >= l.maxOrphans {
			// What the instance owes Redis for keys it no longer
			// tracks is kept per key until Redis is back: a key that
			// owes nothing yet is denied rather than remembered beyond
			// the bound (a flood of distinct keys).
			l.stats.fallbackCrowded.Add(1)
			return e, false
		}
		now := l.clock.Now()
		// The outage's first decision starts the share; one made shortly
		// before the breaker opened (a refused call) belongs to the same
		// outage.
		after := l.outageFrom(e.Key(), now)
		var seed int64
		if !e.Started(after) {
			seed = l.seed(e, sp, share, now, l.r.Unsettled(e))
		}
		ok := e.TakeFrom(now, share, cost, after, seed)
		if ok && (e.Retired() || !l.keys.Holds(e)) {
			// It left the store before the take: its ledger record,
			// written as it left, does not hold the take, and a new
			// entry may start from it.
			e.PutAt(now, share, cost)
			continue
		}
		b := e.Bucket(now, share)
		res.Remaining = b.Remaining(now, share)
		res.ResetAfter = b.ResetAfter(now, share)
		if !ok {
			res.RetryAfter = b.RetryAfter(now, share, cost)
		}
		return e, ok
	}
	return nil, false
}

// fallback decides a request for cost micro-tokens by the fallback policy.
// e may be nil when the key could not keep an entry; then the local bucket
// is not available and LocalShare and Static deny.
func (l *Limiter) fallback(e *reconcile.Entry, sp *reconcile.Spec, lim Limit, cost int64, key string) Result {
	res := Result{Limit: lim, Source: SourceFallback}
	ok := false
	switch l.fb.kind {
	case failOpen:
		ok = true
	case failClosed:
	default:
		if e != nil {
			e, ok = l.takeShare(&res, e, sp, cost)
		}
	}
	if ok {
		res.Allowed = true
		if e == nil {
			l.r.Orphan(key, sp, cost)
		} else {
			l.spent(e, sp, cost)
		}
		l.stats.fallbackAllowed.Add(1)
		l.stats.fallbackConsumed.Add(uint64(cost))
	} else {
		if res.RetryAfter == 0 {
			res.RetryAfter = l.r.SyncInterval()
		}
		l.stats.fallbackDenied.Add(1)
		l.yield(l.clock.Now()) // as deniedHere does: a breaker's probe needs a core to end the outage
	}
	return res
}
