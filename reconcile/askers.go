package reconcile

import (
	"math"
	"time"

	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/internal/limit"
	"github.com/hybridlimit/hybrid/local"
)

// Askers returns how many instances of the fleet ask Redis for e's key, as
// far as this instance can tell: 1 while its replies show that nobody else
// wrote the key's bucket between two of its own calls, else the fleet's
// live count. It paces a saturated key's fetches (N instances that all ask
// take turns), so that one instance alone on a key is not paced as if the
// whole fleet were asking: its denials' RetryAfter is when the bucket holds
// the tokens, within a millisecond.
func (r *Reconciler) Askers(e *Entry) int64 {
	if e.X.flags.Load()&flagAlone != 0 {
		return 1
	}
	return r.Instances()
}

// Observe is observe for a reply that the owner applies itself (a
// composite decision's): call it before setting the entry's view from rep.
func (r *Reconciler) Observe(e *Entry, s *global.Settlement, rep *global.Reply) {
	r.observe(e, s, rep)
}

// aloneSlack is how far, in micro-tokens, what a call finds in a bucket may
// be from what this instance's previous call left there, refilled since,
// and still be taken for nobody else's doing: the refill of a write in
// between (another instance's call that took and gave nothing) rounds down
// once more.
const aloneSlack = 2

// observe learns from rep, the reply to the settlement s of e's key, whether
// another instance wrote the bucket since this instance's previous reply for
// the key (see Askers): what the call found there, refilled (its reply less
// what the call itself did), is what the previous reply left, refilled to
// the call's Redis time, unless someone else took or gave tokens in between.
// Replies of this instance that cross on the way (a round's and a fetch's)
// may read once as another's doing: a key is taken for shared after two
// such replies in a row, and a wrong guess only paces it as for the fleet.
// Whoever applies a reply calls observe before it sets the entry's view
// from it (SetView): what the previous reply left is that view.
func (r *Reconciler) observe(e *Entry, s *global.Settlement, rep *global.Reply) {
	x := &e.X
	now := rep.Now.UnixMicro()
	prev := x.lastNow.Load()
	if rep.Duplicate {
		// It changed nothing, and says nothing of the others; what it
		// found becomes the view all the same, of its time.
		if now > prev {
			x.lastNow.Store(now)
		}
		return
	}
	if now < prev {
		return // an older call than one whose reply is here already
	}
	alone := false
	found := rep.Tokens + rep.Granted + s.Consumed - s.Returned
	switch {
	case rep.Reset:
	case prev == 0:
		// A first reply has no previous one to compare with: a bucket
		// found full was written by nobody for as long as it took to
		// refill, and the key is taken for this instance's alone until a
		// reply says otherwise. (Wrong, it only paces the key as for one
		// for two replies, and grants an optimistic key what the others
		// may spend of budgets they hold: a debt within the documented
		// bound; see Others.)
		alone = found >= s.Limit.Burst-aloneSlack
	default:
		add, _ := limit.Refill(time.Duration(now-prev)*time.Microsecond, s.Limit.Rate, 0)
		left := e.View().Tokens // the previous reply's: its view is set after this
		want := s.Limit.Burst
		if add < want-left {
			want = left + add
		}
		alone = found >= want-aloneSlack && found <= want+aloneSlack
		if !alone && now == prev {
			return // two calls of the same microsecond: which came first is not known
		}
		if sp := x.Spec(); sp != nil && sp.Mode == Lease {
			r.countTakers(e, s, rep, want-found)
		}
	}
	x.lastNow.Store(now)
	sp := x.Spec()
	optimistic := sp != nil && sp.Mode == Optimistic
	f := x.flags.Load()
	if !alone && optimistic {
		if f&flagAlone != 0 && x.sinceForeign(now) < r.quiet(sp) {
			// Two replies that found another's write within a quiet
			// spell, if not in a row: others spend the key (a storm's
			// instances charge between some of this one's replies, not
			// all).
			f |= flagDoubt
		}
		x.markForeign(now)
	}
	switch {
	case alone && f&flagAlone == 0 && optimistic && x.sinceForeign(now) < r.quiet(sp):
		// Another instance wrote an optimistic key's bucket lately: it
		// may hold budget it has not spent, which a grant to an
		// instance alone would take (see Others).
	case alone:
		if f&(flagAlone|flagDoubt) != flagAlone {
			x.flags.Or(flagAlone)
			x.flags.And(^flagDoubt)
		}
	case f&flagAlone == 0:
	case f&flagDoubt == 0:
		// Once may be this instance's own calls crossing; twice in a
		// row is another instance's doing.
		x.flags.Or(flagDoubt)
	default:
		x.flags.And(^(flagAlone | flagDoubt))
	}
}

// quiet is how long an optimistic key of sp goes without a reply that finds
// another instance's write before this instance counts itself alone on it:
// as long as the others' shares of the refill take to bring them a token
// each (what they may spend and charge later, unseen until then), two
// rounds at least and a minute at most. A key that several instances spend
// at a low rate shows their writes seldom, and is not taken for one
// instance's between them.
func (r *Reconciler) quiet(sp *Spec) time.Duration {
	return min(max(2*r.cfg.SyncInterval, limit.DurationFor(r.live.Load()*local.Micro, sp.Limit.Rate)), time.Minute)
}

// The upper half of State.flags holds the Redis time of the latest reply
// that found another instance's write in an optimistic key's bucket, in
// units of foreignUnit microseconds modulo 2^16 (0: none): about 131 ms,
// wrapping after 143 minutes, far beyond the longest quiet.
const (
	foreignShift = 16
	foreignUnit  = 1 << 17
)

// markForeign records that a reply of Redis time now (microseconds) found
// another instance's write.
func (s *State) markForeign(now int64) {
	t := max(uint32(now/foreignUnit)&0xFFFF, 1)
	for {
		old := s.flags.Load()
		if s.flags.CompareAndSwap(old, old&(1<<foreignShift-1)|t<<foreignShift) {
			return
		}
	}
}

// sinceForeign returns how long before now (Redis time, microseconds) the
// latest reply that found another instance's write came, rounded down to
// foreignUnit, or the longest Duration if none did.
func (s *State) sinceForeign(now int64) time.Duration {
	t := s.flags.Load() >> foreignShift
	if t == 0 {
		return math.MaxInt64
	}
	d := (uint32(now/foreignUnit) - t) & 0xFFFF
	return time.Duration(d) * foreignUnit * time.Microsecond
}
