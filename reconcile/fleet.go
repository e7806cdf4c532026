package reconcile

import (
	"context"
	"time"
)

// heartbeat tells Redis this instance is alive and learns how many are, and
// returns when to beat next: after HeartbeatInterval, or after SyncInterval
// while the count is moving (the first beats of this instance, when
// instances of a fleet start together, and any beat whose count changed),
// so that a fleet that grows is counted within a round or two rather than a
// heartbeat interval later: until then every instance shares limits out as
// if the fleet were smaller (optimistic budgets, the fallback's shares).
// Beats come a SyncInterval apart for a while after an outage too, while
// the journal is pinned: a second loss of writes is likeliest then.
func (r *Reconciler) heartbeat(ctx context.Context) (next time.Duration) {
	defer r.countedOnce.Do(func() { close(r.counted) })
	start := r.clock.Now()
	live, now, err := r.beat(ctx)
	r.witnessNodes(ctx, err == nil)
	next = r.cfg.HeartbeatInterval
	if r.beats.Add(1) < youngBeats {
		next = min(next, r.cfg.SyncInterval)
	}
	if err != nil {
		return r.cfg.HeartbeatInterval // a count to make, not a call to retry
	}
	r.journal.trim(now.UnixMicro(), r.journalSpan())
	if r.journal.pinned(now.UnixMicro()) {
		// An outage ended lately: a Redis that failed over may fail over
		// again (Sentinel promoting a second replica in the first one's
		// place, which lagged behind it), and lose what was written to
		// the first. A loss is charged again from the last beat the new
		// master holds (see witnessedOn), so what was written between
		// that beat and the loss, kept by the Redis that answers, is
		// charged twice: beats a round apart keep that to a round's
		// settlements, where it would be a heartbeat interval's.
		next = min(next, r.cfg.SyncInterval)
	}
	end := r.clock.Now()
	r.stats.clockSample(r.clock.Time(start), r.clock.Time(end), now)
	if old := r.stats.heard.Swap(int64(live)); int64(live) > old {
		next = min(next, r.cfg.SyncInterval) // the fleet is growing: count it again soon
	}
	if r.cfg.Instances != 0 {
		return next
	}
	// A count that falls is believed once heartbeats have said so for a
	// heartbeat interval. A Redis that lost its data (a restart, FLUSHALL)
	// counts only the instances that have beaten since, and smaller counts
	// mean larger shares: optimistic budgets and the fallback's shares
	// would admit too much until every instance has beaten again, which
	// takes one interval.
	n := int64(max(live, 1))
	switch {
	case n >= r.live.Load():
		r.fewerSince = 0
	case r.fewerSince == 0:
		r.fewerSince = end
		return next
	case end-r.fewerSince < r.cfg.HeartbeatInterval:
		return next
	}
	r.fewerSince = 0
	r.live.Store(n)
	return next
}

// beat makes one heartbeat through the breaker of the node that holds the
// fleet count, and returns the live count and Redis's clock. A failure is
// counted.
func (r *Reconciler) beat(ctx context.Context) (live int, now time.Time, err error) {
	var was, reset time.Time
	err = r.DoFleet(ctx, func(ctx context.Context) error {
		var err error
		switch st := r.st.(type) {
		case resets:
			live, now, was, reset, err = st.HeartbeatReset(ctx, r.cfg.InstanceID, 3*r.cfg.HeartbeatInterval)
		case witness:
			live, now, was, err = st.HeartbeatWas(ctx, r.cfg.InstanceID, 3*r.cfg.HeartbeatInterval)
		default:
			live, now, err = r.st.Heartbeat(ctx, r.cfg.InstanceID, 3*r.cfg.HeartbeatInterval)
		}
		return err
	})
	if err != nil {
		r.stats.heartbeatErrors.Add(1)
		return live, now, err
	}
	if _, ok := r.st.(witness); ok {
		r.witnessed(now, was, r.server(ctx))
	}
	if !reset.IsZero() {
		r.NoteReset(reset)
	}
	return live, now, nil
}

// resets is implemented by a Store whose heartbeat also tells the fleet's
// latest reset of a bucket (*global.Limiter).
type resets interface {
	HeartbeatReset(ctx context.Context, id string, ttl time.Duration) (live int, now, was, reset time.Time, err error)
}

// NoteReset records that a bucket was reset at at (Redis time), as a
// heartbeat tells or as this instance made it: a reset later than the last
// one noted makes the views of buckets seen until now untrusted (see
// ResetSeen).
func (r *Reconciler) NoteReset(at time.Time) {
	ms := at.UnixMilli()
	for {
		old := r.lastReset.Load()
		if ms <= old {
			return
		}
		if r.lastReset.CompareAndSwap(old, ms) {
			r.resetSeen.Store(int64(r.clock.Now()))
			return
		}
	}
}

// ResetSeen returns when this instance learned of the fleet's latest reset
// of a bucket, on its clock (0 if none): a view of a bucket seen before then
// may be of a bucket reset since, and denies nothing here (the request asks
// Redis instead). Which bucket is not told: every view from before is
// untrusted once, a round trip more for keys denied here, as resets are
// rare.
func (r *Reconciler) ResetSeen() time.Duration { return time.Duration(r.resetSeen.Load()) }

// youngBeats is how many of an instance's first heartbeats come a
// SyncInterval apart rather than a HeartbeatInterval: instances that start
// together count each other within a few rounds.
const youngBeats = 3

// recount asks Redis for the fleet count now, in a heartbeat shared with
// the concurrent recounts, and believes it at once if it grew: a young
// instance recounts before it shares a key's first budget out, since the
// instances that start with it may have joined after its own first beat.
// Falling counts are left to the heartbeats (see heartbeat).
func (r *Reconciler) recount() {
	r.beatFlight.Do("", func() (any, error) {
		live, _, err := r.beat(context.Background())
		if err != nil {
			return nil, nil
		}
		r.stats.heard.Store(int64(live))
		if r.cfg.Instances == 0 {
			for n := int64(live); ; {
				old := r.live.Load()
				if n <= old || r.live.CompareAndSwap(old, n) {
					break
				}
			}
		}
		return nil, nil
	})
}

// young reports whether this instance is still among its first heartbeats
// (youngBeats): the fleet it counted may not have finished starting.
func (r *Reconciler) young() bool { return r.beats.Load() < youngBeats }

// awaitCount waits until the first heartbeat has counted the fleet (or
// failed), at most the deadline of a heartbeat: a budget shared out before
// it would be shared as if this instance were alone.
func (r *Reconciler) awaitCount() {
	select {
	case <-r.counted:
		return
	default:
	}
	t := time.NewTimer(r.def.br.Timeout(1))
	defer t.Stop()
	select {
	case <-r.counted:
	case <-t.C:
	}
}
