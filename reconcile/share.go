package reconcile

import (
	"math"
	"time"

	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/local"
)

// A lease key's Redis work follows its traffic, not the fleet: each
// instance holds at most its share of half the burst, and asks for a
// saturated key's tokens no sooner than its share of the refill brings
// them. Its share is what it takes of the key's bucket against what the
// whole fleet takes, learned from its own replies (Takers): N instances
// that each take an even part of a key count N, whatever the live count;
// a few of them on a key of their own count themselves alone.
//
// With S the lease one fetch brings and n instances taking a saturated key
// in turn, each fetches every S*n/R, and the key costs Redis R/S calls a
// second, whatever n: at S = B/(2n), twice the floor n*R/B
// (docs/tuning.md, "Fleet size").

// The upper half of State.flags holds, for a lease key, how many instances
// take the key's tokens as this instance counts them (0: not counted yet),
// at most maxTakers; for an optimistic key, the time of the latest reply
// that found another instance's write (markForeign).
const maxTakers = 1<<16 - 1

// takers returns the count that setTakers stored, 0 if none.
func (s *State) takers() int64 { return int64(s.flags.Load() >> foreignShift) }

// setTakers stores n, within [1, maxTakers].
func (s *State) setTakers(n int64) {
	t := uint32(min(max(n, 1), maxTakers))
	for {
		old := s.flags.Load()
		if old>>foreignShift == t || s.flags.CompareAndSwap(old, old&(1<<foreignShift-1)|t<<foreignShift) {
			return
		}
	}
}

// Takers returns how many instances take e's lease key's tokens, as this
// instance counts them: 1 while its replies show that nobody else wrote the
// bucket (see Askers), else what they showed of the others' takes against
// its own (see countTakers), within [1, live count]; the live count until
// a reply has shown it.
func (r *Reconciler) Takers(e *Entry) int64 {
	if e.X.flags.Load()&flagAlone != 0 {
		return 1
	}
	live := r.live.Load()
	if n := e.X.takers(); n > 0 && n < live {
		return n
	}
	return live
}

// countTakers learns from the reply rep to the lease settlement s, which
// asked for tokens or took a turn ahead, how many instances take the key:
// the tokens the others
// took since this instance's previous reply (others, micro-tokens), and
// what this one took, over what this one took. A call granted nothing
// counts twice as many as before. The count moves a quarter of the way to
// each new reading, so that one reply whose calls crossed does not swing
// it.
func (r *Reconciler) countTakers(e *Entry, s *global.Settlement, rep *global.Reply, others int64) {
	g := rep.Granted
	if s.Want == 0 {
		if s.Seq != 0 || s.Consumed == 0 {
			return // took nothing, asked nothing: says nothing of its share
		}
		g = s.Consumed - rep.Forgiven // a turn taken ahead: unnumbered, charged, granted nothing (see Ahead)
	}
	old := e.X.takers()
	var n int64
	if g > 0 {
		n = (max(others, 0) + g + g/2) / g
	} else {
		n = 2 * max(old, 1)
	}
	if old > 0 {
		n = (3*old + n + 2) / 4
	}
	e.X.setTakers(min(n, r.live.Load()))
}

// LeaseCap returns the most allowance e's lease key holds here, in
// micro-tokens (whole tokens): LocalCapacity and the burst for an instance
// alone on the key (see Takers), else two turns' worth (see turn), so that
// a fetch in its turn takes whatever the bucket refilled since the turn
// before it, someone else's or not.
func (r *Reconciler) LeaseCap(e *Entry, sp *Spec) int64 {
	c := r.maxLease(sp)
	if n := r.Takers(e); n > 1 {
		c = min(c, 2*r.turn(sp, n))
	}
	return c
}

// turn returns what one instance's turn at a lease key that n instances
// take brings, in micro-tokens (whole tokens, one at least): the refill of
// turnTime, so that the fleet's fetches of the key come about once per
// turnTime whatever its size, or for a fleet so large that its leases
// would then hold more than half the burst, the instance's share of half
// the burst (rounded up), so that the fleet's leases hold no more: twice
// the floor of n·R/B calls a second.
func (r *Reconciler) turn(sp *Spec, n int64) int64 {
	g := min(r.Refill(sp, r.turnTime()), sp.Limit.Burst/(2*n))
	return max((g+local.Micro-1)/local.Micro*local.Micro, local.Micro)
}

