package reconcile

import (
	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/local"
)

// handOff receives every entry that leaves the store, with its unspent
// allowance and unsettled consumption. A lease's allowance was reserved in
// Redis and goes back; an optimistic budget was not and is dropped.
func (r *Reconciler) handOff(e *Entry, unused, pending int64) {
	sp := e.X.Spec()
	pp, ahead := r.sides.retire(e)
	if sp == nil || sp.Mode != Lease {
		unused = 0
	} else {
		unused += ahead // taken ahead, due or not: it goes back
	}
	if pp > 0 { // as charge does
		d := min(pp, pending)
		pending, unused = pending-d, unused+pp-d
	}
	if unused > 0 || pending > 0 {
		r.addOrphan(e.Key(), sp, pending, unused)
		r.stats.evictedPending.Add(1)
	}
	r.stats.localAllowed.Add(e.Allowance.TakeSpends())
	r.stats.evicted.Add(1)
	if sp != nil && sp.Mode == Optimistic {
		r.evicted.add(e.Key())
	}
	if r.cfg.OnLeave != nil {
		r.cfg.OnLeave(e, pending)
	}
}

// SetView records v as e's latest view of its global bucket. An entry that
// left the store before the view came (a reply to a call made for it) is
// handed to Config.OnLeave again, with the view its leaving did not see.
func (r *Reconciler) SetView(e *Entry, v local.View) {
	e.SetView(v)
	if r.cfg.OnLeave != nil && e.Retired() {
		r.cfg.OnLeave(e, 0)
	}
}

// addOrphan records what a key without an entry owes or is owed.
func (r *Reconciler) addOrphan(key string, sp *Spec, consumed, returned int64) {
	r.mergeOrphan(key, orphan{spec: sp, consumed: consumed, returned: returned})
}

// mergeOrphan adds a's dues to the orphan of key (a shallow one stays
// shallow).
func (r *Reconciler) mergeOrphan(key string, a orphan) {
	if a.spec == nil {
		return // never used: it owes nothing
	}
	r.mu.Lock()
	o, had := r.orphans[key]
	if !had {
		r.norphans.Add(1)
	}
	o.spec = a.spec
	o.consumed += a.consumed
	o.returned += a.returned
	o.shallow = o.shallow || a.shallow
	r.orphans[key] = o
	r.orphanConsumed += a.consumed
	r.mu.Unlock()
}

// Owed returns the keys whose entries left the store with dues to settle,
// and the settlements of the round under way, which takes them: what the
// instance keeps per key beside its entries until Redis takes it. It takes
// no lock.
func (r *Reconciler) Owed() int { return int(r.norphans.Load() + r.stats.inFlight.Load()) }

// takeOrphans moves the orphans into the batch: all of them, or while a
// breaker is not closed and all is false, at most outageOrphans (see few).
// Close takes them all.
func (r *Reconciler) takeOrphans(all bool) {
	// The map is swapped under the lock and read outside it: a round after
	// an outage or a burst of evictions may take hundreds of thousands, and
	// requests take the lock too (Orphan, Fetch, Starved).
	r.mu.Lock()
	taken := r.orphans
	if len(taken) == 0 {
		r.stats.inFlight.Store(int64(len(r.sets)))
		r.mu.Unlock()
		return
	}
	part := !all && r.ndegraded.Load() > 0 && len(taken) > outageOrphans
	if part {
		taken = r.few()
	} else {
		r.orphans = r.spare
		r.spare = nil
		r.norphans.Store(0)
		if r.orphans == nil {
			r.orphans = make(map[string]orphan)
		}
		r.orphanConsumed = 0
	}
	// So that Stats never sees the orphans taken nowhere (those in doubt,
	// put back below, are counted twice meanwhile).
	r.stats.inFlight.Store(int64(len(r.sets) + len(taken)))
	r.mu.Unlock()

	var back []string // keys in doubt: their dues wait for the next round
	for key, o := range taken {
		if r.inDoubt[key] {
			back = append(back, key)
			continue
		}
		debt := r.debt(o.spec)
		if o.shallow {
			debt = o.spec.Limit.Burst
		}
		r.sets = append(r.sets, global.Settlement{Key: key, Limit: o.spec.Limit, Debt: debt, Consumed: o.consumed, Returned: o.returned})
		r.owners = append(r.owners, owner{sp: o.spec})
	}
	for _, key := range back {
		r.mergeOrphan(key, taken[key])
	}
	r.stats.inFlight.Store(int64(len(r.sets)))
	// Keep the map for the next swap, unless a burst made it large (a map
	// keeps its size once grown) or it is an outage's few (made to their
	// full size, while the swaps of a healthy Redis take the orphans of a
	// round, usually far fewer).
	if !part && len(taken) <= outageOrphans {
		clear(taken)
		r.mu.Lock()
		r.spare = taken
		r.mu.Unlock()
	}
}

// outageOrphans is the most orphans a round takes while a breaker is not
// closed: a Redis that refuses the round's calls would have them all go
// there and back every round, each in a settlement of its own, which an
// outage's flood of distinct keys (hundreds of thousands of orphans) makes
// several times the orphans' own memory. A few calls' worth still settle
// the orphans of the nodes that answer, and probe the others; once every
// breaker is closed, the next round takes them all.
const outageOrphans = 4 * maxBatch

// few takes outageOrphans of the orphans out of their map and returns them
// in a map of their own. r.mu must be held.
func (r *Reconciler) few() map[string]orphan {
	taken := make(map[string]orphan, outageOrphans)
	for key, o := range r.orphans {
		taken[key] = o
		delete(r.orphans, key)
		r.orphanConsumed -= o.consumed
		if len(taken) == outageOrphans {
			break
		}
	}
	r.norphans.Add(-int64(len(taken)))
	return taken
}
