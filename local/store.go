package local

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math/bits"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// Defaults of Config.
const (
	DefaultCapacity = 100_000
	DefaultShards   = 64
)

// Config configures a Store. A zero field means its documented default.
type Config[X any] struct {
	// Capacity bounds the entries the store tracks. Adding a key to a full
	// store evicts the least recently used entry of the key's shard, so
	// recency is kept per shard: an approximation of a global LRU that needs
	// no global lock. 0 means DefaultCapacity.
	Capacity int
	// Shards is the number of independently locked parts, a power of two up
	// to 65536. Only adding, evicting and refreshing recency take a shard's
	// lock; lookups take none. 0 means DefaultShards.
	Shards int
	// OnEvict receives every entry that leaves the store (evicted to make
	// room, removed, or drained), with what its allowance held unspent and
	// what it had consumed and not settled, both in micro-tokens. The entry
	// is retired first, so nothing more can be spent from it or charged to it:
	// these figures are final. OnEvict runs on the goroutine that caused the
	// eviction, after every lock is released. Nil drops the figures.
	OnEvict func(e *Entry[X], unused, pending int64)
	// Ledger, if set, is told when the local bucket of every entry that
	// leaves the store is full again (Entry.Full), as it leaves: under its
	// shard's lock, once the entry can no longer be found, and so before a
	// new entry of its key can be made. Entries whose bucket was never
	// used cost nothing.
	Ledger *Ledger
	// TrackTouched makes Tick return the entries touched since the previous
	// Tick. Without it Tick returns none and the store keeps no such list.
	TrackTouched bool
}

// ErrConfig reports an invalid Config.
var ErrConfig = errors.New("local: invalid config")

// Store is a bounded, sharded set of shadow buckets keyed by string.
//
// Looking a key up (Get) takes no lock and writes no shared memory, except
// that it refreshes the entry's recency once per epoch (see Tick): that takes
// the shard's lock. Adding a key takes its shard's lock. Each shard keeps
// recency in a golang-lru simplelru list and evicts its least recently used
// entry when full.
//
// Store is safe for concurrent use. Create one with New.
type Store[X any] struct {
	seed     maphash.Seed
	mask     uint64 // len(shards) - 1
	capacity int64
	track    bool         // Config.TrackTouched
	count    atomic.Int64 // entries tracked, across shards
	epoch    atomic.Uint32
	onEvict  func(e *Entry[X], unused, pending int64)
	ledger   *Ledger
	shards   []shard[X]
}

// shard is one independently locked part of a Store. Readers load table
// atomically and never lock; writers hold mu.
type shard[X any] struct {
	table   atomic.Pointer[table[X]]
	store   *Store[X]
	mu      sync.Mutex                          // protects lru, evicted, and writes to table
	lru     *simplelru.LRU[*Entry[X], struct{}] // recency and the bound
	evicted []*Entry[X]                         // entries the lru let go, to hand off after unlocking
	touched []*Entry[X]                         // entries first looked up or added in this epoch
	_       [64]byte                            // keep shards on separate cache lines
}

// New returns an empty Store.
func New[X any](cfg Config[X]) (*Store[X], error) {
	if cfg.Capacity == 0 {
		cfg.Capacity = DefaultCapacity
	}
	if cfg.Shards == 0 {
		cfg.Shards = DefaultShards
	}
	if cfg.Capacity < 0 {
		return nil, fmt.Errorf("%w: Capacity %d is negative", ErrConfig, cfg.Capacity)
	}
	if cfg.Shards < 0 || cfg.Shards > 1<<16 || bits.OnesCount(uint(cfg.Shards)) != 1 {
		return nil, fmt.Errorf("%w: Shards %d is not a power of two up to 65536", ErrConfig, cfg.Shards)
	}
	s := &Store[X]{
		seed:     maphash.MakeSeed(),
		mask:     uint64(cfg.Shards - 1),
		capacity: int64(cfg.Capacity),
		track:    cfg.TrackTouched,
		onEvict:  cfg.OnEvict,
		ledger:   cfg.Ledger,
		shards:   make([]shard[X], cfg.Shards),
	}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.store = s
		sh.table.Store(newTable(minSlots, new(Entry[X])))
		// The store enforces the bound across shards; the list's own bound
		// only has to be out of the way.
		lru, err := simplelru.NewLRU(cfg.Capacity+1, sh.onLRUEvict)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		sh.lru = lru
	}
	return s, nil
}