// turnTime is how often, at most, the fleet's turns at a lease key come
// (see turn): twice the refill pace (Config.RefillPace), about 500 calls a
// second for the key at the default pace, wherever its fleet holds less
// than half its burst that way.
func (r *Reconciler) turnTime() time.Duration { return 2 * r.cfg.RefillPace }

// Due returns what e's lease bucket must hold, as its view v counts it and
// refilled since, before a request that lacks need micro-tokens asks Redis
// for them. For an instance alone on the key: need, or for a key whose
// lease is larger as much of it as the bucket refills in fetchPace (see
// Pace). For a key that n instances take: a turn (see turn), at least
// need, out of this instance's share of the refill, 1/n of it, beyond what
// the view shows the bucket holding. A debt the view shows is repaid
// first, at the full rate.
func (r *Reconciler) Due(e *Entry, sp *Spec, v local.View, need int64) int64 {
	n := r.Takers(e)
	if n == 1 {
		return max(need, r.Pace(sp, r.target(e, sp), 1))
	}
	due := max(need, min(r.target(e, sp), r.turn(sp, n)))
	if have := max(v.Tokens, 0); due > have {
		extra := due - have
		if extra > (math.MaxInt64/4)/n/1024 {
			return math.MaxInt64 / 2
		}
		// Turns spread out: each is from 1/2 to 3/2 of the share's,
		// drawn from the view's time, so that instances answered at one
		// moment do not all come back at one moment. (Longer turns, 3/4
		// to 7/4, cost the fleet fewer calls, but leave tokens in the
		// bucket between them, which views taken at different moments
		// count each: the fallback's shares then start from more than
		// the bucket held.)
		f := uint64(v.Seen) * 0x9E3779B97F4A7C15 >> 54 // [0, 1024)
		due += extra * (n - 1) * int64(512+f) / 1024
	}
	return due
}

// Pace returns what a saturated key of sp, whose allowance here holds at
// most size micro-tokens, waits for the bucket to refill before it asks
// Redis again: as much of size as the bucket refills in fetchPace for each
// of the n instances that take it (N instances that all ask take turns),
// and at most half the burst, so that the bucket is not full (refilling
// nothing) while the request is on its way. A saturated key so costs the
// fleet about one round trip per fetchPace, unless one allowance is
// refilled faster.
func (r *Reconciler) Pace(sp *Spec, size, n int64) int64 {
	return min(size, r.Refill(sp, r.fetchPace())*n, sp.Limit.Burst/2)
}

// fetchPace paces the round trips of a saturated key (see Pace): about one
// per fetchPace for the fleet, unless one allowance is refilled faster. It
// is Config.RefillPace, 1ms by default.
func (r *Reconciler) fetchPace() time.Duration { return r.cfg.RefillPace }

// Fresh returns how long e's view answers for the bucket, so that a
// request that its view holds back is denied here rather than sent to
// Redis: two intervals, or for a key that others take too (see Takers, and
// Askers for an optimistic key), the time the bucket takes to refill, since
// its turns may be that far apart (see Due).
func (r *Reconciler) Fresh(e *Entry, sp *Spec) time.Duration {
	f := 2 * r.cfg.SyncInterval
	n := r.Askers(e)
	if sp.Mode == Lease {
		n = r.Takers(e)
	}
	if n > 1 {
		f = max(f, sp.Duration(sp.Limit.Burst))
	}
	return f
}

// ready reports whether e's lease key, holding bal micro-tokens, may ask
// Redis for more at now without jumping its turn (see Due): the view, as
// old as Fresh allows, shows that the bucket refilled enough for it. A key
// with no such view is ready.
func (r *Reconciler) ready(e *Entry, sp *Spec, bal int64, now time.Duration) bool {
	v := e.View()
	age := v.Age(now)
	if v.Seen == 0 || age > r.Fresh(e, sp) {
		return true
	}
	due := r.Due(e, sp, v, max(r.target(e, sp)-bal, local.Micro))
	return v.Tokens+r.Refill(sp, age) >= due
}

// plenty reports whether e's bucket, at its last view, held a lease for
// every instance that takes the key (see Takers): enough that topping this
// one up before it runs dry takes nothing another instance needs. A key
// the fleet contends for is fetched when it runs dry instead, in its turn,
// so that the fleet's leases hold no more of the bucket than they must.
func (r *Reconciler) plenty(e *Entry) bool {
	v := e.View()
	return v.Tokens > 0 && v.Tokens >= r.Takers(e)*r.target(e, e.X.Spec())
}
