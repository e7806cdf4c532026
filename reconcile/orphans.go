package reconcile

import (
	"github.com/hybridlimit/hybrid/global"
)

// handOff receives every entry that leaves the store, with its unspent
// allowance and unsettled consumption. A lease's allowance was reserved in
// Redis and goes back; an optimistic budget was not and is dropped.
func (r *Reconciler) handOff(e *Entry, unused, pending int64) {
	sp := e.X.Spec()
	if sp == nil || sp.Mode != Lease {
		unused = 0
	}
	if pp := e.X.prepaid.Retire(); pp > 0 { // as charge does
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
}

// addOrphan records what a key without an entry owes or is owed.
func (r *Reconciler) addOrphan(key string, sp *Spec, consumed, returned int64) {
	if sp == nil {
		return // never used: it owes nothing
	}
	r.mu.Lock()
	o := r.orphans[key]
	o.spec = sp
	o.consumed += consumed
	o.returned += returned
	r.orphans[key] = o
	r.orphanConsumed += consumed
	r.mu.Unlock()
}

// addRecharge records what a key lost with all of its node's data owes
// again: charged down to -burst at most (see witnessedOn).
func (r *Reconciler) addRecharge(key string, sp *Spec, consumed int64) {
	if sp == nil {
		return
	}
	r.addOrphan(key, sp, consumed, 0)
	r.mu.Lock()
	o := r.orphans[key]
	o.shallow = true
	r.orphans[key] = o
	r.mu.Unlock()
}

// takeOrphans moves the orphans into the batch.
func (r *Reconciler) takeOrphans() {
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
	r.orphans = r.spare
	r.spare = nil
	if r.orphans == nil {
		r.orphans = make(map[string]orphan)
	}
	r.orphanConsumed = 0
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
		o := taken[key]
		r.addOrphan(key, o.spec, o.consumed, o.returned)
		if o.shallow {
			r.mu.Lock()
			b := r.orphans[key]
			b.shallow = true
			r.orphans[key] = b
			r.mu.Unlock()
		}
	}
	r.stats.inFlight.Store(int64(len(r.sets)))
	// Keep the map for the next swap, unless a burst made it large: a map
	// keeps its size once grown.
	if len(taken) <= 4*maxBatch {
		clear(taken)
		r.mu.Lock()
		r.spare = taken
		r.mu.Unlock()
	}
}
