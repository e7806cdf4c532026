package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/local"
)

// loop is the reconciler's goroutine: rounds on the ticker and, no sooner
// than gap after the previous round, when a key starves; heartbeats on their
// own ticker. It returns when ctx ends.
func (r *Reconciler) loop(ctx context.Context) {
	tick := time.NewTicker(r.cfg.SyncInterval)
	defer tick.Stop()
	beat := time.NewTimer(r.heartbeat(ctx))
	defer beat.Stop()
	soon := time.NewTimer(r.cfg.SyncInterval)
	soon.Stop()
	defer soon.Stop()
	waiting := false // soon is set
	last := r.clock.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-beat.C:
			beat.Reset(r.heartbeat(ctx))
			continue
		case <-tick.C:
		case <-r.early:
			if wait := r.gap - (r.clock.Now() - last); wait > 0 {
				if !waiting {
					waiting = true
					soon.Reset(wait)
				}
				continue
			}
			r.topUp(ctx)
			last = r.clock.Now()
			continue
		case <-soon.C:
			waiting = false
			r.topUp(ctx)
			last = r.clock.Now()
			continue
		}
		r.round(ctx)
		last = r.clock.Now()
	}
}

// round settles every key touched since the last round, every key that
// still holds allowance or unsettled consumption, and every orphan, in one
// pipelined round trip.
func (r *Reconciler) round(ctx context.Context) {
	r.sets, r.owners = r.sets[:0], r.owners[:0]
	r.takeDoubts()
	r.batch = r.keys.Tick(r.batch[:0])
	touched := len(r.batch)
	for _, e := range r.batch {
		e.X.setQueued()
	}
	for _, e := range r.held {
		if e.X.setQueued() { // held, not touched: not in the batch yet
			r.batch = append(r.batch, e)
		}
	}
	clear(r.held)
	r.held = r.held[:0]

	var allowed uint64
	var waiting int64 // the consumption of keys that wait for their settlement in doubt
	for i, e := range r.batch {
		e.X.clearQueued()
		allowed += e.Allowance.TakeSpends()
		sp := e.X.Spec()
		if sp == nil || e.Retired() { // a retired entry's dues are an orphan now
			continue
		}
		if r.inDoubt[e.Key()] {
			r.hold(e) // its settlement in doubt goes first: settle it next round
			waiting += e.Pending.Load()
			continue
		}
		claim := sp.Mode == Optimistic
		if claim && e.X.firstPending() {
			// Its first request is being admitted on trust: a first budget
			// set now would not count it. Settle it next round.
			r.hold(e)
			continue
		}
		if claim && !e.X.claimCharge() {
			r.hold(e) // a fetch is charging it: settle it next round
			continue
		}
		if s, ok := r.settlement(e, sp, i < touched); ok {
			r.sets = append(r.sets, s)
			r.owners = append(r.owners, owner{e: e, sp: sp, claimed: claim})
			continue
		}
		if claim {
			e.X.releaseCharge()
		}
		if sp.Mode == Lease && e.Allowance.Load() > 0 {
			r.hold(e) // nothing to settle now; give the lease back once idle
		}
	}
	clear(r.batch)
	r.stats.localAllowed.Add(allowed)
	r.takeOrphans()
	kept := r.send(ctx) + waiting
	r.trim()
	r.mu.Lock()
	kept += r.orphanConsumed // failed orphans, and keys that left meanwhile
	r.mu.Unlock()
	r.stats.unsettled.Store(kept)
}

// topUp is an early round: it settles only the leases that ran low since the
// last round, so that hot keys are topped up before they run dry, and leaves
// the rest (sizing, idle leases, charges) to the regular rounds.
func (r *Reconciler) topUp(ctx context.Context) {
	r.mu.Lock()
	r.batch = append(r.batch[:0], r.low...)
	clear(r.low)
	r.low = r.low[:0]
	r.mu.Unlock()
	r.sets, r.owners = r.sets[:0], r.owners[:0]
	r.resends = 0
	for _, e := range r.batch {
		sp := e.X.Spec()
		if sp == nil || sp.Mode != Lease || e.Retired() || r.inDoubt[e.Key()] {
			continue
		}
		bal := e.Allowance.Load()
		tgt := r.resize(e, sp, bal, e.X.clearStarved())
		if bal < tgt {
			r.sets = append(r.sets, global.Settlement{Key: e.Key(), Limit: sp.Limit, Consumed: e.Pending.TakeAll(), Want: tgt - bal, Quantum: local.Micro})
			r.owners = append(r.owners, owner{e: e, sp: sp})
		}
	}
	clear(r.batch)
	r.send(ctx)
}

// maxBatch bounds the keys of one Settle call: a round with more is sent as
// several calls, each with its own timeout, so that a large round cannot
// time out as a whole and then fail again, larger, every round after.
const maxBatch = 512

