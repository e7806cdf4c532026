package hybrid

import (
	"context"
	"errors"
	"time"

	"github.com/hybridlimit/hybrid/reconcile"
)

// lease decides for a Lease key whose allowance fast could not spend: the
// lease may have been topped up meanwhile, and pays if it can, from the
// stripes too. While the key's node is down, the fallback decides.
//
// Then a turn the key took ahead decides first (reserved), then the view
// of the bucket, while it is fresh, denies here what a fetch could not
// bring (heldBack). Otherwise the request fetches: a fetch is shared with
// the concurrent requests for the key; while Redis still has tokens after
// it, the ones it did not cover fetch again with a larger lease, and at
// last take their cost for themselves.
func (l *Limiter) lease(ctx context.Context, e *reconcile.Entry, sp *reconcile.Spec, lim Limit, cost int64) (Result, bool, error) {
	if left, ok := e.Allowance.SpendLeftShared(cost); ok {
		return l.allowed(e, sp, lim, left, SourceLocal), true, nil
	}
	if l.r.DegradedKey(e.Key()) {
		return l.fallback(e, sp, lim, cost, e.Key()), true, nil
	}
	now := l.clock.Now()
	if res, ok := l.reserved(e, sp, lim, cost, now); ok {
		return res, true, nil
	}
	fresh, res, denied := l.heldBack(e, sp, lim, cost, now)
	if denied {
		// A fetch may have landed since the spend above: its grant is in
		// the allowance before its view is (see reconcile's apply).
		if left, ok := e.Allowance.SpendLeftShared(cost); ok {
			return l.allowed(e, sp, lim, left, SourceLocal), true, nil
		}
		return res, true, nil
	}
	// Redis may have tokens: fetch them, waiting for Redis ColdWait in all
	// (the fetches, a take, a round).
	by := now + l.r.ColdWait()
	l.stats.fetched.Add(1)
	if fresh && e.View().Age(now) <= 2*l.r.SyncInterval() {
		// A key in use here whose lease ran dry: it grows. Not one whose
		// view is older, however fresh for a key others take too: asked
		// again after rounds went by, it would hold a lease until the
		// next round gave it back, a record of this instance's in the
		// key's bucket and two calls where a take is one.
		l.r.Starved(e, false)
	}
	// The fetches ask for what all their waiters need: a request counts
	// its need in once it is to wait for a fetch of another's (one is on
	// its way), or to fetch again, and out as soon as it is served, so that
	// the requests that weigh waiting against the waiters' need (heldBack)
	// count none served already. A request alone on its key (the long
	// tail's every request) asks for its cost alone, and counts nothing.
	counted := false
	defer func() {
		if counted {
			l.r.AddDemand(e, -cost)
		}
	}()
	spend := func() (int64, bool) { // fetched for it: not a local decision
		left, ok := e.Allowance.SpendUncounted(cost)
		if ok && counted {
			counted = false
			l.r.AddDemand(e, -cost)
		}
		return left, ok
	}
	for i := range maxFetches {
		if !counted && (i > 0 || l.r.Fetching(e)) {
			counted = true
			l.r.AddDemand(e, cost)
		}
		if err := l.r.FetchBy(ctx, e, cost, by); err != nil {
			return l.fetchFailed(ctx, err, e, sp, lim, cost)
		}
		if left, ok := spend(); ok {
			return l.allowed(e, sp, lim, left, SourceRedis), true, nil
		}
		if res, ok := l.reserved(e, sp, lim, cost, l.clock.Now()); ok {
			return res, true, nil // its turn, taken ahead, is not due yet
		}
		if e.Retired() {
			return Result{}, false, nil
		}
		if e.View().Tokens < cost {
			break
		}
		l.r.Starved(e, false) // the next fetch asks for a larger lease
	}
	if e.View().Tokens >= cost && l.r.AwaitFetchBy(ctx, e, by) {
		// The last fetch it waited for brought too little, and another is
		// on its way: that one asked for this request's need too (counted
		// in), and its grant is this request's to spend.
		if left, ok := spend(); ok {
			return l.allowed(e, sp, lim, left, SourceRedis), true, nil
		}
	}
	if e.View().Tokens >= cost {
		// Other requests spent what the fetches brought: take this one's
		// cost for it alone.
		ok, err := l.r.TakeBy(ctx, e, cost, by)
		if ok {
			return l.allowed(e, sp, lim, e.Allowance.Load(), SourceRedis), true, nil
		}
		if err != nil && ctx.Err() != nil {
			return Result{}, false, ctx.Err()
		}
		if errors.Is(err, reconcile.ErrGone) {
			return Result{}, false, nil // evicted meanwhile: look it up again
		}
	}
	// A settlement round for the key may be under way, and may be what
	// emptied the bucket for the fetches: wait for its grant before
	// denying. A fetch may have landed since the last spend too: its grant
	// is in the allowance before its view shows the bucket it left (see
	// reconcile's apply), so an empty view read above came with it.
	round := l.r.AwaitRoundBy(ctx, e, by)
	if left, ok := spend(); ok {
		return l.allowed(e, sp, lim, left, SourceRedis), true, nil
	}
	if round && ctx.Err() != nil {
		return Result{}, false, ctx.Err()
	}
	l.r.Starved(e, false)
	l.stats.redisDenied.Add(1)
	held, v := e.Allowance.Load(), e.View()
	return l.denied(sp, lim, untilHolds(sp, v, cost-held, l.clock.Now()), v, held, SourceRedis), true, nil
}

