package hybrid

import (
	"context"
	"fmt"

	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

// Allow reports whether one token may be taken for key under lim now. It is
// AllowN(ctx, key, lim, 1).
func (l *Limiter) Allow(ctx context.Context, key string, lim Limit) (Result, error) {
	return l.AllowN(ctx, key, lim, 1)
}

// AllowN decides whether n tokens may be taken for key under lim now, and
// takes them if so. On a key this instance holds allowance for, it reads no
// clock, takes no lock and allocates nothing. On a key it holds nothing for,
// it may wait for Redis (at most Config.ColdWait, and not past ctx).
//
// A changed lim for a key takes effect at once. A denial is a Result with
// Allowed false; errors are for an invalid key, limit or cost, a done ctx
// and a closed Limiter. n of 0 takes nothing and reports the key's state:
// it is Peek(ctx, key, lim, 0).
func (l *Limiter) AllowN(ctx context.Context, key string, lim Limit, n int64) (res Result, err error) {
	e := l.keys.Get(key)
	if _, ok := l.fast(&res, key, lim, n, e); ok {
		return res, nil
	}
	res, _, err = l.slow(ctx, key, lim, n, e)
	return res, err
}

// decide is AllowN that also returns the entry the decision was made on. e
// is the key's entry as looked up already, or nil.
func (l *Limiter) decide(ctx context.Context, key string, lim Limit, n int64, e *reconcile.Entry) (res Result, _ *reconcile.Entry, err error) {
	if e, ok := l.fast(&res, key, lim, n, e); ok {
		return res, e, nil
	}
	return l.slow(ctx, key, lim, n, e)
}

// fast decides from e's allowance alone, if it holds the tokens, into res:
// ok is false, with res untouched, when the decision needs more (slow). e
// is the key's entry as looked up already, or nil; the returned entry is the
// one the decision was made on, nil if it left the store meanwhile. It is
// the hot path of every entry point: it reads no clock, takes no lock and
// allocates nothing, and it writes the Result in the caller's place.
func (l *Limiter) fast(res *Result, key string, lim Limit, n int64, e *reconcile.Entry) (_ *reconcile.Entry, ok bool) {
	if e == nil {
		return nil, false
	}
	sp := e.X.Spec()
	if sp == nil || sp.Mode == Exact || !sp.Is(lim.Rate, lim.Burst, lim.Mode) || n < 1 || n > sp.Limit.Burst/local.Micro {
		return nil, false
	}
	if sp.Mode == Lease {
		// The spend is inlined and comes before any call: Go stores what a
		// call outlives before the first call, and the spend's atomic
		// instruction waits for earlier stores (3 ns of a 25-ns decision;
		// a stripe's spend likewise).
		w := e.Allowance.Spender() // its own word, or a stripe once contended
		left, ok := w.TrySpend(n * local.Micro)
		if !ok {
			return l.fastShared(res, lim, n*local.Micro, e, sp)
		}
		return l.leased(res, lim, left+e.Allowance.Besides(w), e, sp)
	}
	left, ok := l.spendBudget(e, sp, n*local.Micro, true)
	if !ok {
		return nil, false
	}
	l.allowedIn(res, e, sp, lim, left, SourceLocal) // with n unsettled
	return e, true
}

// fastShared is fast's lease spend when the uncontended one failed: the
// allowance is striped, contended, or short.
func (l *Limiter) fastShared(res *Result, lim Limit, cost int64, e *reconcile.Entry, sp *reconcile.Spec) (*reconcile.Entry, bool) {
	left, ok := e.Allowance.SpendLeftShared(cost) // striped once contended
	if !ok {
		return nil, false
	}
	return l.leased(res, lim, left, e, sp)
}

// leased is fast's decision once a lease's tokens are spent, leaving left
// micro-tokens in e's allowance: it asks for more before it runs dry, and
// writes the Result.
func (l *Limiter) leased(res *Result, lim Limit, left int64, e *reconcile.Entry, sp *reconcile.Spec) (*reconcile.Entry, bool) {
	if left < l.r.LowWater(e) {
		l.r.Starved(e, true) // top it up before it runs dry
	}
	l.allowedIn(res, e, sp, lim, left, SourceLocal)
	return e, true
}

// slow is the path of a key without enough allowance, a new key, a changed
// limit, an Exact limit, or fallback mode. e is the key's entry as looked up
// already, or nil.
func (l *Limiter) slow(ctx context.Context, key string, lim Limit, n int64, e *reconcile.Entry) (Result, *reconcile.Entry, error) {
	sp, err := l.specFor(key, lim, e)
	if err != nil {
		return Result{}, nil, err
	}
	if n == 0 { // takes nothing: a peek, as go-redis/redis_rate answers it
		res, err := l.peek(ctx, key, e, sp, lim, 0)
		return res, nil, err
	}
	cost, err := sp.Limit.Cost(n)
	if err != nil {
		return Result{}, nil, fmt.Errorf("hybrid: key %q: %w", key, err)
	}
	if l.r.Closed() {
		return Result{}, nil, ErrClosed
	}
	// The caller's lookup missed the key (or it made none).
	missed := e == nil
	for range 3 { // an entry may be retired under us: look the key up again
		switch {
		case missed:
			e, _ = l.keys.Add(key)
			missed = false
		case e == nil || e.Retired():
			e, _ = l.keys.GetOrAdd(key)
		}
		if e.X.Spec() != sp {
			l.setSpec(e, sp)
		}
		res, ok, err := l.decideSlow(ctx, e, sp, lim, cost)
		if err != nil {
			return Result{}, nil, err
		}
		if ok {
			return res, e, nil
		}
		e = nil
	}
	// The store is churning faster than this key can keep an entry.
	res, err := l.alone(ctx, key, sp, lim, cost)
	return res, nil, err
}

// decideSlow decides for e in its key's mode, once fast could not: each
// mode's decision is a file of its own (exact.go, optimistic.go, lease.go).
// ok is false if e was retired meanwhile.
func (l *Limiter) decideSlow(ctx context.Context, e *reconcile.Entry, sp *reconcile.Spec, lim Limit, cost int64) (res Result, ok bool, err error) {
	switch {
	case e.Retired():
		return Result{}, false, nil
	case sp.Mode == Exact:
		return l.exact(ctx, e, sp, lim, cost)
	case sp.Mode == Optimistic:
		return l.optimistic(ctx, e, sp, lim, cost)
	}
	return l.lease(ctx, e, sp, lim, cost)
}