// Get returns the entry for key, or nil if the store does not track it. It
// takes no lock, allocates nothing and reads no clock; once per epoch an
// entry's recency is refreshed under its shard's lock.
func (s *Store[X]) Get(key string) *Entry[X] {
	h := maphash.String(s.seed, key)
	e := s.shards[h&s.mask].table.Load().find(key, h)
	if e != nil && !s.Fresh(e) {
		s.Touch(e, h)
	}
	return e
}

// Holds reports whether e is the entry s holds for its key, without
// touching it: false once e has left the store.
func (s *Store[X]) Holds(e *Entry[X]) bool {
	h := maphash.String(s.seed, e.key)
	return s.shards[h&s.mask].table.Load().find(e.key, h) == e
}

// Hash returns key's hash in s, for Touch.
func (s *Store[X]) Hash(key string) uint64 { return maphash.String(s.seed, key) }

// Touch refreshes the recency of e, whose key hashes to h (Hash), as Get
// does when it finds e: for a caller that keeps an entry between its uses
// and so skips the lookup. Like Get, it takes the shard's lock only once an
// epoch. An entry that has left the store is not listed again; the caller
// sees that it has (Entry.Retired) and looks the key up.
func (s *Store[X]) Touch(e *Entry[X], h uint64) {
	if ep := s.epoch.Load(); e.touched.Load() != ep {
		s.shards[h&s.mask].touch(e, ep)
	}
}

// Fresh reports whether e's recency was refreshed in this epoch already, so
// that Touch would do nothing: a check small enough to be inlined, for a
// caller whose hot path makes no call.
func (s *Store[X]) Fresh(e *Entry[X]) bool { return e.touched.Load() == s.epoch.Load() }

// GetOrAdd returns the entry for key, adding a new one if the store does not
// track it; added reports which. Adding may evict the shard's least recently
// used entry, which is handed to Config.OnEvict before GetOrAdd returns. The
// key is copied, so the caller's memory is not retained. key must not be
// empty (check keys with the limiter's validation first).
func (s *Store[X]) GetOrAdd(key string) (e *Entry[X], added bool) {
	if e := s.Get(key); e != nil {
		return e, false
	}
	return s.Add(key)
}

// Add is GetOrAdd for a key that Get has just missed: it skips the lookup
// without the shard's lock, which would miss again (a new key's decision
// paid three lookups of a large table, each a cache miss, for one).
func (s *Store[X]) Add(key string) (e *Entry[X], added bool) {
	h := maphash.String(s.seed, key)
	sh := &s.shards[h&s.mask]
	sh.mu.Lock()
	if e := sh.table.Load().find(key, h); e != nil {
		sh.mu.Unlock()
		return e, false
	}
	e = newEntry[X](strings.Clone(key), uint32(h>>32))
	e.touched.Store(s.epoch.Load())
	if s.track {
		sh.listTouched(e)
	}
	sh.insertLocked(e)
	sh.lru.Add(e, struct{}{})
	full := s.count.Add(1) > s.capacity
	if full && sh.lru.Len() > 1 {
		sh.lru.RemoveOldest() // see onLRUEvict
		full = false
	}
	gone := sh.takeEvicted()
	sh.mu.Unlock()
	if gone != nil {
		s.handOff(gone)
	}
	if full { // e is alone in its shard: make room in another
		s.evictFrom(h&s.mask + 1)
	}
	return e, true
}

// evictFrom evicts the least recently used entry of the first shard, from
// shard i on, that has one.
func (s *Store[X]) evictFrom(i uint64) {
	for range s.shards {
		sh := &s.shards[i&s.mask]
		sh.mu.Lock()
		sh.lru.RemoveOldest()
		gone := sh.takeEvicted()
		sh.mu.Unlock()
		if gone != nil {
			s.handOff(gone)
			return
		}
		i++
	}
}