// reserved decides a lease request of cost micro-tokens for e, which holds
// too little allowance for it, from the turn e's key took ahead, if it has
// one (see reconcile.Reconciler.Ahead): ok is true when it decided, and res
// is the decision. A turn not yet due denies the request until it is.
func (l *Limiter) reserved(e *reconcile.Entry, sp *reconcile.Spec, lim Limit, cost int64, now time.Duration) (res Result, ok bool) {
	wait, has := l.r.Reserved(e, now)
	if !has {
		return Result{}, false
	}
	if wait == 0 {
		if left, ok := e.Allowance.SpendUncounted(cost); ok {
			return l.allowed(e, sp, lim, left, SourceRedis), true
		}
		return Result{}, false // spent by others already: fetch
	}
	return l.deniedHere(sp, lim, wait, e.View(), e.Allowance.Load(), now), true
}

// heldBack decides a lease request of cost micro-tokens for e, which holds
// too little allowance for it, from e's view of the global bucket, when the
// view is fresh (see reconcile.Reconciler.Fresh): denied is true when the
// request is denied here, without a round trip, and res is the denial.
// fresh reports whether the view was.
func (l *Limiter) heldBack(e *reconcile.Entry, sp *reconcile.Spec, lim Limit, cost int64, now time.Duration) (fresh bool, res Result, denied bool) {
	v := e.View()
	if v.Seen == 0 || v.Age(now) > l.r.Fresh(e, sp) || v.Seen < l.r.ResetSeen() {
		return false, Result{}, false // no view, a stale one, or one from before a reset
	}
	// The fleet's bucket, as last seen and refilled since, cannot yet hold
	// what a fetch would need (cost less the lease, or for a saturated key
	// more: this instance's turn; see reconcile.Reconciler.Due): deny here,
	// until then.
	held := e.Allowance.Load()
	if l.r.Ahead(e, sp) {
		// Its turn is taken ahead, and spent when it is due: a fetch now.
		return true, Result{}, false
	}
	if wait := untilHolds(sp, v, l.r.Due(e, sp, v, cost-held), now) - l.r.Lead(); wait > viewSlack {
		l.r.Starved(e, false)
		return true, l.deniedHere(sp, lim, wait, v, held, now), true
	}
	if l.r.Fetching(e) && l.r.Refill(sp, l.r.SyncInterval()) <= sp.Limit.Burst &&
		v.Tokens+l.r.Refill(sp, v.Age(now)) < l.fetchesTake(e, sp)+cost {
		// A fetch is on its way, and the fetches may take all the bucket
		// holds: one request waits for it, the others are told to retry
		// when it is back, a round trip from now, rather than queue behind
		// it (a hot key's callers would wait on round trips instead of
		// being answered here). Not for a key whose burst is below an
		// interval's refill: its callers wait, blocked, so that the
		// fetch's reply is not kept from a core by their denials while the
		// bucket, full, refills nothing.
		l.r.Starved(e, false)
		return true, l.deniedHere(sp, lim, 2*l.r.Lead(), v, held, now), true
	}
	return true, Result{}, false
}

// fetchesTake returns what the fetches of e's key (of sp) under way may
// take out of its bucket before a request that waits for this instance's
// gets its tokens: a lease each for a key the fleet takes; for a key only
// this instance takes, what the requests waiting here need, since its
// fetch's lease is theirs to spend (a lease's worth would deny requests the
// bucket holds tokens for, which a second fetch would serve).
func (l *Limiter) fetchesTake(e *reconcile.Entry, sp *reconcile.Spec) int64 {
	if n := l.r.Takers(e); n > 1 {
		return n * l.r.LeaseSize(e, sp)
	}
	return l.r.Demand(e)
}

// maxFetches bounds the shared fetches one request waits for.
const maxFetches = 3