// send settles r.sets and applies the replies. The settlements of each Redis
// node go through that node's breaker, in calls of at most maxBatch keys;
// the nodes of a Cluster are called at once, so that a node that does not
// answer delays only its own keys. It returns the consumption, in
// micro-tokens, that it could not charge and put back in the entries.
func (r *Reconciler) send(ctx context.Context) (kept int64) {
	n := len(r.sets)
	if n == 0 {
		return 0
	}
	if cap(r.replies) < n {
		r.replies = make([]global.Reply, n)
		r.ends = make([]time.Duration, n)
	}
	replies, ends := r.replies[:n], r.ends[:n]
	r.stats.rounds.Add(1)
	r.stats.inFlight.Store(int64(n))
	defer r.stats.inFlight.Store(0)
	for i := r.resends; i < n; i++ { // the new ones; resends keep theirs
		r.seq++
		r.sets[i].Instance, r.sets[i].Seq = r.dedup, r.seq
	}
	for _, o := range r.owners {
		if o.e != nil {
			o.e.X.setSettling()
		}
	}
	// Each call's replies are applied as soon as they come, so that a large
	// round (an outage's backlog, a burst of evictions) grants and charges
	// call by call, not at its end.
	var failed error
	if groups := r.group(ctx); len(groups) == 1 {
		failed = r.settleNode(ctx, groups[0].n, r.sets, replies, ends, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				kept += r.settled(i, &replies[i], ends[i])
			}
			r.stats.inFlight.Add(int64(lo - hi))
			r.wake()
		})
	} else {
		// The nodes are called at once, each by a goroutine of its own;
		// the replies come back here, where they are applied.
		type call struct {
			g      *group
			lo, hi int
		}
		came := make(chan call)
		var wg sync.WaitGroup
		for _, g := range groups {
			g.sets = g.sets[:0]
			for _, i := range g.idx {
				g.sets = append(g.sets, r.sets[i])
			}
			g.replies = slices.Grow(g.replies[:0], len(g.idx))[:len(g.idx)]
			g.ends = slices.Grow(g.ends[:0], len(g.idx))[:len(g.idx)]
			wg.Go(func() {
				g.err = r.settleNode(ctx, g.n, g.sets, g.replies, g.ends, func(lo, hi int) { came <- call{g, lo, hi} })
			})
		}
		go func() { // ends when the callers have: range came below waits for it
			wg.Wait()
			close(came)
		}()
		for c := range came {
			for j := c.lo; j < c.hi; j++ {
				i := c.g.idx[j]
				replies[i], ends[i] = c.g.replies[j], c.g.ends[j]
				kept += r.settled(i, &replies[i], ends[i])
			}
			r.stats.inFlight.Add(int64(c.lo - c.hi))
			r.wake()
		}
		for _, g := range groups {
			if failed == nil {
				failed = g.err
			}
			clear(g.sets)
			clear(g.replies)
			g.err = nil
		}
	}
	r.resends = 0
	// The keys in doubt now: those of a round's resends that failed again
	// and of the settlements that got no reply, and, after an early
	// round, those of the last round still waiting for the next.
	r.clearInDoubt(len(r.doubts))
	for i := range r.doubts {
		if r.doubts[i].s.Instance == r.dedup {
			r.inDoubt[r.doubts[i].s.Key] = true
		}
	}
	r.inDoubtPeak = max(r.inDoubtPeak, len(r.inDoubt))
	if failed != nil {
		r.stats.roundErrors.Add(1)
		r.roundFailed(n, failed)
	} else {
		r.roundSucceeded()
	}
	clear(r.owners)
	clear(replies)
	return kept
}

// settled handles the reply to r.sets[i], which came at end: it applies
// it, or keeps the settlement in doubt if it may have been applied without a
// reply (a resend that failed tells nothing more), or puts back what it
// took if it surely was not. It returns the consumption it kept unsettled.
func (r *Reconciler) settled(i int, rep *global.Reply, end time.Duration) (kept int64) {
	s, o := &r.sets[i], r.owners[i]
	if o.e != nil {
		defer o.e.X.clearSettling() // after the reply is applied
	}
	if o.claimed {
		defer o.e.X.releaseCharge()
		o.claimed = false // a doubt sent again by a later round claims nothing
	}
	switch {
	case rep.Err == nil:
		if rep.Duplicate {
			r.stats.duplicates.Add(1)
		}
		if r.apply(s, o, rep, end) {
			r.hold(o.e)
		}
		return 0
	case i < r.resends || mayBeApplied(rep.Err):
		if i >= r.resends {
			r.stats.uncertain.Add(1)
			o.since = end
		}
		r.stats.keyErrors.Add(1)
		if s.Instance == r.fetchID {
			r.fetchDoubt(doubt{*s, o})
		} else {
			r.doubts = append(r.doubts, doubt{*s, o})
		}
		if o.e != nil {
			r.hold(o.e)
		}
		return s.Consumed
	default:
		return r.restore(s, o, true, false)
	}
}

