package hybrid

import (
	"context"
	"math"
	"time"

	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

// Reservation is tokens taken for a request, now or ahead of time, that can
// be given back: x/time/rate's Reservation, on the fleet's bucket. Create
// one with Reserve. It is safe for concurrent use.
type Reservation struct {
	l      *Limiter
	key    string
	e      *reconcile.Entry
	sp     *reconcile.Spec
	cost   int64
	res    Result
	due    time.Time     // when the tokens are due; zero for now
	ahead  bool          // taken ahead of the key's bucket in Redis
	cancel chan struct{} // closed by the first Cancel
}

// InfDuration is the Delay of a Reservation that is not OK: its tokens could
// not be had within the wait allowed. It is x/time/rate's InfDuration.
const InfDuration = time.Duration(math.MaxInt64)

// Reserve takes n tokens of key under lim for a request, now or ahead of
// time, as x/time/rate's Reserve does: OK reports whether they were taken,
// Delay how long the caller must wait before it acts on them (0: at once),
// and Cancel gives them back if it does not.
//
// Tokens this instance holds in its allowance (a lease, an optimistic
// budget) are taken from it at once (Delay 0). Others are taken from the
// key's bucket in Redis, as WaitN takes them (one script call): at once if
// it holds them, else ahead of time, the bucket going into debt by them, if
// they are due before ctx's deadline and within Config.MaxDebt's refill (or
// the burst, if more): OK, with the Delay until they are due. Otherwise
// nothing is taken: OK is false, Delay is InfDuration, and Result is the
// denial, whose RetryAfter says how long the tokens would take. While the
// key's Redis is down (or does not answer) the fallback decides, as it
// decides AllowN: OK with no delay, or not OK.
//
// n of 0 takes nothing, and leaves nothing to cancel: a peek, as AllowN's.
// Errors are AllowN's.
func (l *Limiter) Reserve(ctx context.Context, key string, lim Limit, n int64) (*Reservation, error) {
	r := &Reservation{l: l, key: key, cancel: make(chan struct{})}
	if n == 0 {
		res, err := l.Peek(ctx, key, lim, 0)
		if err != nil {
			return nil, err
		}
		r.res = res
		return r, nil
	}
	t, decided, err := l.takeAhead(ctx, key, lim, n)
	if err != nil {
		return nil, err
	}
	if !decided { // the fallback decides, now
		res, e, err := l.decide(ctx, key, lim, n, l.keys.Get(key))
		if err != nil {
			return nil, err
		}
		r.res, r.e, r.cost = res, e, n*local.Micro
		if e != nil {
			r.sp = e.X.Spec()
		}
		return r, nil
	}
	r.res, r.e, r.sp, r.cost, r.ahead = t.res, t.e, t.sp, t.cost, t.redis
	if t.res.Allowed {
		r.due = l.clock.Time(t.due)
	}
	return r, nil
}

// OK reports whether the tokens were taken.
func (r *Reservation) OK() bool { return r.res.Allowed }

// Result returns the decision: for tokens taken ahead of time, an allowed
// one from Redis, with the bucket's Remaining after them (0 while it owes
// them).
func (r *Reservation) Result() Result { return r.res }

// Delay is DelayFrom(time.Now()).
func (r *Reservation) Delay() time.Duration { return r.DelayFrom(time.Now()) }

// DelayFrom returns how long after t the reservation's tokens are due: 0 if
// the caller may act at once, InfDuration if the reservation is not OK.
func (r *Reservation) DelayFrom(t time.Time) time.Duration {
	if !r.res.Allowed {
		return InfDuration
	}
	if r.due.IsZero() {
		return 0
	}
	return max(r.due.Sub(t), 0)
}

// Cancel gives the tokens of an allowed reservation back, in both tiers: to
// this instance's allowance or local bucket, and through it to Redis, where
// they were already charged. Tokens taken ahead of time, and an Exact
// reservation's, go back to Redis before Cancel returns, in one script call
// (at most the breaker's call timeout), so that the key's next decision,
// and the waiters behind, have them. It does nothing for a reservation that
// is not OK, or after the first call.
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
	if r.ahead { // taken from the bucket in Redis
		l.untake(r.key, sp, cost, r.DelayFrom(time.Now()) == 0)
		return
	}
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
