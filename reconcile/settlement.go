package reconcile

import (
	"time"

	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/local"
)

// owner is whose a settlement is: an entry, or nobody for an orphan, and the
// spec it is settled under.
type owner struct {
	e  *Entry
	sp *Spec
	// claimed is true when the settlement holds its optimistic key's
	// claim to charge (State.claimCharge), released once it is answered.
	claimed bool
	// since is when the settlement was first found in doubt; 0 if it is
	// not.
	since time.Duration
}

// settlement computes what e settles this round: its unsettled consumption
// and, in lease mode, the allowance to give back (all of it for a key not
// touched since the last round) or to ask for, after spends that took used
// micro-tokens at least (a token each). It takes the amounts out of
// e; restore puts them back if the round fails. ok is false when there is
// nothing to settle.
func (r *Reconciler) settlement(e *Entry, sp *Spec, touched bool, used int64) (s global.Settlement, ok bool) {
	if sp.Mode != Optimistic && used == 0 && e.X.flags.Load()&(flagStarved|flagUntouched|flagReserved|flagPrepaid) == 0 &&
		e.Allowance.Load() == 0 && e.Pending.Load() == 0 {
		// A lease key that holds nothing, and was not starved (a
		// request's one-shot take, the long tail's every key), or an
		// exact key with nothing the fallback admitted: nothing to
		// charge, give back or size, and no settlement to build.
		return s, false
	}
	// Costs are whole tokens: lease grants are too, so that no instance
	// holds a fraction it cannot spend while others could.
	s = global.Settlement{Key: e.Key(), Limit: sp.Limit, Debt: r.debt(sp), Quantum: local.Micro}
	r.charge(e, &s)
	switch {
	case sp.Mode == Optimistic && touched:
		return s, true // charge, and learn the bucket for the next budget
	case sp.Mode != Lease:
	case !touched && r.Ahead(e, sp) && e.View().Age(r.clock.Now()) < r.Fresh(e, sp) && e.Allowance.Load() <= max(r.LeaseCap(e, sp), r.aheadTurn(sp)):
		// A key the fleet contends for, untouched since the last round:
		// its lease, a turn taken ahead (see Ahead), is kept while its
		// view is fresh. In a large fleet an instance's turns come a
		// second or so apart, its requests a round or two apart: a lease
		// given back would be fetched again, a call more, and queued
		// behind the whole fleet's turns.
	case !touched && r.Takers(e) > 1 && e.X.markUntouched() && e.Allowance.Load() <= r.LeaseCap(e, sp):
		// A key the fleet shares, untouched for a round: its lease, a
		// turn or two, is kept for one more. An instance that asks for
		// such a key a few times a second would give it back and fetch
		// it again in turns, two calls where none is needed.
	case !touched:
		// Nobody asked for the key since the last round (two, for a
		// shared key): its lease goes back, and its stripes with it, if
		// its spends had split it.
		e.X.clearUntouched()
		e.Allowance.Unstripe()
		if s.Returned = e.Allowance.TakeAll() + r.sides.takeReserved(e); s.Returned > 0 {
			e.X.setIdle()
		}
		e.X.clearStarved()
	default:
		e.X.clearUntouched()
		bal := e.Allowance.Load()
		starved := e.X.clearStarved()
		tgt := r.resize(e, sp, bal, used, starved)
		switch {
		case bal > 2*tgt:
			// Far more than the key needs: the rest goes back. A lease
			// a little larger than its target is spent instead, so that a
			// target that moves (see LeaseCap) costs no round trips.
			s.Returned = e.Allowance.TakeUpTo(bal - tgt)
		case starved && !r.Ahead(e, sp) && r.ready(e, sp, bal, r.clock.Now()):
			// Demand outran the lease: top it up, when it is the
			// instance's turn (see Due). A key that was not starved is
			// fetched on demand instead, so that light keys hold no lease
			// between their requests.
			s.Want = tgt - bal
		}
	}
	return s, s.Consumed > 0 || s.Returned > 0 || s.Want > 0
}

// apply applies a settlement's reply to its entry and reports whether the
// entry still holds something to settle next round: a lease's allowance or
// unsettled consumption.
func (r *Reconciler) apply(s *global.Settlement, o owner, rep *global.Reply, now time.Duration) bool {
	r.stats.keysSettled.Add(1)
	if rep.Reset {
		r.stats.resets.Add(1)
	}
	e, sp := o.e, o.sp
	if e == nil {
		return false
	}
	switch sp.Mode {
	case Lease:
		if rep.Granted > 0 && !e.Allowance.Add(rep.Granted) { // the entry left meanwhile
			r.addOrphan(s.Key, sp, 0, rep.Granted)
		}
	case Optimistic:
		// The bucket's refill since the last view is shared out; a first
		// view has none to share: the budget is a share of what the bucket
		// holds. What this instance spent since the settlement took its
		// consumption (or, for a fetch, all it has not charged yet) is not
		// in the reply's tokens: it counts against them, so that a budget
		// is never granted again for tokens spent already.
		// A first budget counts what was spent before it (a first request
		// admitted on trust) against the cap too: between two settlements
		// an instance spends at most Cap (docs/accuracy.md).
		//
		// A fetch that Redis granted tokens out of the bucket (see fetch)
		// adds them to the budget instead, prepaid: the refill since the
		// last view is what the grant took.
		if rep.Granted > 0 {
			if !r.sides.addPrepaid(e, rep.Granted) {
				r.addOrphan(s.Key, sp, 0, rep.Granted) // the entry left meanwhile
			} else {
				// The grant replaces the budget's fraction of a token, if
				// any: the bucket holds it, and the grant was sized without
				// it (see fetch). If the entry left, handOff gives prepaid
				// back.
				e.Allowance.Update(func(old int64) int64 { return old - old%local.Micro + rep.Granted })
			}
			break
		}
		var elapsed time.Duration
		seen := e.View().Seen
		if seen != 0 {
			elapsed = now - seen
		}
		// What was spent is read after the budget it replaces (old), in
		// each try of the update: a request records its consumption
		// before it takes its cost from the budget (see
		// Limiter.spendBudget), so a cost missing from old is in Pending,
		// and one taken after old was read fails the update, which reads
		// both again. A spend may then be counted twice (recorded before
		// Pending is read, taken from the new budget), towards denying;
		// never in neither, which renewed the budget with tokens spent.
		prepaid := r.sides.prepaid(e)
		e.Allowance.Update(func(old int64) int64 {
			spent := max(e.Pending.Load()-prepaid, 0)
			b := r.Budget(sp, rep.Tokens-spent, old, elapsed)
			if seen == 0 {
				b = max(min(b, r.Cap(sp)-spent), 0)
			}
			return b
		})
	}
	r.observe(e, s, rep)
	r.SetView(e, local.View{Tokens: rep.Tokens, Seen: now})
	return sp.Mode == Lease && e.Allowance.Load() > 0 || e.Pending.Load() > 0
}

// hold keeps e for the next round.
func (r *Reconciler) hold(e *Entry) { r.held = append(r.held, e) }
