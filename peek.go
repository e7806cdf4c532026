package hybrid

import (
	"context"
	"fmt"

	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

// Peek reports what AllowN(ctx, key, lim, n) would decide now, and takes
// nothing: Allowed reports whether n tokens are there, Remaining is what the
// bucket holds before any is taken, RetryAfter how long until n tokens are
// there (0 if they are), ResetAfter how long until the bucket is full. n may
// be 0, for the bucket's state alone (AllowN with 0 tokens is the same peek,
// as go-redis/redis_rate answers it).
//
// A key whose n tokens this instance holds in its allowance (a lease, an
// optimistic budget) is answered from it, as AllowN would be, with no round
// trip. Any other is answered with one read of its bucket in Redis, which
// writes nothing there and changes nothing here: what this instance holds
// of the bucket is counted in (a lease beside it, the spending of an
// optimistic budget not settled yet), what other instances hold is not.
// While the key's Redis is down, or does not answer, the fallback policy's
// state answers it (Source SourceFallback), as it would answer a decision.
//
// A peek is a snapshot: the fleet may spend the tokens it saw before the
// caller asks for them. Errors are AllowN's: an invalid key or limit, n
// outside [0, burst], a done ctx and a closed Limiter.
func (l *Limiter) Peek(ctx context.Context, key string, lim Limit, n int64) (Result, error) {
	e := l.keys.Get(key)
	sp, err := l.specFor(key, lim, e)
	if err != nil {
		return Result{}, err
	}
	return l.peek(ctx, key, e, sp, lim, n)
}

// peek is Peek for a valid key, its entry e as looked up (nil if none) and
// sp, lim's spec.
func (l *Limiter) peek(ctx context.Context, key string, e *reconcile.Entry, sp *reconcile.Spec, lim Limit, n int64) (Result, error) {
	if n < 0 || n > sp.Limit.Burst/local.Micro {
		return Result{}, fmt.Errorf("hybrid: key %q: %w: peek at %d tokens, outside [0, burst %d]", key, ErrInvalidCost, n, sp.Limit.Burst/local.Micro)
	}
	if l.r.Closed() {
		return Result{}, ErrClosed
	}
	cost := n * local.Micro
	if e != nil && e.X.Spec() != sp {
		e = nil // kept under another limit: what it holds is not this one's
	}
	if e != nil && sp.Mode != Exact {
		if left := e.Allowance.Load(); left >= cost && left > 0 {
			var res Result
			l.allowedIn(&res, e, sp, lim, left, SourceLocal) // nothing spent, nothing counted
			return res, nil
		}
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	if l.r.DegradedKey(key) {
		return l.peekFallback(e, sp, lim, cost, key), nil
	}
	var tokens int64
	err := l.r.Do(ctx, key, func(ctx context.Context) (err error) {
		tokens, _, err = l.g.Tokens(ctx, key, sp.Limit)
		return err
	})
	now := l.clock.Now()
	if err != nil {
		if ctx.Err() != nil {
			return Result{}, ctx.Err()
		}
		return l.peekFallback(e, sp, lim, cost, key), nil
	}
	// What this instance holds of the bucket.
	if e != nil {
		switch sp.Mode {
		case Lease:
			tokens += e.Allowance.Load() // taken out of the bucket already
		case Optimistic:
			// A budget is part of the bucket; what it spent is not out of
			// it yet.
			tokens = max(tokens-e.Pending.Load(), e.Allowance.Load())
		}
	}
	tokens = min(tokens, sp.Limit.Burst)
	return l.fromBucket(sp, lim, tokens, cost, tokens >= cost, now), nil
}

// peekFallback is the Result of a peek at cost micro-tokens of key while
// the fallback policy decides for it: its local bucket as it stands, or as
// the outage's first decision would start it. e is the key's entry, or nil.
func (l *Limiter) peekFallback(e *reconcile.Entry, sp *reconcile.Spec, lim Limit, cost int64, key string) Result {
	res := Result{Limit: lim, Source: SourceFallback}
	switch l.fb.kind {
	case failOpen:
		res.Allowed = true
		return res
	case failClosed:
		res.RetryAfter = l.r.SyncInterval()
		return res
	}
	share := l.shareOf(sp)
	share.Burst = max(share.Burst, cost)
	now := l.clock.Now()
	b := local.Full(share, now)
	switch after := l.outageFrom(key, now); {
	case e != nil && e.Started(after):
		b = e.Bucket(now, share)
	case e != nil:
		b.Charge(now, share, share.Burst-l.seed(e, sp, share, now, l.r.Unsettled(e)))
	default:
		tokens, _ := l.recalled(key, share, now)
		b.Charge(now, share, share.Burst-tokens)
	}
	res.Remaining = b.Remaining(now, share)
	res.ResetAfter = b.ResetAfter(now, share)
	if b.Tokens(now, share) >= cost {
		res.Allowed = true
	} else {
		res.RetryAfter = b.RetryAfter(now, share, cost)
	}
	return res
}
