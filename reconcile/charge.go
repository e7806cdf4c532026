package reconcile

import (
	"time"

	"github.com/hybridlimit/hybrid/global"
)

// What a settlement takes out of an entry, and puts back when it fails.

// charge takes e's unsettled consumption out of it into s: what it spent,
// less what Redis granted it out of the bucket meanwhile (prepaid: those
// tokens left the bucket when they were granted), or, if it spent less than
// that, the rest of the grant given back, so that the bucket gets back what
// the grant took beyond the spending.
//
// With Config.ShareCredit, what the fallback admitted out of e's share
// since an outage began is charged with its claim (global.Settlement.Since
// and Claim): the refill the share kept because it was spent, which the
// bucket in Redis, full and not seeing those admissions, may have lost.
// Charged in full, the fleet's shares would pay for the outage's refill
// twice.
func (r *Reconciler) charge(e *Entry, s *global.Settlement) {
	s.Consumed = e.Pending.TakeAll()
	if pp := r.sides.takePrepaid(e); pp > 0 {
		if pp <= s.Consumed {
			s.Consumed -= pp
		} else {
			s.Consumed, s.Returned = 0, s.Returned+pp-s.Consumed
		}
	}
	if r.cfg.ShareCredit && s.Consumed > 0 {
		if since, kept, ok := e.TakeKept(); ok {
			// The Redis time the outage began, as this host's clock
			// tells: the script compares it with the bucket's last write.
			s.Since, s.Claim = r.clock.Time(since), min(kept, s.Consumed)
			// What the share kept beyond this charge is the next one's
			// to claim: the outage's admissions may be charged in
			// parts (a part in a settlement in doubt, sent again as it
			// was, and what came after it with a fetch), and a claim
			// capped at one part lost the rest, charged in full.
			e.PutKept(since, kept-s.Claim)
		}
	}
}

// markOutage gives s, a settlement of a key whose node's breaker is open
// or closed less than outageMark ago, the Since of the outage if it has
// none: whoever writes the bucket first once Redis is back, the bucket
// keeps the refill it lost at its burst while nobody wrote it for the
// claims of the fleet's charges to come (see global.Settlement.Claim),
// however many writes come before them. s needs a Seq. A settlement sent
// again, in doubt since Redis failed, gets it too: a duplicate ignores it,
// and one the outage lost is the first write once Redis is back.
func (r *Reconciler) markOutage(s *global.Settlement) {
	if !s.Since.IsZero() || !r.cfg.ShareCredit || r.ndegraded.Load() == 0 && !r.settling(r.markUntil.Load()) {
		return
	}
	if d, ok := r.outageOf(r.nodeOf(done, s.Key)); ok {
		s.Since = r.clock.Time(d)
	}
}

// outageOf returns when the outage of node n began, if its breaker is open
// or closed less than outageMark ago. A node with no outage of its own
// while another's is that recent (on a Redis Cluster, the replica promoted
// in the place of a master that failed: a node new to this instance) gets
// the latest outage's start.
func (r *Reconciler) outageOf(n *node) (time.Duration, bool) {
	if d := n.openedAt.Load(); d > 0 && (n.degraded.Load() || r.settling(n.markUntil.Load())) {
		return time.Duration(d), true
	}
	if d := r.lastOpened.Load(); d > 0 && n.openedAt.Load() == 0 && (r.ndegraded.Load() > 0 || r.settling(r.markUntil.Load())) {
		return time.Duration(d), true
	}
	return 0, false
}

// unclaim gives the claim of s, a settlement of o's entry that surely was
// not applied, back to the entry: its next charge claims it again.
func (r *Reconciler) unclaim(s *global.Settlement, o owner) {
	if s.Claim > 0 && o.e != nil {
		o.e.PutKept(s.Since.Sub(r.clock.Time(0)), s.Claim)
	}
}

// Unsettled returns what e spent that Redis has not charged and did not
// grant beforehand, in micro-tokens: what the bucket does not know of yet.
func (r *Reconciler) Unsettled(e *Entry) int64 {
	return max(e.Pending.Load()-r.sides.prepaid(e), 0)
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
		returned = 0 // and the claim is lost: charged in full at worst
	} else {
		r.unclaim(s, o)
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
			if r.sides.addPrepaid(o.e, returned) {
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
