package reconcile

import (
	"sync/atomic"
	"time"

	"github.com/hybridlimit/hybrid/breaker"
)

// counters are the Reconciler's statistics, updated atomically.
type counters struct {
	rounds, roundErrors    atomic.Uint64
	keysSettled, keyErrors atomic.Uint64
	fetches, fetchErrors   atomic.Uint64
	fetchTimeouts          atomic.Uint64
	heartbeatErrors        atomic.Uint64
	transitions, evicted   atomic.Uint64
	uncertain              atomic.Uint64
	lastRound              atomic.Int64 // ns
}

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
	Uncertain       uint64        // failed settlements that may have been applied: their give-back was not put back
	LastRound       time.Duration // the last round trip's duration
	Breaker         breaker.State // the breaker's state now
	Instances       int64         // the fleet size used for fallback shares
	Keys            int           // keys tracked
	Orphans         int           // keys that left the store with dues still to settle
}

// Stats returns a snapshot of r's statistics.
func (r *Reconciler) Stats() Stats {
	r.mu.Lock()
	orphans := len(r.orphans)
	r.mu.Unlock()
	return Stats{
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
		Uncertain:       r.stats.uncertain.Load(),
		LastRound:       time.Duration(r.stats.lastRound.Load()),
		Breaker:         r.br.State(),
		Instances:       r.live.Load(),
		Keys:            r.keys.Len(),
		Orphans:         orphans,
	}
}
