package reconcile

import "time"

// DoubtBuffers returns the capacity of r's list of settlements in doubt and
// the most keys its map of them has held since it was made. Call it between
// rounds.
func DoubtBuffers(r *Reconciler) (capacity, peak int) {
	return cap(r.doubts), r.inDoubtPeak
}

// MaxBatch is maxBatch.
const MaxBatch = maxBatch

// YoungBeats is youngBeats.
const YoungBeats = youngBeats

// SettleDue is settleDue.
func SettleDue(r *Reconciler, e *Entry, sp *Spec, now time.Duration) bool {
	return r.settleDue(e, sp, now)
}

// TurnTime is turnTime at the default pace.
const TurnTime = 2 * DefaultRefillPace
