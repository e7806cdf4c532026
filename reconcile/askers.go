package reconcile

import (
	"time"

	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/internal/limit"
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
	if prev != 0 && !rep.Reset {
		found := rep.Tokens + rep.Granted + s.Consumed - s.Returned
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
	}
	x.lastNow.Store(now)
	f := x.flags.Load()
	switch {
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
