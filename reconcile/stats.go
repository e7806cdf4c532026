package reconcile

import (
	"sync/atomic"
	"time"

	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/global"
)

// counters are the Reconciler's statistics, updated atomically.
type counters struct {
	rounds, roundErrors    atomic.Uint64
	keysSettled, keyErrors atomic.Uint64
	fetches, fetchErrors   atomic.Uint64
	fetchTimeouts          atomic.Uint64
	heartbeatErrors        atomic.Uint64
	transitions, evicted   atomic.Uint64
	evictedPending         atomic.Uint64
	uncertain              atomic.Uint64
	resent                 atomic.Uint64
	duplicates             atomic.Uint64
	unapplied              atomic.Uint64
	inFlight               atomic.Int64
	doubtsExpired          atomic.Uint64
	resets                 atomic.Uint64
	localAllowed           atomic.Uint64
	batches, batched       atomic.Uint64
	queued                 atomic.Uint64
	hurried                atomic.Uint64
	losses, recharged      atomic.Uint64
	tails                  atomic.Uint64
	forgiven               atomic.Uint64
	credited               atomic.Uint64
	lastRound              atomic.Int64 // ns
	byTransition           [nStates][nStates]atomic.Uint64
	refusals               [global.Causes]atomic.Uint64
	heard                  atomic.Int64 // live instances the last heartbeat counted
	unsettled              atomic.Int64 // micro-tokens the last regular round could not charge
	roundTrip              histogram
	queueWait              histogram
	batchTrip              histogram

	// The last Redis clock reading: written by the loop goroutine alone.
	clockSamples atomic.Uint64
	rtt, skew    atomic.Int64 // ns
}

// nStates is the number of breaker states: Closed, HalfOpen and Open.
const nStates = 3

