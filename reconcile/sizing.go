package reconcile

import (
	"time"

	"github.com/hybridlimit/hybrid/internal/limit"
	"github.com/hybridlimit/hybrid/local"
)

// resize adapts the allowance e keeps in lease mode to its use: double it if
// it was starved since the last round, halve it if less than a quarter of it
// was used (the gap between the two keeps a steady key from swinging); within [one token, min(LocalCapacity, burst)]. It returns it in
// micro-tokens.
func (r *Reconciler) resize(e *Entry, sp *Spec, bal int64, starved bool) int64 {
	t := r.target(e, sp)
	if starved {
		t *= 2
	} else if bal > t/4*3 {
		t /= 2
	}
	t = min(max(t-t%local.Micro, local.Micro), r.maxLease(sp)) // whole tokens
	e.X.target.Store(uint32(t / local.Micro))
	return t
}

// target returns the allowance e keeps in lease mode, in micro-tokens: its
// last size, or for a key never sized a quarter of its fair share of the
// burst.
func (r *Reconciler) target(e *Entry, sp *Spec) int64 {
	if t := int64(e.X.target.Load()) * local.Micro; t > 0 {
		return t
	}
	t := sp.Limit.Burst / (4 * r.live.Load())
	return min(max(t-t%local.Micro, local.Micro), r.maxLease(sp))
}

// maxLease is the most allowance a key holds, in whole tokens.
func (r *Reconciler) maxLease(sp *Spec) int64 { return min(r.lc, sp.Limit.Burst) }

// Budget returns the optimistic budget of a key that has old micro-tokens of
// budget left, whose global bucket held tokens micro-tokens, elapsed after
// its previous settlement: its share of what the bucket refilled meanwhile
// added to what it has left, or its share of what the bucket holds if that
// is more, within Cap. Fractions of a token carry over, so that a fleet
// larger than the burst still spends the whole refill.
func (r *Reconciler) Budget(sp *Spec, tokens, old int64, elapsed time.Duration) int64 {
	n := r.live.Load()
	refill, _ := limit.Refill(elapsed, sp.Limit.Rate, 0)
	return min(max(old+refill/n, max(tokens, 0)/n), r.Cap(sp))
}

// Cap is the most optimistic budget one instance holds for a key: its share
// of the burst and of one interval's refill, at least one token, within
// LocalCapacity and the burst.
func (r *Reconciler) Cap(sp *Spec) int64 {
	n := r.live.Load()
	refill, _ := limit.Refill(r.cfg.SyncInterval, sp.Limit.Rate, 0)
	return min(r.lc, sp.Limit.Burst, max((sp.Limit.Burst+refill)/n, local.Micro))
}
