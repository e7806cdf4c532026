package reconcile

import (
	"time"

	"github.com/hybridlimit/hybrid/internal/limit"
	"github.com/hybridlimit/hybrid/local"
)

// A lease key that a fleet crowded for it contends for (see Ahead) takes
// its turns ahead. A fetch charges the bucket one turn
// (Settlement.Consumed, with no grant), which may sink it into debt, and
// the turn is spent here once the bucket's refill has paid that debt, not
// before. The bucket's debt is so a queue of
// the fleet's turns, each due after the one before it: every fetch brings
// a whole turn, whenever it comes. Fetched when the bucket is due to hold
// it instead (see Due), a key's fetches come at moments the instances draw
// apart, and each finds what the others left of the refill since the one
// before it: often less than a turn, and the rest is a call more. A fleet
// of N instances taking turns of S tokens costs the key R/S calls a
// second, whatever N.
//
// Exact all the same (docs/accuracy.md, "Turns taken ahead"): a turn is
// spent no sooner than the refill that pays for it, counted from the
// reply's arrival, which comes after Redis's time of the charge; the fleet
// spends at most what the bucket would have granted by then. A turn not
// spent goes back as a lease does: when the key leaves the store (Close
// included), when its limit changes, or with the lease of a key left
// idle. A reply that is lost loses its turn: the fetch is not numbered,
// and errs towards denying.

// Ahead reports whether e's lease key takes its next turn ahead: others
// take the key too (see Takers), nothing the fallback admitted waits to be
// charged (a fetch of the usual kind charges it first), and the key's last
// reply left its bucket holding less than a turn (aheadTurn) for every
// instance of the fleet, so that the fleet's fetches contend for its
// refill. A turn taken ahead of a bucket that holds it is due at once: a
// grant.
//
// An instance alone on the key takes its turns ahead too where the bucket
// refills its whole burst within aloneAhead (see brief): fetched when its
// tokens are due, its one fetch at a time finds the bucket full and
// refilling nothing whenever the reply came back late, as a loaded host's
// scheduling makes it, and every such lateness loses its refill (200/s,
// burst 1, under -race on 2 loaded cores: 57% to 88% of B + R*T, where
// exact mode's calls lost 3% to 5%). Taken ahead, the bucket's refill goes
// to a turn already queued.
//
// Not a key whose takers, as this instance counts them, would take turns
// more than aheadGuard times larger than the fleet's count makes them: a
// key that a small part of a large fleet takes, fetched in turns sized by
// its takers (see Due), rather than in turns of a token or two.
func (r *Reconciler) Ahead(e *Entry, sp *Spec) bool {
	n := r.Takers(e)
	if e.Pending.Load() > 0 || n == 1 && !r.brief(sp) || n > 1 && !r.crowded(sp) {
		return false
	}
	g := r.aheadTurn(sp)
	if r.turn(sp, n) > aheadGuard*g {
		return false
	}
	v := e.View()
	return v.Seen != 0 && v.Tokens < r.live.Load()*g
}

// crowded reports whether the fleet is so large, for a key of sp, that
// the turns it takes ahead are its share of the burst (see aheadTurn), not
// the refill of 2·turnTime: where the key's turns are that refill, the
// fleet makes about one call per turnTime for it already, its size
// whatever (see Due), and where they are whole tokens of a slow key (a
// token is more than that refill), a queue of the fleet's turns would hold
// each instance's for as many seconds as the fleet has instances.
func (r *Reconciler) crowded(sp *Spec) bool {
	return sp.Limit.Burst/aheadShare[1]*aheadShare[0]/r.live.Load() < r.Refill(sp, 2*r.turnTime())
}

// brief reports whether a bucket of sp refills its whole burst within
// aloneAhead.
func (r *Reconciler) brief(sp *Spec) bool {
	return sp.Limit.Burst < r.Refill(sp, r.aloneAhead())
}

// aloneAhead is the longest a bucket may take to refill its burst for an
// instance alone on its key to take its turns ahead (see Ahead): four
// turnTimes, the delays a loaded host adds to a reply.
func (r *Reconciler) aloneAhead() time.Duration { return 4 * r.turnTime() }

// aheadGuard bounds how much smaller than its takers' turns a key's turns
// taken ahead may be (see Ahead). A count of takers is noisy in a large
// fleet, whose instances reply seldom: 4,096 instances sharing a key count
// from a few hundred to all of them, whose turns are up to ten times the
// fleet's; a key that ten instances of a thousand take, forty times.
const aheadGuard = 16

// aheadTurn returns the turn a lease key of sp takes ahead, in
// micro-tokens (whole tokens, one at least): the refill of 2·turnTime (the
// most a lease of a shared key holds, LeaseCap), or for a fleet so large
// that its turns would then hold more than aheadShare of the burst (see
// crowded), the instance's share of that much of it.
//
// The fleet's live count sizes it, not the key's takers: turns of one size
// wait in the bucket's queue for as long as each other, while an instance
// that took larger ones would take more than its share, count fewer takers
// and take larger ones still.
//
// Its size is a trade. A key saturated by N instances costs R/S calls a
// second for turns of S (N·R/(aheadShare·B), 1.25 times the floor, for a
// large fleet), and the turns held when a window ends are what the fleet
// does not admit in it: about N·S/4 at twice the key's rate, a fifth of
// the burst (docs/tuning.md, "Fleet size").
func (r *Reconciler) aheadTurn(sp *Spec) int64 {
	g := min(r.Refill(sp, 2*r.turnTime()), sp.Limit.Burst/aheadShare[1]*aheadShare[0]/r.live.Load())
	return max((g+local.Micro-1)/local.Micro*local.Micro, local.Micro)
}

// aheadShare is the part of the burst that a large fleet's turns taken
// ahead hold at most, a fraction: four fifths.
var aheadShare = [2]int64{4, 5}

// tookAhead records the turn of n micro-tokens that a fetch of e's key (of
// sp) took ahead, whose reply, come at now, left the bucket holding tokens:
// due at once if the bucket held it, else once the refill has paid the
// debt (a microsecond more: Redis refills by whole microseconds).
func (r *Reconciler) tookAhead(e *Entry, sp *Spec, n, tokens int64, now time.Duration) {
	if n <= 0 {
		return
	}
	if tokens >= 0 {
		if !e.Allowance.Add(n) {
			r.addOrphan(e.Key(), sp, 0, n) // the entry left meanwhile
		}
		return
	}
	due := now + limit.DurationFor(-tokens, sp.Limit.Rate) + time.Microsecond
	if !r.sides.addReserved(e, n, due) {
		r.addOrphan(e.Key(), sp, 0, n)
	}
}

// Reserved moves e's turn taken ahead into its allowance once it is due
// at now. It returns how long until it is due (0 once moved) and whether
// e has one.
func (r *Reconciler) Reserved(e *Entry, now time.Duration) (wait time.Duration, ok bool) {
	return r.sides.claimReserved(e, now)
}

// TakeReserved returns e's turn taken ahead, due or not, and empties it:
// for a lease given back (a change of limit).
func (r *Reconciler) TakeReserved(e *Entry) int64 { return r.sides.takeReserved(e) }
