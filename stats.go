package hybrid

import (
	"github.com/hybridlimit/hybrid/internal/limit"
	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

// Stats is a snapshot of a Limiter's work. Every decision is counted once,
// by where it came from (see Allowed and Denied); each check of AllowAll is
// a decision. A cancelled reservation stays counted as allowed (and counts
// in Refunds).
//
// Decisions allowed from a key's allowance (LocalAllowed) are counted in the
// same word of the key's entry as the allowance they spend, by the one atomic
// instruction that spends it, so that counting them costs the hot path
// nothing; the reconciler adds them up when it next visits the key, at its
// next round or when the key leaves the store. So LocalAllowed lags by up to
// one SyncInterval; after Close it is complete.
type Stats struct {
	// LocalAllowed counts decisions allowed from the key's allowance (a
	// lease or an optimistic budget), with no round trip, and the first
	// requests of optimistic keys admitted on trust (counted at once).
	LocalAllowed uint64
	// LocalDenied counts denials answered from the last view of the global
	// bucket, with no round trip.
	LocalDenied uint64
	// Fetched counts requests that waited for a round trip (a cold key, or
	// a lease that ran dry while Redis had tokens); RedisAllowed and
	// RedisDenied those of them that were allowed and denied (the others
	// fell back, or their caller gave up).
	Fetched, RedisAllowed, RedisDenied uint64
	// Unanswered counts requests denied because Redis did not answer them
	// in time (Config.ColdWait) while its breaker was closed: a slow or busy
	// Redis, which is no outage, so the fallback policy does not decide.
	// They are denials from SourceRedis.
	Unanswered uint64
	// FallbackAllowed and FallbackDenied count decisions of the fallback
	// policy.
	FallbackAllowed, FallbackDenied uint64
	// FallbackCrowded counts the fallback's denials (in FallbackDenied) of
	// keys that owed Redis nothing yet while the instance owed it for as
	// many keys it no longer tracks as its ledger holds (twice
	// Config.MaxKeys, at least 65,536: Reconcile.Orphans and InFlight):
	// what an outage admits is remembered per key until Redis is back, so
	// a flood of distinct keys is denied rather than remembered without
	// bound.
	FallbackCrowded uint64
	// FallbackConsumed is the micro-tokens the fallback policy admitted:
	// consumption charged to Redis once it is back (see
	// Reconcile.Unsettled for what is still to charge).
	FallbackConsumed uint64
	// ExactAllowed, ExactDenied and ExactErrors count Exact decisions and
	// the script calls that failed (those fell back). ExactResets counts the
	// Exact calls that found something unreadable under their key (another
	// type, garbled fields) and replaced it with a full bucket; the
	// reconciler's resets are Reconcile.Resets.
	ExactAllowed, ExactDenied, ExactErrors, ExactResets uint64
	// Refunds counts cancelled reservations.
	Refunds uint64
	// Ledger is what this instance remembers of the fallback's local
	// buckets of keys whose entries left the store (more keys than
	// Config.MaxKeys): its records, their memory, and the reads it could
	// not tell (Unknown), which the fallback answered as if the key's
	// bucket were as low as the least its set dropped might hold. Its
	// table, made at the first entry that leaves the store with a bucket
	// not full, holds twice Config.MaxKeys records, at least 65,536, at 9
	// bytes each.
	Ledger local.LedgerStats
	// Degraded reports whether the fallback policy is deciding now: for
	// every key on a single Redis; on a Redis Cluster, for the keys of at
	// least one node (Reconcile.Nodes says which).
	Degraded bool
	// Reconcile is the reconciler's part: rounds and their round-trip
	// times, keys settled, unsettled consumption, evictions, the breaker's
	// state and transitions, the fleet size, Redis's clock skew, keys
	// tracked.
	Reconcile reconcile.Stats
}

// Allowed returns the decisions allowed from src. Exact decisions are
// SourceRedis.
func (s Stats) Allowed(src Source) uint64 {
	switch src {
	case SourceLocal:
		return s.LocalAllowed
	case SourceRedis:
		return s.RedisAllowed + s.ExactAllowed
	case SourceFallback:
		return s.FallbackAllowed
	}
	return 0
}

// Denied returns the decisions denied from src. Exact decisions are
// SourceRedis.
func (s Stats) Denied(src Source) uint64 {
	switch src {
	case SourceLocal:
		return s.LocalDenied
	case SourceRedis:
		return s.RedisDenied + s.ExactDenied + s.Unanswered
	case SourceFallback:
		return s.FallbackDenied
	}
	return 0
}

// Stats returns a snapshot of l's statistics.
func (l *Limiter) Stats() Stats {
	rs := l.r.Stats()
	return Stats{
		LocalAllowed:     rs.LocalAllowed + l.stats.trusted.Load(),
		LocalDenied:      l.stats.localDenied.Load(),
		Fetched:          l.stats.fetched.Load(),
		RedisAllowed:     l.stats.redisAllowed.Load(),
		RedisDenied:      l.stats.redisDenied.Load(),
		Unanswered:       l.stats.unanswered.Load(),
		FallbackAllowed:  l.stats.fallbackAllowed.Load(),
		FallbackDenied:   l.stats.fallbackDenied.Load(),
		FallbackConsumed: l.stats.fallbackConsumed.Load(),
		FallbackCrowded:  l.stats.fallbackCrowded.Load(),
		ExactAllowed:     l.stats.exactAllowed.Load(),
		ExactDenied:      l.stats.exactDenied.Load(),
		ExactErrors:      l.stats.exactErrors.Load(),
		ExactResets:      l.stats.exactResets.Load(),
		Refunds:          l.stats.refunds.Load(),
		Ledger:           l.ledger.Stats(l.clock.Now()),
		Degraded:         l.r.Degraded(),
		Reconcile:        rs,
	}
}

// Overshoot returns the most that the fleet may admit beyond B+R*T for lim,
// in tokens, over any window T, with the fleet size as now counted: 0 for
// Lease and Exact, and for Optimistic the bound derived in docs/accuracy.md,
// N*Cap + min(N*Cap, B + R*SyncInterval), where Cap is one instance's budget
// cap (its share of B and of one interval's refill, at least one token, at
// most LocalCapacity): 2*N*Cap, unless the fleet is larger than B plus an
// interval's refill. It changes when the fleet does.
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
	u := n * l.r.Cap(sp)
	return (u + min(u, sp.Limit.Burst+refill) + local.Micro - 1) / local.Micro
}
