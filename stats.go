package hybrid

import (
	"sync/atomic"

	"github.com/hybridlimit/hybrid/internal/limit"
	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

// counters are the Limiter's own statistics. Only decisions off the hot path
// are counted here, so that an allowed decision on a known key writes no
// memory shared across keys.
type counters struct {
	localDenied     atomic.Uint64
	redisDenied     atomic.Uint64
	fetched         atomic.Uint64
	fallbackAllowed atomic.Uint64
	fallbackDenied  atomic.Uint64
	exactAllowed    atomic.Uint64
	exactDenied     atomic.Uint64
	exactErrors     atomic.Uint64
	refunds         atomic.Uint64
}

// Stats is a snapshot of a Limiter's work. Decisions allowed from a key's
// allowance are not counted one by one (counting them would cost the hot
// path); the settlement figures account for them.
type Stats struct {
	// LocalDenied counts denials answered from the last view of the global
	// bucket, with no round trip.
	LocalDenied uint64
	// Fetched counts requests that waited for a round trip (a cold key, or
	// a lease that ran dry while Redis had tokens); RedisDenied those of
	// them that were denied.
	Fetched, RedisDenied uint64
	// FallbackAllowed and FallbackDenied count decisions of the fallback
	// policy.
	FallbackAllowed, FallbackDenied uint64
	// ExactAllowed, ExactDenied and ExactErrors count Exact decisions and
	// the script calls that failed (those fell back).
	ExactAllowed, ExactDenied, ExactErrors uint64
	// Refunds counts cancelled reservations.
	Refunds uint64
	// Degraded reports whether the fallback policy is deciding now.
	Degraded bool
	// Reconcile is the reconciler's part: rounds, keys settled, the
	// breaker's state, the fleet size, keys tracked.
	Reconcile reconcile.Stats
}

// Stats returns a snapshot of l's statistics.
func (l *Limiter) Stats() Stats {
	return Stats{
		LocalDenied:     l.stats.localDenied.Load(),
		Fetched:         l.stats.fetched.Load(),
		RedisDenied:     l.stats.redisDenied.Load(),
		FallbackAllowed: l.stats.fallbackAllowed.Load(),
		FallbackDenied:  l.stats.fallbackDenied.Load(),
		ExactAllowed:    l.stats.exactAllowed.Load(),
		ExactDenied:     l.stats.exactDenied.Load(),
		ExactErrors:     l.stats.exactErrors.Load(),
		Refunds:         l.stats.refunds.Load(),
		Degraded:        l.r.Degraded(),
		Reconcile:       l.r.Stats(),
	}
}

// Overshoot returns the most that the fleet may admit beyond B+R*T for lim,
// in tokens, over any window T, with the fleet size as now counted: 0 for
// Lease and Exact, and for Optimistic the bound derived in docs/accuracy.md,
// 2*min(N*Cap, B + R*SyncInterval), where Cap is one instance's budget cap
// (its share of B and of one interval's refill, at least one token, at most
// LocalCapacity). It changes when the fleet does.
func (l *Limiter) Overshoot(lim Limit) int64 {
	if lim.Mode != Optimistic {
		return 0
	}
	sp, err := l.spec(lim)
	if err != nil {
		return 0
	}
	n := l.r.Instances()
	refill, _ := limit.Refill(l.r.SyncInterval(), sp.Limit.Rate, 0)
	f := min(n*l.r.Cap(sp), sp.Limit.Burst+refill)
	return (2*f + local.Micro - 1) / local.Micro
}
