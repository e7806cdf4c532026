package reconcile

import (
	"github.com/hybridlimit/hybrid/global"
)

// What a settlement takes out of an entry, and puts back when it fails.

// charge takes e's unsettled consumption out of it into s: what it spent,
// less what Redis granted it out of the bucket meanwhile (prepaid: those
// tokens left the bucket when they were granted), or, if it spent less than
// that, the rest of the grant given back, so that the bucket gets back what
// the grant took beyond the spending.
func charge(e *Entry, s *global.Settlement) {
	s.Consumed = e.Pending.TakeAll()
	if pp := e.X.prepaid.TakeAll(); pp > 0 {
		if pp <= s.Consumed {
			s.Consumed -= pp
		} else {
			s.Consumed, s.Returned = 0, s.Returned+pp-s.Consumed
		}
	}
}

// Unsettled returns what e spent that Redis has not charged and did not
// grant beforehand, in micro-tokens: what the bucket does not know of yet.
func (r *Reconciler) Unsettled(e *Entry) int64 {
	return max(e.Pending.Load()-e.X.prepaid.Load(), 0)
}

// restore puts back what a failed settlement took out of its entry, or
// keeps it as an orphan if there is no entry or it has left the store. With
// hold the entry is kept for the next round. With uncertain, the settlement
// may have been applied: its give-back is not put back (giving it back twice
// would let the fleet admit more than the bucket; at worst it is lost to the
// fleet until the bucket refills) and its consumption is, to be charged
// again at worst, which only errs towards denying.
//
// It returns the consumption it put back in the entry, in micro-tokens.
func (r *Reconciler) restore(s *global.Settlement, o owner, hold, uncertain bool) (kept int64) {
	if !uncertain {
		r.stats.keyErrors.Add(1)
	}
	consumed, returned := s.Consumed, s.Returned
	if uncertain {
		returned = 0
	}
	kept = r.putBack(s.Key, o, consumed, returned)
	if hold && o.e != nil {
		r.hold(o.e)
	}
	return kept
}

// putBack puts consumed and returned micro-tokens, taken out of o's entry
// for the key's settlement, back there, or keeps them as an orphan, and
// returns the consumption it put back in the entry.
func (r *Reconciler) putBack(key string, o owner, consumed, returned int64) (kept int64) {
	if o.e != nil {
		if consumed > 0 && o.e.Pending.Add(consumed) {
			kept, consumed = consumed, 0
		}
		if returned > 0 && o.sp.Mode == Optimistic {
			// A grant given back, less the spending it paid for: prepaid
			// again (see charge).
			if o.e.X.prepaid.Add(returned) {
				returned = 0
			}
		} else if returned > 0 && o.e.Allowance.Add(returned) {
			returned = 0
		}
	}
	if consumed > 0 || returned > 0 {
		r.addOrphan(key, o.sp, consumed, returned)
	}
	return kept
}
