package reconcile

import (
	"sync"
	"sync/atomic"
)

// hurry is the set of entries whose requests wait for a round that holds
// their key (awaitRound). A round of many keys goes to a node in calls of
// maxBatch keys, one after another: on a long tail, where a key's next
// request comes while the round charging its first is on its way, a round
// of 20,000 keys took 40 calls, and a request whose key was in one of the
// last waited past ColdWait and was denied unanswered (about 0.14% of an
// optimistic long tail's decisions on a saturated host). The round sends
// the keys of this set in its next call instead (see hurryInto), so that a
// request waits for the call on its way and its own, not for the round.
type hurry struct {
	n    atomic.Int32 // len(keys), read without mu by the round
	mu   sync.Mutex
	keys map[*Entry]struct{}
}

// add records that a request waits for the round that holds e's key.
func (h *hurry) add(e *Entry) {
	h.mu.Lock()
	if h.keys == nil {
		h.keys = make(map[*Entry]struct{})
	}
	if _, ok := h.keys[e]; !ok {
		h.keys[e] = struct{}{}
		h.n.Add(1)
	}
	h.mu.Unlock()
}

// takeAll moves the set's entries into m (emptied first) and empties the
// set: one lock for a round's call, however many keys the call looks up.
func (h *hurry) takeAll(m map[*Entry]struct{}) {
	clear(m)
	h.mu.Lock()
	for e := range h.keys {
		m[e] = struct{}{}
	}
	clear(h.keys)
	h.n.Store(0)
	h.mu.Unlock()
}

// reset empties the set at a round's end: every key it held is answered, and
// an entry added after its key's reply waits for nothing. A set grown large
// is let go, as a map keeps its size once grown.
func (h *hurry) reset() {
	if h.n.Load() == 0 && len(h.keys) == 0 {
		return
	}
	h.mu.Lock()
	if len(h.keys) > maxBatch {
		h.keys = nil
	} else {
		clear(h.keys)
	}
	h.n.Store(0)
	h.mu.Unlock()
}

// order gives a round's calls to one node a way to move its settlements:
// entry returns the entry of the j-th one, nil for one that must keep its
// place (a resend, a key no entry holds), and swap exchanges two. shared
// reports whether the calls to other nodes go at the same time, and look
// for the keys requests wait for in their settlements too.
type order interface {
	entry(j int) *Entry
	swap(a, b int)
	shared() bool
}

// hurryInto moves into [lo, hi), the next call of a round's n settlements
// to one node, those after it whose keys requests wait for, in the places
// of the last settlements of the call that none waits for. The keys waited
// for that it does not find after hi are in the call or were answered
// already; those it cannot place (the call is full of them) wait for the
// call after.
func (r *Reconciler) hurryInto(o order, lo, hi, n int) {
	want := make(map[*Entry]struct{}, r.hurry.n.Load())
	r.hurry.takeAll(want)
	p := hi - 1
	for j := hi; j < n && len(want) > 0; j++ {
		e := o.entry(j)
		if e == nil {
			continue
		}
		if _, ok := want[e]; !ok {
			continue
		}
		delete(want, e)
		for p >= lo {
			if t := o.entry(p); t != nil {
				if _, ok := want[t]; !ok {
					break
				}
			}
			p--
		}
		if p < lo {
			r.hurry.add(e) // the call is full of keys requests wait for
			continue
		}
		o.swap(p, j)
		r.stats.hurried.Add(1)
		p--
	}
	if o.shared() {
		for e := range want { // perhaps another node's
			r.hurry.add(e)
		}
	}
}

// roundOrder is the order of a round whose settlements all go to one node:
// r.sets and r.owners, whose resends keep their places at the front.
type roundOrder struct{ r *Reconciler }

func (o roundOrder) entry(j int) *Entry {
	if j < o.r.resends {
		return nil
	}
	return o.r.owners[j].e
}

func (o roundOrder) shared() bool { return false }

func (o roundOrder) swap(a, b int) {
	r := o.r
	r.sets[a], r.sets[b] = r.sets[b], r.sets[a]
	r.owners[a], r.owners[b] = r.owners[b], r.owners[a]
}

// groupOrder is the order of a round's settlements to one node of several:
// g.sets, with the places in r.sets that g.idx keeps, which move with them.
type groupOrder struct {
	r *Reconciler
	g *group
}

func (o groupOrder) entry(j int) *Entry { return o.r.owners[o.g.idx[j]].e }

func (o groupOrder) shared() bool { return true }

func (o groupOrder) swap(a, b int) {
	g := o.g
	g.sets[a], g.sets[b] = g.sets[b], g.sets[a]
	g.idx[a], g.idx[b] = g.idx[b], g.idx[a]
}
