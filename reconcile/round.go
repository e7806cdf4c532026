package reconcile

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/local"
)

// loop is the reconciler's goroutine: rounds on the ticker (the first
// Config.FirstRound after New, then every SyncInterval) and, no sooner than
// gap after the previous round, when a key starves; heartbeats on their own
// ticker. It returns when ctx ends.
func (r *Reconciler) loop(ctx context.Context) {
	tick := time.NewTicker(r.cfg.FirstRound)
	defer tick.Stop()
	first := r.cfg.FirstRound != r.cfg.SyncInterval // the ticker's period is still FirstRound
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
			if first {
				tick.Reset(r.cfg.SyncInterval)
				first = false
			}
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
		r.relayout()
		r.round(ctx)
		last = r.clock.Now()
	}
}

// relayout asks a Router that spreads the keys over nodes (a Redis Cluster)
// to load their layout again while a node's breaker is not closed: a
// replica promoted in a dead master's place takes its keys as soon as the
// client knows, not when the breaker next opens (the client coalesces the
// reloads, one at most every 200 ms).
func (r *Reconciler) relayout() {
	if r.ndegraded.Load() == 0 {
		return
	}
	if rl, ok := r.router.(relayouter); ok {
		rl.Relayout()
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
		spends := e.Allowance.TakeSpends()
		allowed += spends
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
		if claim && !r.settleDue(e, sp, r.clock.Now()) {
			// Settled in a later round, once it is due: a key held from
			// an earlier round too, which the rounds in between would
			// otherwise settle whenever its instance did not ask for it.
			r.hold(e)
			continue
		}
		if claim && !e.X.claimCharge() {
			r.hold(e) // a fetch is charging it: settle it next round
			continue
		}
		if s, ok := r.settlement(e, sp, i < touched, int64(spends)*local.Micro); ok {
			r.sets = append(r.sets, s)
			r.owners = append(r.owners, owner{e: e, sp: sp, claimed: claim})
			continue
		}
		if claim {
			e.X.releaseCharge()
		}
		if sp.Mode == Lease && (e.Allowance.Load() > 0 || e.X.flags.Load()&flagReserved != 0) {
			r.hold(e) // nothing to settle now; give the lease back once idle
		}
	}
	clear(r.batch)
	r.stats.localAllowed.Add(allowed)
	r.takeOrphans(false)
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
		if r.Ahead(e, sp) || !r.ready(e, sp, bal, r.clock.Now()) {
			continue // not its turn yet, or taken ahead: its requests fetch when it is
		}
		tgt := r.resize(e, sp, bal, 0, e.X.clearStarved())
		if bal < tgt {
			// Charged as a round charges it: with what the fallback
			// admitted of the key since an outage began, its claim (see
			// charge). Taken raw, a top-up that came first after an
			// outage charged those admissions in full.
			s := global.Settlement{Key: e.Key(), Limit: sp.Limit, Debt: r.debt(sp), Want: tgt - bal, Quantum: local.Micro}
			r.charge(e, &s)
			r.sets = append(r.sets, s)
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
	for i := range r.sets[:n] {
		// Resends too: one sent as Redis failed is the first write once it
		// is back (see markOutage).
		r.markOutage(&r.sets[i])
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
		failed = r.settleNode(ctx, groups[0].n, roundOrder{r}, r.sets, replies, ends, func(lo, hi int) {
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
				g.err = r.settleNode(ctx, g.n, groupOrder{r, g}, g.sets, g.replies, g.ends, func(lo, hi int) { came <- call{g, lo, hi} })
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
	r.hurry.reset()
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
			r.superseded(s, o, rep)
		}
		r.Took(o.sp, s, rep)
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

// refusal returns the first of replies' errors by which the node refuses
// every call alike (global.CauseOf: a refused client, NOAUTH, WRONGPASS,
// NOPERM; a full Redis, OOM; a read-only replica, READONLY; MASTERDOWN), or
// nil. A call that got one fails for the breaker: the node will refuse
// every settlement alike until its state or configuration changes, so the
// fallback should decide without a round trip each, and the settlements it
// refused wait for the breaker's probe rather than go again every round.
func refusal(replies []global.Reply) error {
	for i := range replies {
		if global.CauseOf(replies[i].Err) != global.NoCause {
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

// trim lets go of the round's buffers when they are much larger than the
// round that just used them (one that settled a burst of evictions, or an
// outage's orphans), so that memory follows the keys, not the largest round.
func (r *Reconciler) trim() {
	if cap(r.batch) > 4*max(len(r.batch), maxBatch) {
		r.batch = nil
	}
	if cap(r.held) > 4*max(len(r.held), maxBatch) {
		r.held = nil
	}
	if cap(r.sets) > 4*max(len(r.sets), maxBatch) {
		r.sets, r.owners, r.replies, r.ends = nil, nil, nil, nil
		for _, g := range r.groups {
			g.sets, g.replies, g.ends = nil, nil, nil
		}
	}
}
