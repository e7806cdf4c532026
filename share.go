package hybrid

import (
	"time"

	"github.com/hybridlimit/hybrid/internal/limit"
	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

// shareOf returns the local bucket limit of sp under the fallback policy.
func (l *Limiter) shareOf(sp *reconcile.Spec) local.Limit {
	if l.fb.kind == static {
		lim, _ := local.NewLimit(l.fb.limit.Rate, l.fb.limit.Burst) // checked in New
		return lim
	}
	n := l.r.Instances()
	return local.Limit{Rate: max(sp.Limit.Rate/n, 1), Burst: max(sp.Limit.Burst/n, local.Micro)}
}

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
// A share is less what this instance spent of it and has not settled
// (unsettled micro-tokens), which the view does not show: an Optimistic
// key's (its first request admitted on trust, a budget spent since the
// view), out of what the share holds; under LocalShare a Lease or Exact
// key's too (an earlier stretch's admissions that Redis refused to
// charge), out of the share and its refill since the view, as a bucket
// that went on would hold it: at least the Optimistic share, and it
// refills while Redis stays full. Not for a key the ledger remembers,
// whose record counts what its earlier entries spent (and a key the
// ledger remembers is not trusted).
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
		if sp.Mode != Optimistic {
			// A Lease or Exact key's unsettled spending is what an
			// earlier stretch of fallback decisions admitted and Redis
			// has not charged (a full Redis answers the calls that
			// write nothing, so its breaker may close and open again
			// with the view unchanged): spent out of the share and its
			// refill since the view, as a bucket that went on would
			// have. Started from the view alone, the share gave it out
			// again (TestRedisFullShare).
			return max(held+min(refill, share.Burst-held+unsettled)-unsettled, 0)
		}
		s = held + min(refill, share.Burst-held)
	default:
		s = share.Burst
	}
	if sp.Mode == Optimistic {
		s -= unsettled
	}
	return max(s, 0)
}

// recalled returns what the ledger tells the local bucket of key holds at
// now under share: full unless the ledger holds a record of the key (an
// entry of it left the store with its bucket not full), or holds none but
// dropped records whose buckets are not full yet from the key's set, which
// the key may have been one of: then what a bucket full at that time holds.
// known reports whether the ledger told anything: a record of the key, or
// a floor in the future.
func (l *Limiter) recalled(key string, share local.Limit, now time.Duration) (tokens int64, known bool) {
	full, _ := l.ledger.Full(key, now)
	if full <= now {
		return share.Burst, false
	}
	deficit, _ := limit.Refill(full-now, share.Rate, 0)
	return max(share.Burst-deficit, 0), true
}