// refusal returns the first of replies' errors by which Redis refuses the
// client (global.IsRefusal: NOAUTH, WRONGPASS, NOPERM), or nil. A call that
// got one fails for the breaker: Redis will refuse every call alike, so the
// fallback should decide without a round trip each.
func refusal(replies []global.Reply) error {
	for i := range replies {
		if global.IsRefusal(replies[i].Err) {
			return replies[i].Err
		}
	}
	return nil
}

// wake wakes the requests waiting in AwaitRound: a call's replies have
// been applied.
func (r *Reconciler) wake() {
	ch := make(chan struct{})
	close(*r.applied.Swap(&ch))
}

// group is the settlements of a round that go to one Redis node, and the
// buffers of the calls to it.
type group struct {
	n       *node
	idx     []int // indexes in r.sets
	sets    []global.Settlement
	replies []global.Reply
	ends    []time.Duration
	err     error // the first failure of the calls to n
}

// group sorts r.sets by the node of their keys. On a single Redis, or when
// all the keys are on one node, it returns one group, whose idx is not set:
// it is all of r.sets. A node's layout is looked up within the breakers'
// call timeout.
func (r *Reconciler) group(ctx context.Context) []*group {
	for _, g := range r.groups {
		g.n, g.idx = nil, g.idx[:0]
	}
	if r.router == nil {
		return r.oneGroup(r.def)
	}
	lctx, cancel := context.WithTimeout(ctx, r.callTimeout)
	defer cancel()
	k := 0 // groups in use
	for i := range r.sets {
		n := r.nodeOf(lctx, r.sets[i].Key)
		j := 0
		for j < k && r.groups[j].n != n {
			j++
		}
		if j == k {
			if k == len(r.groups) {
				r.groups = append(r.groups, &group{})
			}
			r.groups[k].n = n
			k++
		}
		r.groups[j].idx = append(r.groups[j].idx, i)
	}
	if k == 1 {
		return r.oneGroup(r.groups[0].n)
	}
	return r.groups[:k]
}

// oneGroup returns the one group of a round whose keys are all on node n.
func (r *Reconciler) oneGroup(n *node) []*group {
	if len(r.groups) == 0 {
		r.groups = append(r.groups, &group{})
	}
	r.groups[0].n = n
	return r.groups[:1]
}

// settleNode settles sets, whose keys are on node n, through n's breaker in
// calls of at most maxBatch keys, and stores each one's reply and the time
// it came in replies and ends; after each call it calls came with the range
// of sets the call settled. A settlement that got no reply, or that the
// breaker refused, gets the call's error as its Reply.Err. It returns the
// first call's error, if one failed.
func (r *Reconciler) settleNode(ctx context.Context, n *node, sets []global.Settlement, replies []global.Reply, ends []time.Duration, came func(lo, hi int)) (failed error) {
	for lo := 0; lo < len(sets); lo += maxBatch {
		hi := min(lo+maxBatch, len(sets))
		s, rep := sets[lo:hi], replies[lo:hi]
		clear(rep)
		start := r.clock.Now()
		err := r.call(ctx, n, func(ctx context.Context) error {
			if err := r.st.Settle(ctx, s, rep); err != nil {
				return err
			}
			return refusal(rep)
		})
		end := r.clock.Now()
		r.stats.lastRound.Store(int64(end - start))
		if err == nil {
			r.stats.roundTrip.observe(end - start)
			r.clockSample(start, end, rep)
		} else {
			failed = cmp.Or(failed, err)
			// On a Cluster, Settle's error leaves the replies that came
			// valid; the others carry the error already, unless the
			// breaker refused the call.
			for j := range rep {
				if rep[j].Err == nil && rep[j].Now.IsZero() {
					rep[j].Err = err
				}
			}
		}
		for j := lo; j < hi; j++ {
			ends[j] = end
		}
		came(lo, hi)
	}
	return failed
}