// Stats is a snapshot of a Reconciler's work.
type Stats struct {
	Rounds          uint64        // settlement rounds that had something to settle
	RoundErrors     uint64        // rounds whose round trip failed or was refused by the breaker
	KeysSettled     uint64        // keys settled (rounds and fetches)
	KeyErrors       uint64        // key settlements that failed; their dues were kept
	Fetches         uint64        // cold or starved keys fetched on a request's behalf
	FetchErrors     uint64        // fetches that failed
	FetchTimeouts   uint64        // requests that stopped waiting for a fetch
	HeartbeatErrors uint64        // heartbeats that failed
	Transitions     uint64        // breaker state changes
	Evicted         uint64        // entries that left the store
	EvictedPending  uint64        // entries that left the store with consumption to charge or a lease to give back: they became orphans
	Uncertain       uint64        // settlements (and fetches asking for a grant) that got no reply, so may have been applied: each is sent again until a reply tells
	Resent          uint64        // calls for a request sent again because their connection broke under them (see SettleNow)
	Duplicates      uint64        // settlements sent again that Redis had applied already: each a charge not made twice
	Unapplied       uint64        // settlements in doubt that Redis read as superseded by a later one of their key, or dropped for a later fetch in doubt: perhaps never applied, their consumption charged again
	DoubtsExpired   uint64        // settlements in doubt for 5 minutes, given up: consumption charged anew, give-back dropped
	Resets          uint64        // buckets Redis held unreadable (another type, such as a string SET over one, or garbled fields), replaced by full ones
	LastRound       time.Duration // the last round trip's duration
	Breaker         breaker.State // the state now of the breaker furthest from closed (of Nodes)
	Instances       int64         // the fleet size used for fallback shares
	Keys            int           // keys tracked
	Orphans         int           // keys that left the store with dues still to settle, not yet in a round
	Journal         int           // entries of the lost-writes journal: what this instance's settlements took lately, key by key (a heartbeat interval or three, more through an outage)
	InFlight        int           // settlements of the round under way not answered yet (orphans it took included)
	Batches         uint64        // round trips that carried the settlements requests needed at once (fetches, takes, exact decisions): see Batched
	Batched         uint64        // settlements those round trips carried: Batched/Batches is how many went together
	Queued          uint64        // settlements of those round trips that waited for a batch on its way to come back before theirs could leave (the node's window full): see QueueWait
	Hurried         uint64        // settlements a round sent before their turn, in its next call, as requests waited for their keys (see AwaitRound)
	Pressured       uint64        // calls that timed out while Redis answered others: a busy Redis, not counted as failures by the breakers
	Losses          uint64        // heartbeats that found Redis had lost this instance's writes (a failover to a replica that lagged, a restart)
	Tails           uint64        // outages after which another server answered with this instance's last beat kept, a replica promoted in a dead master's place: what this instance's settlements took in their last moments before it was charged again (see docs/failure.md)
	Recharged       uint64        // micro-tokens charged again after those losses and outages: what this instance's settlements had taken since
	Forgiven        uint64        // micro-tokens of consumption this instance's settlements did not charge, their buckets owing Config.MaxDebt's bound already: what the fleet may have admitted beyond B + R*T
	Credited        uint64        // micro-tokens of an outage's admissions this instance's settlements did not charge, claimed back out of the refill their buckets lost at the burst meanwhile (Config.ShareCredit, see docs/failure.md)

	// LocalAllowed counts the decisions allowed from keys' allowances:
	// their spends (local.Allowance.SpendLeft), counted in each key's
	// allowance and added up when the reconciler next visits the key, at
	// its next round or when it leaves the store. So it lags by up to one
	// SyncInterval.
	LocalAllowed uint64
	// Nodes is the state now of each breaker: the one of a single Redis
	// (Addr ""), and on a Redis Cluster one per node the reconciler has
	// called, sorted by address.
	Nodes []NodeState
	// BreakerTransitions counts the breakers' state changes by
	// [from][to] state; their sum is Transitions.
	BreakerTransitions [nStates][nStates]uint64
	// Refusals counts the calls that failed because a node refused them
	// as it refuses every call alike, by cause (global.CauseOf):
	// Refusals[global.Full] those refused by a Redis whose memory reached
	// maxmemory (noeviction), Refusals[global.ReadOnly] by a read-only
	// replica, Refusals[global.Refused] by a node that refuses the client.
	// Each counts as a failure for the node's breaker; Refusals[NoCause]
	// stays 0.
	Refusals [global.Causes]uint64
	// Cause is why the first node of Nodes whose breaker is not closed,
	// and that refused a call since one last succeeded (NodeState.Cause),
	// refuses every call: global.Full for a full Redis, global.ReadOnly
	// for a read-only replica. NoCause while every breaker is closed, or
	// while those that are not failed otherwise (no reply, no connection).
	Cause global.Cause
	// Live is the number of live instances the last heartbeat counted
	// through Redis, whether or not Config.Instances overrides it for the
	// fallback shares; 0 before the first heartbeat answered.
	Live int64
	// Unsettled is the consumption, in micro-tokens, spent here that the
	// last round could not charge to Redis and keeps for a later one: an
	// outage's consumption accumulates here, and is charged when Redis is
	// back. (Early top-up rounds do not change it.) After Close it is what
	// Close could not charge: that is lost.
	Unsettled int64
	// RoundTrip is the distribution of the durations of the settlement
	// calls of the rounds that Redis answered.
	RoundTrip Histogram
	// QueueWait is the distribution of how long the Queued settlements
	// waited for their batch to leave: what a request's answer took beyond
	// its own round trip because others were on their way (see
	// NodeState.Window).
	QueueWait Histogram
	// BatchTrip is the distribution of the round trips of the batches
	// Redis answered (Batches counts those that failed too): over the
	// Limiter's life, where NodeState.BatchRTT is a node's smoothed one
	// now.
	BatchTrip Histogram
	// RTT and Skew are measured on the last round trip that carried Redis
	// TIME (a settlement call of a round, or a heartbeat): RTT is its
	// duration, Skew is Redis TIME minus this host's time at the middle of
	// the round trip, positive when Redis's clock is ahead (to within
	// RTT/2). ClockSamples counts the round trips they were measured on; 0
	// means they are not known yet.
	RTT, Skew    time.Duration
	ClockSamples uint64
}

