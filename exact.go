package hybrid

import (
	"context"
	"time"

	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

// exact decides an Exact limit with one script call, through the breaker.
func (l *Limiter) exact(ctx context.Context, e *reconcile.Entry, sp *reconcile.Spec, lim Limit, cost int64) (Result, bool, error) {
	if l.r.DegradedKey(e.Key()) {
		return l.fallback(e, sp, lim, cost, e.Key()), true, nil
	}
	gr, err := l.once(ctx, e.Key(), sp, cost, l.r.ColdBy())
	if err != nil {
		if ctx.Err() != nil {
			return Result{}, false, ctx.Err()
		}
		l.stats.exactErrors.Add(1)
		return l.unanswered(err, e, sp, lim, cost), true, nil
	}
	return l.decided(e, lim, gr), true, nil
}

// once decides cost micro-tokens of key under sp with one script call,
// which goes with the other requests that need Redis now
// (Reconciler.SettleNowBy), and returns what Redis decided, waiting until
// the clock reads by at most.
func (l *Limiter) once(ctx context.Context, key string, sp *reconcile.Spec, cost int64, by time.Duration) (global.Result, error) {
	glim := global.Limit{Rate: sp.Rate, Burst: sp.Limit.Burst / local.Micro}
	s, err := global.Decision(key, glim, cost/local.Micro)
	if err != nil {
		return global.Result{}, err
	}
	rep, err := l.r.SettleNowBy(ctx, s, by)
	if err == nil {
		err = rep.Err
	}
	l.r.Took(sp, &s, &rep) // if Redis loses the write, charged again
	if err != nil {
		return global.Result{}, err
	}
	return global.Outcome(s, glim, rep), nil
}

// decided is the Result of an exact decision for e that Redis answered with
// gr: it counts it and keeps the view of the bucket it brings.
func (l *Limiter) decided(e *reconcile.Entry, lim Limit, gr global.Result) Result {
	now := l.clock.Now()
	if gr.Reset {
		l.stats.exactResets.Add(1)
	}
	if gr.Allowed {
		l.stats.exactAllowed.Add(1)
	} else {
		l.stats.exactDenied.Add(1)
	}
	l.r.SetView(e, local.View{Tokens: gr.Remaining * local.Micro, Seen: now})
	return l.answered(lim, gr, now)
}