// clockSample records the clock of Redis as the first of replies that
// carries it tells it, for a round trip from start to end.
func (r *Reconciler) clockSample(start, end time.Duration, replies []global.Reply) {
	for i := range replies {
		if replies[i].Err == nil && !replies[i].Now.IsZero() {
			r.stats.clockSample(r.clock.Time(start), r.clock.Time(end), replies[i].Now)
			return
		}
	}
}

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
// touched since the last round) or to ask for. It takes the amounts out of
// e; restore puts them back if the round fails. ok is false when there is
// nothing to settle.
func (r *Reconciler) settlement(e *Entry, sp *Spec, touched bool) (s global.Settlement, ok bool) {
	// Costs are whole tokens: lease grants are too, so that no instance
	// holds a fraction it cannot spend while others could.
	s = global.Settlement{Key: e.Key(), Limit: sp.Limit, Quantum: local.Micro}
	charge(e, &s)
	switch {
	case sp.Mode == Optimistic && touched:
		return s, true // charge, and learn the bucket for the next budget
	case sp.Mode != Lease:
	case !touched:
		if s.Returned = e.Allowance.TakeAll(); s.Returned > 0 {
			e.X.setIdle()
		}
		e.X.clearStarved()
	default:
		bal := e.Allowance.Load()
		starved := e.X.clearStarved()
		tgt := r.resize(e, sp, bal, starved)
		switch {
		case bal > tgt:
			s.Returned = e.Allowance.TakeUpTo(bal - tgt)
		case starved:
			// Demand outran the lease: top it up. A key that was not
			// starved is fetched on demand instead, so that light keys hold
			// no lease between their requests.
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
			if !e.X.prepaid.Add(rep.Granted) {
				r.addOrphan(s.Key, sp, 0, rep.Granted) // the entry left meanwhile
			} else {
				e.Allowance.Add(rep.Granted) // if the entry left, handOff gives prepaid back
			}
			break
		}
		var elapsed time.Duration
		seen := e.View().Seen
		if seen != 0 {
			elapsed = now - seen
		}
		spent := r.Unsettled(e)
		tokens := rep.Tokens - spent
		e.Allowance.Update(func(old int64) int64 {
			b := r.Budget(sp, tokens, old, elapsed)
			if seen == 0 {
				b = max(min(b, r.Cap(sp)-spent), 0)
			}
			return b
		})
	}
	e.SetView(local.View{Tokens: rep.Tokens, Seen: now})
	return sp.Mode == Lease && e.Allowance.Load() > 0 || e.Pending.Load() > 0
}

// hold keeps e for the next round.
func (r *Reconciler) hold(e *Entry) { r.held = append(r.held, e) }

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
		r.sets = append(r.sets, global.Settlement{Key: key, Limit: o.spec.Limit, Consumed: o.consumed, Returned: o.returned})
		r.owners = append(r.owners, owner{sp: o.spec})
	}
	for _, key := range back {
		o := taken[key]
		r.addOrphan(key, o.spec, o.consumed, o.returned)
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

// trim lets go of the round's buffers when they are much larger than the
// round that just used them (one that settled a burst of evictions, or an
// outage's orphans), so that memory follows the keys, not the largest round.
func (r *Reconciler) trim() {
	if cap(r.sets) > 4*max(len(r.sets), maxBatch) {
		r.sets, r.owners, r.replies, r.ends = nil, nil, nil, nil
		for _, g := range r.groups {
			g.sets, g.replies, g.ends = nil, nil, nil
		}
	}
}

// Close stops the goroutine, waits for it and for every fetch under way,
// then settles every key for the last time: unspent leases go back and
// unsettled consumption is charged, within ctx. It removes this instance
// from the fleet count. It returns an error if something could not be
// settled. Close is idempotent: later calls return nil.
func (r *Reconciler) Close(ctx context.Context) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.closing.Store(true)
	r.mu.Unlock()
	r.stop()
	r.wg.Wait()

	r.keys.Drain() // every entry's dues become an orphan
	r.sets, r.owners = r.sets[:0], r.owners[:0]
	r.takeDoubts() // first: a key's settlement in doubt goes before its dues
	clear(r.inDoubt)
	r.takeOrphans()
	var errs []error
	var lost int64 // consumption not charged
	if len(r.sets) > 0 {
		replies := make([]global.Reply, len(r.sets))
		var err error
		// In calls of at most maxBatch keys, as rounds are: one call for
		// every key left could outlast any timeout.
		for lo := 0; lo < len(r.sets); lo += maxBatch {
			hi := min(lo+maxBatch, len(r.sets))
			if cerr := r.st.Settle(ctx, r.sets[lo:hi], replies[lo:hi]); err == nil {
				err = cerr
			}
		}
		failed := 0
		for i := range replies {
			if replies[i].Err != nil {
				failed++
				lost += r.sets[i].Consumed
				if err == nil {
					err = replies[i].Err
				}
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("reconcile: close: %d of %d keys not settled: %w", failed, len(r.sets), err))
		}
	}
	r.stats.unsettled.Store(lost)
	r.stats.inFlight.Store(0)
	if _, err := r.st.Leave(ctx, r.cfg.InstanceID, 3*r.cfg.HeartbeatInterval); err != nil {
		errs = append(errs, fmt.Errorf("reconcile: close: leave the fleet: %w", err))
	}
	err := errors.Join(errs...)
	r.logClose(len(r.sets), lost, err)
	return err
}