// Stats returns a snapshot of r's statistics.
func (r *Reconciler) Stats() Stats {
	r.mu.Lock()
	orphans := len(r.orphans)
	inFlight := r.stats.inFlight.Load() // set with the orphans taken, under mu
	r.mu.Unlock()
	s := Stats{
		Rounds:          r.stats.rounds.Load(),
		RoundErrors:     r.stats.roundErrors.Load(),
		KeysSettled:     r.stats.keysSettled.Load(),
		KeyErrors:       r.stats.keyErrors.Load(),
		Fetches:         r.stats.fetches.Load(),
		FetchErrors:     r.stats.fetchErrors.Load(),
		FetchTimeouts:   r.stats.fetchTimeouts.Load(),
		HeartbeatErrors: r.stats.heartbeatErrors.Load(),
		Transitions:     r.stats.transitions.Load(),
		Evicted:         r.stats.evicted.Load(),
		EvictedPending:  r.stats.evictedPending.Load(),
		Uncertain:       r.stats.uncertain.Load(),
		Resent:          r.stats.resent.Load(),
		Duplicates:      r.stats.duplicates.Load(),
		Unapplied:       r.stats.unapplied.Load(),
		DoubtsExpired:   r.stats.doubtsExpired.Load(),
		Resets:          r.stats.resets.Load(),
		LastRound:       time.Duration(r.stats.lastRound.Load()),
		Instances:       r.live.Load(),
		Keys:            r.keys.Len(),
		Orphans:         orphans,
		Journal:         r.journal.len(),
		InFlight:        int(inFlight),
		Batches:         r.stats.batches.Load(),
		Batched:         r.stats.batched.Load(),
		Queued:          r.stats.queued.Load(),
		Hurried:         r.stats.hurried.Load(),
		Losses:          r.stats.losses.Load(),
		Tails:           r.stats.tails.Load(),
		Recharged:       r.stats.recharged.Load(),
		Forgiven:        r.stats.forgiven.Load(),
		Credited:        r.stats.credited.Load(),
		LocalAllowed:    r.stats.localAllowed.Load(),
		Live:            r.stats.heard.Load(),
		Unsettled:       r.stats.unsettled.Load(),
		RoundTrip:       r.stats.roundTrip.snapshot(),
		QueueWait:       r.stats.queueWait.snapshot(),
		BatchTrip:       r.stats.batchTrip.snapshot(),
		RTT:             time.Duration(r.stats.rtt.Load()),
		Skew:            time.Duration(r.stats.skew.Load()),
		ClockSamples:    r.stats.clockSamples.Load(),
	}
	s.Nodes = r.nodeStates()
	s.Breaker = worst(s.Nodes)
	for _, n := range s.Nodes {
		if n.Breaker != breaker.Closed && n.Cause != global.NoCause {
			s.Cause = n.Cause
			break
		}
	}
	for c := range s.Refusals {
		s.Refusals[c] = r.stats.refusals[c].Load()
	}
	s.Pressured = r.def.br.Counts().Pressured
	for _, n := range *r.nodes.Load() {
		s.Pressured += n.br.Counts().Pressured
	}
	for from := range nStates {
		for to := range nStates {
			s.BreakerTransitions[from][to] = r.stats.byTransition[from][to].Load()
		}
	}
	return s
}

// countTransition counts a breaker state change.
func (c *counters) countTransition(from, to breaker.State) {
	c.transitions.Add(1)
	if from >= 0 && from < nStates && to >= 0 && to < nStates {
		c.byTransition[from][to].Add(1)
	}
}

// clockSample records a round trip to Redis that began at start and ended at
// end (local wall clock readings with their monotonic parts) and carried
// Redis TIME now.
func (c *counters) clockSample(start, end, now time.Time) {
	if now.IsZero() {
		return
	}
	rtt := end.Sub(start)
	mid := start.Add(rtt / 2).Round(0) // wall clock: Redis TIME has no monotonic part
	c.rtt.Store(int64(rtt))
	c.skew.Store(int64(now.Sub(mid)))
	c.clockSamples.Add(1)
}

// bounds are the upper bounds of the buckets of a Histogram.
var bounds = [...]time.Duration{
	250 * time.Microsecond,
	500 * time.Microsecond,
	time.Millisecond,
	2500 * time.Microsecond,
	5 * time.Millisecond,
	10 * time.Millisecond,
	25 * time.Millisecond,
	50 * time.Millisecond,
	100 * time.Millisecond,
	250 * time.Millisecond,
	500 * time.Millisecond,
	time.Second,
}

// Histogram is a distribution of durations in buckets whose upper bounds
// are those of Bounds.
type Histogram struct {
	// Counts[i] is the number of durations at most Bounds()[i] and above
	// the bound before it; the last one counts those above every bound.
	Counts [len(bounds) + 1]uint64
	// Count is the number of durations, Sum their total and Max the
	// longest.
	Count    uint64
	Sum, Max time.Duration
}

// Bounds returns the upper bounds of h's buckets, ascending: 250µs to 1s.
func (h *Histogram) Bounds() []time.Duration { return append([]time.Duration(nil), bounds[:]...) }

// histogram is a Histogram updated atomically: observations and snapshots
// may come from any goroutine.
type histogram struct {
	counts [len(bounds) + 1]atomic.Uint64
	count  atomic.Uint64
	sum    atomic.Int64 // ns
	max    atomic.Int64 // ns
}

// observe adds d to h.
func (h *histogram) observe(d time.Duration) {
	i := 0
	for i < len(bounds) && d > bounds[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sum.Add(int64(d))
	for {
		m := h.max.Load()
		if int64(d) <= m || h.max.CompareAndSwap(m, int64(d)) {
			break
		}
	}
	h.count.Add(1) // last: a snapshot never counts more than its buckets hold
}

// snapshot returns h's figures. Observations made while it runs may be
// partly included.
func (h *histogram) snapshot() Histogram {
	s := Histogram{Count: h.count.Load()}
	for i := range h.counts {
		s.Counts[i] = h.counts[i].Load()
	}
	s.Sum = time.Duration(h.sum.Load())
	s.Max = time.Duration(h.max.Load())
	return s
}