// takeEvicted returns the entry the last single eviction queued, if any, and
// empties the queue. sh.mu must be held.
func (sh *shard[X]) takeEvicted() *Entry[X] {
	if len(sh.evicted) == 0 {
		return nil
	}
	e := sh.evicted[0]
	clear(sh.evicted)
	sh.evicted = sh.evicted[:0]
	return e
}

// Remove retires the entry for key, if there is one, hands it to
// Config.OnEvict and reports whether there was one.
func (s *Store[X]) Remove(key string) bool {
	h := maphash.String(s.seed, key)
	sh := &s.shards[h&s.mask]
	sh.mu.Lock()
	e := sh.table.Load().find(key, h)
	if e != nil {
		sh.lru.Remove(e)
		sh.takeEvicted()
	}
	sh.mu.Unlock()
	if e == nil {
		return false
	}
	s.handOff(e)
	return true
}

// Drain removes every entry, handing each to Config.OnEvict, and returns how
// many there were. Entries added while it runs may stay.
func (s *Store[X]) Drain() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.lru.Purge()
		gone := sh.evicted
		sh.evicted = nil
		sh.mu.Unlock()
		for _, e := range gone {
			s.handOff(e)
		}
		n += len(gone)
	}
	return n
}

// Len returns the number of entries tracked.
func (s *Store[X]) Len() int { return int(s.count.Load()) }

// Tick starts a new epoch. With Config.TrackTouched it returns the entries
// touched (added, or looked up with Get or GetOrAdd) since the previous Tick,
// appended to dst; each appears once, and some may since have been retired.
//
// An entry's recency is refreshed at most once per epoch, the first time it
// is looked up in it, so that a hot key's lookups do not all queue on its
// shard's lock. The owner calls Tick on a regular beat (the reconciler: once
// per round, to learn which keys to settle). Without Ticks, entries are
// evicted in the order they were added.
func (s *Store[X]) Tick(dst []*Entry[X]) []*Entry[X] {
	s.epoch.Add(1)
	if !s.track {
		return dst
	}
	epoch := s.epoch.Load()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		dst = append(dst, sh.touched...)
		// Entries touched in the new epoch while this Tick went through the
		// shards were listed for the old one and will not be listed again:
		// keep them for the next Tick too.
		keep := sh.touched[:0]
		for _, e := range sh.touched {
			if e.touched.Load() == epoch {
				keep = append(keep, e)
			}
		}
		clear(sh.touched[len(keep):])
		if cap(keep) > minTouched && cap(keep) > 4*len(keep) {
			// The list grew for a burst of new keys: do not hold on to
			// its peak until the next one.
			keep = append(make([]*Entry[X], 0, max(2*len(keep), minTouched)), keep...)
		}
		sh.touched = keep
		sh.mu.Unlock()
	}
	return dst
}

// handOff retires e and gives its contents to the owner.
func (s *Store[X]) handOff(e *Entry[X]) {
	unused, pending := e.retire()
	if s.onEvict != nil {
		s.onEvict(e, unused, pending)
	}
}

// touch moves e to the front of its shard's recency list and lists it as
// touched in this epoch, once.
func (sh *shard[X]) touch(e *Entry[X], epoch uint32) {
	sh.mu.Lock()
	if e.touched.Load() != epoch {
		if _, ok := sh.lru.Get(e); ok && sh.store.track { // not if e has just left
			sh.listTouched(e)
		}
		e.touched.Store(epoch)
	}
	sh.mu.Unlock()
}

