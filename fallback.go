package hybrid

import (
	"fmt"
	"time"

	"github.com/hybridlimit/hybrid/internal/limit"
	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

// Fallback is the policy that decides while Redis is unreachable (the
// breaker is open or probing) for keys whose allowance is spent. The zero
// Fallback is LocalShare. Whatever it admits is recorded and charged to
// Redis when it is back, so nothing spent during an outage is lost; the
// charge sinks a bucket no lower than Config.MaxDebt allows.
type Fallback struct {
	kind  fallbackKind
	limit Limit // for Static
}

type fallbackKind uint8

const (
	localShare fallbackKind = iota
	failOpen
	failClosed
	static
)

// The fallback policies.
var (
	// LocalShare (the default) gives each instance its share of every
	// limit: rate R/N and burst B/N (at least the cost of the request),
	// with N the live instances last counted through Redis (or
	// Config.Instances). A key's share starts from 1/N of what the
	// instance last saw its global bucket hold, refilled at R/N since
	// then, not from a full burst: a fleet whose Redis fails mid-run goes
	// on at the limit's rate rather than admit a burst more. A key whose
	// entry left the store (more keys than Config.MaxKeys) starts where
	// its share stood then, as a bounded ledger remembers it
	// (Stats.Ledger); a key the ledger cannot tell apart from one it had
	// to drop starts from the least the dropped ones might hold, which
	// errs towards denying; a key this instance never saw starts full. An
	// Optimistic key's share is less what this instance admitted for it
	// that Redis has not been charged yet. What the shares admit is charged
	// when Redis is back, with a claim of the refill each share kept by
	// being spent, which the bucket in Redis, seeing none of it, lost at
	// its burst: the bucket ends the outage where it would have had it
	// seen every admission.
	LocalShare = Fallback{kind: localShare}
	// FailOpen admits every request.
	FailOpen = Fallback{kind: failOpen}
	// FailClosed denies every request.
	FailClosed = Fallback{kind: failClosed}
)

// Static returns the policy that applies lim, per instance and per key,
// whatever the key's own limit. lim.Mode is ignored. A key's bucket starts
// full at each outage; one whose entry left the store starts where its
// bucket stood then, as LocalShare's shares do.
func Static(lim Limit) Fallback { return Fallback{kind: static, limit: lim} }

// String names the policy.
func (f Fallback) String() string {
	switch f.kind {
	case localShare:
		return "LocalShare"
	case failOpen:
		return "FailOpen"
	case failClosed:
		return "FailClosed"
	case static:
		return fmt.Sprintf("Static(%v/s, burst %d)", f.limit.Rate, f.limit.Burst)
	}
	return fmt.Sprintf("hybrid.Fallback(%d)", f.kind)
}

// check validates a Static limit.
func (f Fallback) check() error {
	if f.kind == static {
		if _, err := local.NewLimit(f.limit.Rate, f.limit.Burst); err != nil {
			return fmt.Errorf("hybrid: fallback %v: %w", f, err)
		}
	}
	return nil
}

// shareOf returns the local bucket limit of sp under the fallback policy.
func (l *Limiter) shareOf(sp *reconcile.Spec) local.Limit {
	if l.fb.kind == static {
		lim, _ := local.NewLimit(l.fb.limit.Rate, l.fb.limit.Burst) // checked in New
		return lim
	}
	n := l.r.Instances()
	return local.Limit{Rate: max(sp.Limit.Rate/n, 1), Burst: max(sp.Limit.Burst/n, local.Micro)}
}

// outageGap is how long before a breaker opens a fallback decision (a call
// refused before it did) still belongs to the outage it opened for: its
// local bucket goes on rather than start again.
const outageGap = time.Second

// seed returns what e's local bucket starts with under the fallback policy
// at the first decision of an outage (see local.Entry.TakeFrom), at now:
//   - under LocalShare, for a key this instance holds a view of, its share
//     of what the global bucket held at the last view, refilled at the
//     share's rate since. The refill between the view and the outage is
//     counted even for a key in use then: the time a failing Redis takes to
//     open the breaker denies the fleet's requests meanwhile (they wait for
//     Redis, and are Unanswered), so the bucket refilled for nobody. Where
//     others did spend it (a partial outage, a view that was stale), the
//     shares' admissions are charged when Redis is back, in full: the
//     bucket keeps its bound over windows that end once the debt is
//     repaid;
//   - under Static, for a key with a view, a full share;
//   - for a key with no view (never seen, or seen by an entry that left
//     the store since), what the ledger remembers of it: a full share for a
//     key it holds no record of and cannot confuse with one it dropped,
//     less where it can (see recalled).
//
// An Optimistic key's share is less what this instance spent of it and has
// not settled (unsettled micro-tokens): the first request of a key admitted
// on trust, a budget spent since the view, which the view does not show;
// not for a key the ledger remembers, whose record counts what its earlier
// entries spent (and a key the ledger remembers is not trusted).
func (l *Limiter) seed(e *reconcile.Entry, sp *reconcile.Spec, share local.Limit, now time.Duration, unsettled int64) int64 {
	var s int64
	switch v := e.View(); {
	case v.Seen == 0:
		var known bool
		if s, known = l.recalled(e.Key(), share, now); known {
			// What the key's earlier entries admitted is in the ledger,
			// and their dues, adopted by this one, are in its unsettled
			// spending: counted once.
			return s
		}
	case l.fb.kind == localShare:
		// A bucket in debt (turns taken ahead, an earlier outage's
		// charges) repays it first: its share of the refill pays its
		// share of the debt.
		held := min(v.Tokens/l.r.Instances(), share.Burst)
		refill, _ := limit.Refill(max(now-v.Seen, 0), share.Rate, 0) // at most MaxInt64
		s = held + min(refill, share.Burst-held)
	default:
		s = share.Burst
	}
	if sp.Mode == Optimistic {
		s -= unsettled
	}
	return max(s, 0)
}

// takeShare takes cost micro-tokens from the local bucket of e's key under
// the fallback policy (LocalShare or Static), if it holds them, and writes
// the bucket's state in res. A request that waited for Redis may find that
// its entry left the store meanwhile, and that another request made the
// key's entry anew: it decides on the key's live entry, whose bucket started
// from what the ledger told of the one that left (see seed), so that the
// two requests do not each take from a share of their own. It returns the
// entry it decided on, nil if the key could not keep one.
func (l *Limiter) takeShare(res *Result, e *reconcile.Entry, sp *reconcile.Spec, cost int64) (*reconcile.Entry, bool) {
	share := l.shareOf(sp)
	share.Burst = max(share.Burst, cost)
	for range 3 {
		if e.Retired() {
			if e = l.keys.Get(e.Key()); e == nil || e.X.Spec() != sp {
				return nil, false // the next request makes it anew
			}
			continue
		}
		if e.Pending.Load() == 0 && l.r.Owed() >= l.maxOrphans {
			// What the instance owes Redis for keys it no longer
			// tracks is kept per key until Redis is back: a key that
			// owes nothing yet is denied rather than remembered beyond
			// the bound (a flood of distinct keys).
			l.stats.fallbackCrowded.Add(1)
			return e, false
		}
		now := l.clock.Now()
		// The outage's first decision starts the share; one made shortly
		// before the breaker opened (a refused call) belongs to the same
		// outage.
		after := l.r.DegradedSince(e.Key()) - outageGap
		var seed int64
		if !e.Started(after) {
			seed = l.seed(e, sp, share, now, l.r.Unsettled(e))
		}
		ok := e.TakeFrom(now, share, cost, after, seed)
		if ok && (e.Retired() || !l.keys.Holds(e)) {
			// It left the store before the take: its ledger record,
			// written as it left, does not hold the take, and a new
			// entry may start from it.
			e.PutAt(now, share, cost)
			continue
		}
		b := e.Bucket(now, share)
		res.Remaining = b.Remaining(now, share)
		res.ResetAfter = b.ResetAfter(now, share)
		if !ok {
			res.RetryAfter = b.RetryAfter(now, share, cost)
		}
		return e, ok
	}
	return nil, false
}

// fallback decides a request for cost micro-tokens by the fallback policy.
// e may be nil when the key could not keep an entry; then the local bucket
// is not available and LocalShare and Static deny.
func (l *Limiter) fallback(e *reconcile.Entry, sp *reconcile.Spec, lim Limit, cost int64, key string) Result {
	res := Result{Limit: lim, Source: SourceFallback}
	ok := false
	switch l.fb.kind {
	case failOpen:
		ok = true
	case failClosed:
	default:
		if e != nil {
			e, ok = l.takeShare(&res, e, sp, cost)
		}
	}
	if ok {
		res.Allowed = true
		if e == nil {
			l.r.Orphan(key, sp, cost)
		} else if !e.Pending.Add(cost) {
			l.orphan(e, sp, cost)
		}
		l.stats.fallbackAllowed.Add(1)
		l.stats.fallbackConsumed.Add(uint64(cost))
	} else {
		if res.RetryAfter == 0 {
			res.RetryAfter = l.r.SyncInterval()
		}
		l.stats.fallbackDenied.Add(1)
		l.yield(l.clock.Now()) // as deniedHere does: a breaker's probe needs a core to end the outage
	}
	return res
}
