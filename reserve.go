package hybrid

import (
	"context"

	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

// Reservation is an allowed decision that can be taken back. Create one with
// Reserve. It is safe for concurrent use.
type Reservation struct {
	l      *Limiter
	key    string
	e      *reconcile.Entry
	sp     *reconcile.Spec
	cost   int64
	res    Result
	cancel chan struct{} // closed by the first Cancel
}

// Reserve is AllowN that returns the decision as a Reservation, so that the
// tokens of an allowed decision can be given back with Cancel (for a request
// that was not served after all). n of 0 takes nothing, and leaves nothing
// to cancel: a peek, as AllowN's.
func (l *Limiter) Reserve(ctx context.Context, key string, lim Limit, n int64) (*Reservation, error) {
	res, e, err := l.decide(ctx, key, lim, n, l.keys.Get(key))
	if err != nil {
		return nil, err
	}
	r := &Reservation{l: l, key: key, e: e, res: res, cost: n * local.Micro, cancel: make(chan struct{})}
	if e != nil {
		r.sp = e.X.Spec()
	}
	return r, nil
}

// OK reports whether the reservation was allowed.
func (r *Reservation) OK() bool { return r.res.Allowed }

// Result returns the decision.
func (r *Reservation) Result() Result { return r.res }

// Cancel gives the tokens of an allowed reservation back, in both tiers: to
// this instance's allowance or local bucket, and through it to Redis, where
// they were already charged. An Exact reservation's tokens go back to Redis
// before Cancel returns, in one script call (at most the breaker's call
// timeout), so that the key's next decision has them. It does nothing for a
// denied reservation, or after the first call.
func (r *Reservation) Cancel() {
	if !r.res.Allowed {
		return
	}
	select {
	case <-r.cancel:
		return
	default:
		close(r.cancel)
	}
	r.l.refund(r)
}

// refund gives a reservation's tokens back.
func (l *Limiter) refund(r *Reservation) {
	e, sp, cost := r.e, r.sp, r.cost
	if e == nil || sp == nil {
		return
	}
	switch {
	case r.res.Source == SourceFallback:
		// Taken from the local bucket and recorded as consumption.
		now := l.clock.Now()
		e.PutAt(now, l.shareOf(sp), cost)
		l.uncharge(e, sp, cost)
	case sp.Mode == Exact:
		l.r.ReturnNow(r.key, sp, cost) // charged in Redis by the script call: back there before the next decision
	case sp.Mode == Lease:
		if !e.Allowance.Add(cost) { // leased, so charged: back to Redis
			l.r.Return(r.key, sp, cost)
		}
	case sp.Mode == Optimistic:
		e.Allowance.Add(cost)
		l.uncharge(e, sp, cost)
	}
	l.stats.refunds.Add(1)
}

// uncharge takes cost back from e's unsettled consumption, or from Redis
// if it was settled already.
func (l *Limiter) uncharge(e *reconcile.Entry, sp *reconcile.Spec, cost int64) {
	if rest := cost - e.Pending.TakeUpTo(cost); rest > 0 {
		l.r.Return(e.Key(), sp, rest)
	}
}
