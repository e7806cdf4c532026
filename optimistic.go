package hybrid

import (
	"context"
	"time"

	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

// optimistic decides for an Optimistic key whose budget fast could not
// spend: the budget may have been renewed meanwhile, and pays if it can.
// While the key's node is down, the fallback decides.
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
// it.
//
// Otherwise the budget is spent. The key settles at once, on its own, when
// the budget that settlement would bring covers the request (the next round
// may be far off: a key whose burst is below one interval's refill would
// admit only a burst per round), paced like a lease fetch (see due); until
// then it is denied here, told to retry when that budget is due.
func (l *Limiter) optimistic(ctx context.Context, e *reconcile.Entry, sp *reconcile.Spec, lim Limit, cost int64) (Result, bool, error) {
	if left, ok := l.spendBudget(e, sp, cost, true); ok {
		return l.allowed(e, sp, lim, left, SourceLocal), true, nil
	}
	if l.r.DegradedKey(e.Key()) {
		return l.fallback(e, sp, lim, cost, e.Key()), true, nil
	}
	v := e.View()
	// The decision's waits for Redis below end by ColdWait in all, read
	// from the clock at the first of them: a request denied here reads it
	// not at all.
	var by time.Duration
	if v.Seen == 0 && !l.remembered(e.Key()) && l.r.Trust(e, sp, cost) {
		// Its first request is admitted on trust, charged at the next
		// round.
		l.spent(e, sp, cost)
		l.r.Trusted(e)
		l.stats.trusted.Add(1)
		return l.allowed(e, sp, lim, 0, SourceLocal), true, nil
	}
	if v.Seen == 0 {
		l.r.AwaitTrusted(e) // the budget to come counts the first request
		if cost <= l.r.Cap(sp) {
			return l.settleFor(ctx, e, sp, lim, cost, l.coldBy(&by))
		}
		l.stats.fetched.Add(1) // learn the bucket, then take the cost alone
		if err := l.r.FetchBy(ctx, e, cost, l.coldBy(&by)); err != nil {
			return l.fetchFailed(ctx, err, e, sp, lim, cost)
		}
		if e.Retired() {
			return Result{}, false, nil
		}
		v = e.View()
	}
	if cost > l.r.Cap(sp) {
		if cost > local.Micro && v.Tokens >= cost { // a budget holds a token at least
			l.stats.fetched.Add(1)
			ok, err := l.r.TakeBy(ctx, e, cost, l.coldBy(&by))
			if ok {
				return l.allowed(e, sp, lim, e.Allowance.Load(), SourceRedis), true, nil
			}
			if err != nil {
				return l.fetchFailed(ctx, err, e, sp, lim, cost)
			}
			l.stats.redisDenied.Add(1)
			v = e.View()
			return l.denied(sp, lim, untilHolds(sp, v, cost, l.clock.Now()), v, 0, SourceRedis), true, nil
		}
		now := l.clock.Now()
		return l.deniedHere(sp, lim, untilHolds(sp, v, cost, now), v, 0, now), true, nil
	}
	if l.r.AwaitRoundBy(ctx, e, by) {
		// A round is charging the key's consumption: Redis does not hold
		// the charge yet, and a grant now could take the tokens it
		// charges. Its reply renews the budget, or tells when to settle.
		if ctx.Err() != nil {
			return Result{}, false, ctx.Err()
		}
		if left, ok := l.spendBudget(e, sp, cost, true); ok {
			return l.allowed(e, sp, lim, left, SourceLocal), true, nil
		}
		v = e.View()
	}
	now := l.clock.Now()
	if v.Age(now) <= l.r.Fresh(e, sp) && v.Seen >= l.r.ResetSeen() { // not from before a reset
		if wait := l.settleWait(e, sp, cost, v, now); wait > viewSlack {
			return l.deniedHere(sp, lim, wait, v, 0, now), true, nil
		}
	}
	return l.settleFor(ctx, e, sp, lim, cost, l.coldBy(&by))
}

// spendBudget takes cost micro-tokens from the Optimistic budget of e and
// returns what the budget holds after it; counted says whether the spend is
// counted as a decision answered from the budget (local.Allowance.SpendLeft)
// or is one made on Redis's answer (SpendUncounted). ok is false if the
// budget does not hold cost, or e left the store: nothing is spent then.
//
// The cost is recorded as e's consumption (Pending) before the budget pays
// for it, not after: a settlement's reply renews the budget from what Redis
// holds less what was spent here that Redis does not know of, read after the
// budget it replaces, and a spend between the two steps the other way round
// was in neither, so that the budget was renewed with a token spent already
// (a cold key's concurrent first requests admitted one more than its burst,
// about one run in ten of TestColdKeyOptimistic under -race). This way a
// spend under way is counted once or twice, never in neither: at worst a
// budget is renewed short by it, towards denying. A spend the budget turns
// down takes its record back, what is left of it: if a round charged it
// meanwhile, or e left the store and handed it off, Redis is charged for a
// request that was denied, towards denying too.
func (l *Limiter) spendBudget(e *reconcile.Entry, sp *reconcile.Spec, cost int64, counted bool) (left int64, ok bool) {
	if e.Allowance.Load() < cost {
		return 0, false // no write to a budget that cannot pay: most denials of a hot key
	}
	kept := e.Pending.Add(cost)
	if counted {
		left, ok = e.Allowance.SpendLeft(cost)
	} else {
		left, ok = e.Allowance.SpendUncounted(cost)
	}
	switch {
	case !ok && kept:
		e.Pending.TakeUpTo(cost)
	case ok && !kept:
		// Not while an entry retires its budget before its Pending
		// (local.Entry); were it otherwise, the consumption must still
		// be charged.
		l.orphan(e, sp, cost)
	}
	return left, ok
}

// coldBy returns *by, the clock reading by which a decision's waits for
// Redis end (reconcile.Reconciler.ColdBy), reading it at the first call.
func (l *Limiter) coldBy(by *time.Duration) time.Duration {
	if *by == 0 {
		*by = l.r.ColdBy()
	}
	return *by
}

// settleFor settles the Optimistic key of e now, for a request of cost
// micro-tokens (at most the budget cap) that its budget could not pay for:
// one round trip, shared with the key's concurrent requests, that charges
// what the key spent and asks for tokens out of the bucket, or renews the
// budget by its share (see reconcile.Reconciler.Fetch). The request spends
// the new budget, or is denied. It waits for Redis until the clock reads by.
func (l *Limiter) settleFor(ctx context.Context, e *reconcile.Entry, sp *reconcile.Spec, lim Limit, cost int64, by time.Duration) (Result, bool, error) {
	l.stats.fetched.Add(1)
	if err := l.r.FetchBy(ctx, e, cost, by); err != nil {
		return l.fetchFailed(ctx, err, e, sp, lim, cost)
	}
	if left, ok := l.spendBudget(e, sp, cost, false); ok { // a decision made on Redis's answer
		return l.allowed(e, sp, lim, left, SourceRedis), true, nil
	}
	if e.Retired() {
		return Result{}, false, nil
	}
	l.stats.redisDenied.Add(1)
	v := e.View()
	now := l.clock.Now()
	return l.denied(sp, lim, l.settleWait(e, sp, cost, v, now), v, 0, SourceRedis), true, nil
}

// settleWait returns how long after now a settlement of e's Optimistic key
// would bring its budget here what a request of cost micro-tokens (at most
// the budget cap) lacks, on the view v: once the bucket, refilled since v,
// holds it beyond the spending that Redis does not know of, this
// instance's and what the others may have, and beyond the budget left here,
// which is part of the bucket too (a grant), or once the budget's share of the refill or of the bucket covers
// the cost (Budget), whichever comes first, less the time the request
// takes to reach Redis (Lead). Either is paced as lease fetches are (see
// pace).
func (l *Limiter) settleWait(e *reconcile.Entry, sp *reconcile.Spec, cost int64, v local.View, now time.Duration) time.Duration {
	// Paced for the instances that ask (one while the replies show that
	// nobody else charges the key: see reconcile.Reconciler.Askers), and
	// within their share of a full bucket, which is the most a share of
	// what the bucket holds can ever bring. A large fleet's instance waits
	// for all of that share (its Pace would be larger): a settlement that
	// came before its share of the refill did would be renewed by its share
	// of what the bucket holds, which counts the fleet's spending not
	// charged yet, and come twice as often.
	n := l.r.Askers(e)
	pace := min(l.r.Pace(sp, l.r.Cap(sp), n), sp.Limit.Burst/n)
	unsettled, left := l.r.Unsettled(e), e.Allowance.Load()
	whole := left / local.Micro * local.Micro // a grant replaces the fraction
	need := max(cost-whole, pace)
	grant := untilHolds(sp, v, unsettled+l.r.Others(e, sp)+whole+need, now)
	share := l.r.BudgetWait(sp, v.Tokens-unsettled, left, max(cost, pace)) - v.Age(now)
	return min(grant, share) - l.r.Lead()
}
