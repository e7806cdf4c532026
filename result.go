package hybrid

import (
	"cmp"
	"fmt"
	"time"

	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/internal/limit"
	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

// Source is where a decision came from.
type Source uint8

// The sources of a decision.
const (
	// SourceLocal: this instance's allowance or its last view of the
	// global bucket, with no round trip.
	SourceLocal Source = iota
	// SourceRedis: a round trip to Redis made for this request.
	SourceRedis
	// SourceFallback: the fallback policy, while Redis is unreachable.
	SourceFallback
)

// String returns "local", "redis" or "fallback".
func (s Source) String() string {
	switch s {
	case SourceLocal:
		return "local"
	case SourceRedis:
		return "redis"
	case SourceFallback:
		return "fallback"
	}
	return fmt.Sprintf("hybrid.Source(%d)", s)
}

// Result is a decision. Remaining, RetryAfter and ResetAfter describe the
// global bucket as this instance knows it: its own allowance plus what Redis
// held at the last settlement (see Seen); other instances may have spent
// since.
type Result struct {
	// Allowed reports whether the tokens were taken.
	Allowed bool
	// Source is where the decision came from.
	Source Source
	// Remaining is the whole tokens left, as far as this instance knows.
	Remaining int64
	// RetryAfter is zero if Allowed, else an estimate of how long until a
	// retry may succeed.
	RetryAfter time.Duration
	// ResetAfter estimates how long until the bucket is full.
	ResetAfter time.Duration
	// Limit is the limit the decision was made against.
	Limit Limit

	seen  time.Duration // when the view arrived, on clock; 0: none
	clock *local.Clock
}

// Seen returns when the view of the global bucket behind r came from Redis:
// the zero Time if there was none.
func (r Result) Seen() time.Time {
	if r.seen == 0 || r.clock == nil {
		return time.Time{}
	}
	return r.clock.Time(r.seen)
}

// Age returns how old the view of the global bucket behind r is now: zero if
// there was none.
func (r Result) Age() time.Duration {
	if r.seen == 0 || r.clock == nil {
		return 0
	}
	return r.clock.Now() - r.seen
}

// allowed is the Result of tokens taken from e's allowance, which holds left
// micro-tokens after them. It reads no clock. It counts a decision from Redis;
// one from the allowance (src SourceLocal) was counted by the spend itself
// (local.Allowance.SpendLeft), in the entry, rather than in a counter shared
// across keys.
func (l *Limiter) allowed(e *reconcile.Entry, sp *reconcile.Spec, lim Limit, left int64, src Source) (res Result) {
	l.allowedIn(&res, e, sp, lim, left, src)
	return res
}

// allowedIn is allowed that writes the Result into res, in the caller's
// place: the hot path's form (see fast).
func (l *Limiter) allowedIn(res *Result, e *reconcile.Entry, sp *reconcile.Spec, lim Limit, left int64, src Source) {
	if src != SourceLocal {
		l.stats.redisAllowed.Add(1)
	}
	v, ok := e.TryView()
	if !ok {
		v = e.View()
	}
	rem := left
	if sp.Mode == Lease {
		rem += max(v.Tokens, 0) // the global bucket as last seen, besides our lease
	} else {
		// Our budget is part of the global bucket, and what we spent
		// since the view is not in it yet. With no view yet (a new key's
		// first request, admitted on trust), the bucket is taken as full.
		tokens := v.Tokens
		if v.Seen == 0 {
			tokens = sp.Limit.Burst
		}
		// What was spent and not settled: exact while the key holds no
		// prepaid grant (Unsettled), and more by what the grant paid for
		// while it does, which Unsettled would read under a lock shared
		// with other keys: never on this path.
		rem = max(tokens-e.Pending.Load(), rem)
	}
	rem = min(rem, sp.Limit.Burst)
	// Field by field rather than a Result literal: a literal is built on
	// the stack and copied, and the copy's wide loads stall on the narrow
	// stores that built it (a quarter of a hot decision's time).
	res.Allowed = true
	res.Source = src
	res.Remaining = rem / local.Micro
	res.RetryAfter = 0
	res.ResetAfter = sp.Duration(sp.Limit.Burst - rem)
	res.Limit = lim
	res.seen = v.Seen
	res.clock = &l.clock
}

// denied is the Result of a request refused on the view v of the global
// bucket, at now, by an instance that holds held micro-tokens of lease for
// the key (0 in the other modes): its lease is part of the bucket too,
// outside the view. wait is how long until the request can go ahead here:
// when a token is due (see untilHolds), not when the next round comes.
func (l *Limiter) denied(sp *reconcile.Spec, lim Limit, wait time.Duration, v local.View, held int64, src Source) Result {
	tokens := v.Tokens
	if v.Seen == 0 {
		tokens = 0
	}
	tokens = min(tokens+max(held, 0), sp.Limit.Burst)
	return Result{
		Source:     src,
		Remaining:  max(tokens, 0) / local.Micro,
		RetryAfter: cmp.Or(max(wait, 0), minRetry),
		ResetAfter: limit.DurationFor(sp.Limit.Burst-tokens, sp.Limit.Rate),
		Limit:      lim,
		seen:       v.Seen,
		clock:      &l.clock,
	}
}

// fromBucket is the Result of a request for cost micro-tokens that Redis
// answered, at now, with the bucket of sp holding tokens micro-tokens (after
// the request's tokens, if taken): allowed or not, and else told when cost
// is there. A peek and a take ahead (ahead.go) answer so.
func (l *Limiter) fromBucket(sp *reconcile.Spec, lim Limit, tokens, cost int64, allowed bool, now time.Duration) Result {
	res := Result{
		Allowed:    allowed,
		Source:     SourceRedis,
		Remaining:  max(tokens, 0) / local.Micro,
		ResetAfter: limit.DurationFor(sp.Limit.Burst-tokens, sp.Limit.Rate),
		Limit:      lim,
		seen:       now,
		clock:      &l.clock,
	}
	if !allowed {
		res.RetryAfter = limit.DurationFor(cost-tokens, sp.Limit.Rate)
	}
	return res
}

// untilHolds returns how long after now the global bucket, refilling from
// what it held in the view v, holds need micro-tokens (as v counts them;
// none if v is no view).
func untilHolds(sp *reconcile.Spec, v local.View, need int64, now time.Duration) time.Duration {
	tokens := v.Tokens
	if v.Seen == 0 {
		tokens = 0
	}
	return limit.DurationFor(need-tokens, sp.Limit.Rate) - v.Age(now)
}

// viewSlack is how much later than Redis placed it a view can time what it
// saw, beyond the way back that Reconciler.Lead covers: Redis's TIME counts
// whole microseconds. A request that a view holds back for no longer than
// that asks Redis instead, so that a caller that honoured a RetryAfter is
// not denied again for the view's rounding.
const viewSlack = time.Microsecond

// minRetry is the RetryAfter of a denial whose view says the tokens are
// there already: it was overtaken by other instances' spending, and a
// caller that retries at once would only be denied again.
const minRetry = 100 * time.Microsecond

// answered is the Result of a decision that Redis answered with gr, read
// at now.
func (l *Limiter) answered(lim Limit, gr global.Result, now time.Duration) Result {
	return Result{
		Allowed:    gr.Allowed,
		Remaining:  gr.Remaining,
		RetryAfter: gr.RetryAfter,
		ResetAfter: gr.ResetAfter,
		Limit:      lim,
		Source:     SourceRedis,
		seen:       now,
		clock:      &l.clock,
	}
}
