package reconcile

import (
	"sync"
	"time"
	"unsafe"
)

// sides holds what only a few entries need at a time, out of State, which
// every tracked key carries (a long tail tracks hundreds of thousands):
// what the requests waiting for a lease fetch of a key need (its demand),
// the tokens Redis granted an optimistic key's budget out of the bucket
// (its prepaid grant), and a lease key's turn taken ahead (see Ahead). A
// key has a side while one of them is not zero; the State flags
// flagPrepaid and flagReserved tell a round, which charges every
// optimistic key it settles, and a lease request, whether to look.
type sides struct {
	shards [sideShards]sideShard
}

// sideShards spreads the sides over locks by entry: concurrent slow paths
// of different keys seldom share one.
const sideShards = 16

type sideShard struct {
	mu sync.Mutex
	m  map[*Entry]*side
	_  [48]byte // keep shards on separate cache lines
}

// side is an entry's demand and prepaid grant, in micro-tokens, and a lease
// key's turn taken ahead: reserved micro-tokens, spendable from due (local
// monotonic time) on.
type side struct {
	demand, prepaid int64
	reserved        int64
	due             time.Duration
}

// shard returns the shard of e's side.
func (s *sides) shard(e *Entry) *sideShard {
	p := uintptr(unsafe.Pointer(e))
	return &s.shards[(p>>7^p>>13)%sideShards]
}

// get returns e's side, made if create is true, or nil; sh.mu is held.
func (sh *sideShard) get(e *Entry, create bool) *side {
	sd := sh.m[e]
	if sd == nil && create {
		if sh.m == nil {
			sh.m = map[*Entry]*side{}
		}
		sd = new(side)
		sh.m[e] = sd
	}
	return sd
}

// drop forgets e's side if it holds nothing; sh.mu is held.
func (sh *sideShard) drop(e *Entry, sd *side) {
	if sd.demand == 0 && sd.prepaid == 0 && sd.reserved == 0 {
		delete(sh.m, e)
	}
}

// AddDemand adds d micro-tokens to what the requests waiting for a lease
// fetch of e's key need (d < 0 takes it back): a request adds its cost
// before it waits, and takes it back when it is decided. The next fetch asks
// for that much at least, so that a key's concurrent first requests are
// served by one fetch more, not one each.
func (r *Reconciler) AddDemand(e *Entry, d int64) { r.sides.addDemand(e, d) }

// Demand returns what the requests waiting for a lease fetch of e's key
// need (see AddDemand).
func (r *Reconciler) Demand(e *Entry) int64 { return r.sides.demand(e) }

// addDemand is AddDemand.
func (s *sides) addDemand(e *Entry, d int64) {
	sh := s.shard(e)
	sh.mu.Lock()
	sd := sh.get(e, true)
	sd.demand += d
	if sd.demand != 0 {
		e.X.flags.Or(flagDemand)
	} else {
		e.X.flags.And(^flagDemand)
	}
	sh.drop(e, sd)
	sh.mu.Unlock()
}

// demand returns what the requests waiting for a lease fetch of e's key
// need: none, without a lock, for a key nobody waits for.
func (s *sides) demand(e *Entry) int64 {
	if e.X.flags.Load()&flagDemand == 0 {
		return 0
	}
	return s.load(e).demand
}

// load returns a copy of e's side, the zero side if it has none.
func (s *sides) load(e *Entry) side {
	sh := s.shard(e)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sd := sh.get(e, false); sd != nil {
		return *sd
	}
	return side{}
}

// addPrepaid adds n > 0 micro-tokens to e's prepaid grant and reports
// whether it did: not once e has left the store (its prepaid grant was
// handed off already, see takePrepaid).
func (s *sides) addPrepaid(e *Entry, n int64) bool {
	sh := s.shard(e)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e.Retired() { // retired before handOff takes the lock
		return false
	}
	sh.get(e, true).prepaid += n
	e.X.flags.Or(flagPrepaid)
	return true
}

// prepaid returns e's prepaid grant.
func (s *sides) prepaid(e *Entry) int64 {
	if e.X.flags.Load()&flagPrepaid == 0 {
		return 0
	}
	return s.load(e).prepaid
}

// takePrepaid returns e's prepaid grant and empties it. A grant on its way
// meanwhile is left for the next call.
func (s *sides) takePrepaid(e *Entry) int64 {
	return s.take(e, flagPrepaid, func(sd *side) *int64 { return &sd.prepaid })
}

// take returns the amount of e's side that at picks, and empties it, if
// flag says e's side may hold one.
func (s *sides) take(e *Entry, flag uint32, at func(*side) *int64) int64 {
	if e.X.flags.Load()&flag == 0 {
		return 0
	}
	sh := s.shard(e)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e.X.flags.And(^flag)
	sd := sh.get(e, false)
	if sd == nil {
		return 0
	}
	n := *at(sd)
	*at(sd) = 0
	sh.drop(e, sd)
	return n
}

// retire empties the side of e, an entry that has left the store, and
// returns its prepaid grant and its turn taken ahead. It takes the lock
// whatever the flags say, so that what was added before e left (addPrepaid
// and addReserved check under the lock) is taken, and what comes after is
// refused: nothing stays behind.
func (s *sides) retire(e *Entry) (prepaid, reserved int64) {
	sh := s.shard(e)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e.X.flags.And(^(flagPrepaid | flagReserved))
	sd := sh.get(e, false)
	if sd == nil {
		return 0, 0
	}
	prepaid, reserved = sd.prepaid, sd.reserved
	sd.prepaid, sd.reserved, sd.due = 0, 0, 0
	sh.drop(e, sd)
	return prepaid, reserved
}

// addReserved records n > 0 micro-tokens of e's lease key taken ahead,
// spendable from due on, and reports whether it did: not once e has left
// the store (what it reserved was handed off already, see retire).
func (s *sides) addReserved(e *Entry, n int64, due time.Duration) bool {
	sh := s.shard(e)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e.Retired() {
		return false
	}
	sd := sh.get(e, true)
	if sd.reserved == 0 {
		sd.due = due // a due time left by a turn taken back says nothing
	}
	sd.reserved += n
	sd.due = max(sd.due, due)
	e.X.flags.Or(flagReserved)
	return true
}

// claimReserved moves e's turn taken ahead into its allowance once it is
// due at now. It returns how long until it is due (0 once moved, or if
// there is none) and whether there was one.
func (s *sides) claimReserved(e *Entry, now time.Duration) (wait time.Duration, ok bool) {
	if e.X.flags.Load()&flagReserved == 0 {
		return 0, false
	}
	sh := s.shard(e)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sd := sh.get(e, false)
	if sd == nil || sd.reserved == 0 {
		e.X.flags.And(^flagReserved)
		return 0, false
	}
	if now < sd.due {
		return sd.due - now, true
	}
	if !e.Allowance.Add(sd.reserved) {
		return 0, false // left meanwhile: handOff gives it back (see retire)
	}
	sd.reserved, sd.due = 0, 0
	e.X.flags.And(^flagReserved)
	sh.drop(e, sd)
	return 0, true
}

// takeReserved returns e's turn taken ahead, due or not, and empties it:
// for a lease given back. (Its due time stays, and means nothing once no
// turn is held: see addReserved.)
func (s *sides) takeReserved(e *Entry) int64 {
	return s.take(e, flagReserved, func(sd *side) *int64 { return &sd.reserved })
}
