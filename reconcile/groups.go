package reconcile

import (
	"cmp"
	"context"
	"time"

	"github.com/hybridlimit/hybrid/global"
)

// group is the settlements of a round that go to one Redis node, and the
// buffers of the calls to it.
type group struct {
	n       *node
	idx     []int // indexes in r.sets
	sets    []global.Settlement
	replies []global.Reply
	ends    []time.Duration
	err     error // the first failure of the calls to n
}

// group sorts r.sets by the node of their keys. On a single Redis, or when
// all the keys are on one node, it returns one group, whose idx is not set:
// it is all of r.sets. A node's layout is looked up within the breakers'
// call timeout.
func (r *Reconciler) group(ctx context.Context) []*group {
	for _, g := range r.groups {
		g.n, g.idx = nil, g.idx[:0]
	}
	if r.router == nil {
		return r.oneGroup(r.def)
	}
	lctx, cancel := context.WithTimeout(ctx, r.callTimeout)
	defer cancel()
	k := 0 // groups in use
	for i := range r.sets {
		n := r.nodeOf(lctx, r.sets[i].Key)
		j := 0
		for j < k && r.groups[j].n != n {
			j++
		}
		if j == k {
			if k == len(r.groups) {
				r.groups = append(r.groups, &group{})
			}
			r.groups[k].n = n
			k++
		}
		r.groups[j].idx = append(r.groups[j].idx, i)
	}
	if k == 1 {
		return r.oneGroup(r.groups[0].n)
	}
	return r.groups[:k]
}

// oneGroup returns the one group of a round whose keys are all on node n.
func (r *Reconciler) oneGroup(n *node) []*group {
	if len(r.groups) == 0 {
		r.groups = append(r.groups, &group{})
	}
	r.groups[0].n = n
	return r.groups[:1]
}

// settleNode settles sets, whose keys are on node n, through n's breaker in
// calls of at most maxBatch keys, and stores each one's reply and the time
// it came in replies and ends; after each call it calls came with the range
// of sets the call settled. Before each call it moves into it the
// settlements, in o's order, whose keys requests wait for (see hurry). A
// settlement that got no reply, or that the breaker refused, gets the
// call's error as its Reply.Err. It returns the first call's error, if one
// failed.
func (r *Reconciler) settleNode(ctx context.Context, n *node, o order, sets []global.Settlement, replies []global.Reply, ends []time.Duration, came func(lo, hi int)) (failed error) {
	for lo := 0; lo < len(sets); lo += maxBatch {
		hi := min(lo+maxBatch, len(sets))
		if hi < len(sets) && r.hurry.n.Load() > 0 {
			r.hurryInto(o, lo, hi, len(sets))
		}
		s, rep := sets[lo:hi], replies[lo:hi]
		clear(rep)
		start := r.clock.Now()
		err := r.call(ctx, n, len(s), func(ctx context.Context) error {
			if err := r.st.Settle(ctx, s, rep); err != nil {
				return err
			}
			return refusal(rep)
		})
		end := r.clock.Now()
		r.stats.lastRound.Store(int64(end - start))
		if err == nil {
			r.stats.roundTrip.observe(end - start)
			r.clockSample(start, end, rep)
		} else {
			failed = cmp.Or(failed, err)
			// On a Cluster, Settle's error leaves the replies that came
			// valid; the others carry the error already, unless the
			// breaker refused the call.
			for j := range rep {
				if rep[j].Err == nil && !hasReply(&rep[j]) {
					rep[j].Err = err
				}
			}
		}
		for j := lo; j < hi; j++ {
			ends[j] = end
		}
		came(lo, hi)
	}
	return failed
}

// clockSample records the clock of Redis as the first of replies that
// carries it tells it, for a round trip from start to end.
func (r *Reconciler) clockSample(start, end time.Duration, replies []global.Reply) {
	for i := range replies {
		if replies[i].Err == nil && !replies[i].Now.IsZero() {
			r.stats.clockSample(r.clock.Time(start), r.clock.Time(end), replies[i].Now)
			return
		}
	}
}