// listTouched appends e to the shard's touched list; sh.mu is held. The
// entries evicted since they were listed stay there until the next Tick,
// which a slow round may put off while keys churn through the store: when
// the list would grow past twice the entries the shard holds, it lets go of
// those first, so that it keeps within the store's bound however long the
// Tick is late. (Amortised O(1): the list holds each of the shard's entries
// once at most, so that at least halves it.)
func (sh *shard[X]) listTouched(e *Entry[X]) {
	if n := len(sh.touched); n == cap(sh.touched) && n >= 2*max(sh.lru.Len(), minSlots) {
		sh.touched = slices.DeleteFunc(sh.touched, (*Entry[X]).Retired)
	}
	sh.touched = append(sh.touched, e)
}

// onLRUEvict is the simplelru eviction callback; sh.mu is held. It unlinks e
// from the lookup table and queues it to be handed off after unlocking.
func (sh *shard[X]) onLRUEvict(e *Entry[X], _ struct{}) {
	sh.removeLocked(e)
	sh.evicted = append(sh.evicted, e)
	sh.store.count.Add(-1)
}

// The lookup table of a shard: open addressing with linear probing over
// atomic pointers. Readers load slots without locks; the writer (holding the
// shard's lock) fills empty slots, marks removed ones with a tombstone, and
// replaces the whole table, never editing it in place, when it grows or
// tombstones pile up. A reader on a replaced table may miss an entry added
// since (it then takes the locked path) or find one just removed (retired,
// so it spends nothing): never a wrong one.
type table[X any] struct {
	slots []atomic.Pointer[Entry[X]]
	tomb  *Entry[X] // marks a removed slot; it matches no key
	mask  uint64
	used  int // live entries plus tombstones; written under the shard lock
	live  int
}

// minTouched is the capacity a shard's touched list keeps at least when Tick
// shrinks it.
const minTouched = 64

// minSlots is the size of a new shard's table.
const minSlots = 8

func newTable[X any](n int, tomb *Entry[X]) *table[X] {
	return &table[X]{slots: make([]atomic.Pointer[Entry[X]], n), mask: uint64(n - 1), tomb: tomb}
}

// find returns the entry for key (of hash h), or nil.
func (t *table[X]) find(key string, h uint64) *Entry[X] {
	h32 := uint32(h >> 32)
	for i := uint64(h32) & t.mask; ; i = (i + 1) & t.mask {
		e := t.slots[i].Load()
		if e == nil {
			return nil
		}
		if e.hash == h32 && e != t.tomb && e.key == key {
			return e
		}
	}
}

// insertLocked adds e, which is not in the table, replacing the table by a
// larger one first if it would be more than 3/4 used.
func (sh *shard[X]) insertLocked(e *Entry[X]) {
	t := sh.table.Load()
	if (t.used+1)*4 > len(t.slots)*3 {
		t = t.rebuilt(t.live + 1)
		sh.table.Store(t)
	}
	for i := uint64(e.hash) & t.mask; ; i = (i + 1) & t.mask {
		if t.slots[i].Load() == nil {
			t.slots[i].Store(e)
			t.used++
			t.live++
			return
		}
	}
}

// removeLocked replaces e's slot with a tombstone, if e is in the table.
func (sh *shard[X]) removeLocked(e *Entry[X]) {
	t := sh.table.Load()
	for i := uint64(e.hash) & t.mask; ; i = (i + 1) & t.mask {
		p := t.slots[i].Load()
		if p == nil {
			return
		}
		if p == e {
			t.slots[i].Store(t.tomb)
			t.live--
			if l := sh.store.ledger; l != nil {
				if full, now, ok := e.fullAt(); ok {
					l.Put(e.key, full, now)
				}
			}
			return
		}
	}
}

// rebuilt returns a new table holding t's live entries, sized for live
// entries at most half full.
func (t *table[X]) rebuilt(live int) *table[X] {
	n := minSlots
	for n < 2*live {
		n *= 2
	}
	nt := newTable(n, t.tomb)
	for i := range t.slots {
		e := t.slots[i].Load()
		if e == nil || e == t.tomb {
			continue
		}
		for j := uint64(e.hash) & nt.mask; ; j = (j + 1) & nt.mask {
			if nt.slots[j].Load() == nil {
				nt.slots[j].Store(e)
				break
			}
		}
		nt.used++
		nt.live++
	}
	return nt
}
