package reconcile

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// evictions remembers, approximately, the keys that left the store lately,
// so that an Optimistic key made again after an eviction learns its bucket
// before it spends, instead of spending as a key never seen.
//
// It is a Bloom filter in two generations: a key is added to the newer
// one, found in either, and when the newer has taken genKeys keys the older
// is cleared and becomes the newer. So a key is remembered for at least
// genKeys evictions after its own (and at most twice as many). Each key
// sets genProbes bits of a generation of genBits; while a generation is at
// most a sixteenth full, a key never added is found by mistake about once
// in 200 lookups per generation (it then only waits for a fetch it did not
// need). The generations are made at the first eviction: a store that never
// evicts costs nothing. Safe for concurrent use.
type evictions struct {
	once sync.Once
	made atomic.Bool // the generations are made: has may read them
	seed maphash.Seed
	gens [2][]atomic.Uint64
	cur  atomic.Uint32 // the generation keys are added to
	n    atomic.Int64  // the keys added to it
	mu   sync.Mutex    // serialises the turns of generations
}

// The size of evictions: two generations of 128 KiB, each remembering
// 65,536 keys.
const (
	genBits   = 1 << 20
	genKeys   = genBits / 16
	genProbes = 3
)

// add remembers key.
func (ev *evictions) add(key string) {
	ev.once.Do(func() {
		ev.seed = maphash.MakeSeed()
		for i := range ev.gens {
			ev.gens[i] = make([]atomic.Uint64, genBits/64)
		}
		ev.made.Store(true)
	})
	g := ev.gens[ev.cur.Load()]
	h := maphash.String(ev.seed, key)
	for i := range uint64(genProbes) {
		b := bit(h, i)
		g[b/64].Or(1 << (b % 64))
	}
	if ev.n.Add(1) >= genKeys {
		ev.turn()
	}
}

// turn clears the older generation and makes it the one keys are added to.
func (ev *evictions) turn() {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if ev.n.Load() < genKeys {
		return // turned by another caller meanwhile
	}
	old := 1 - ev.cur.Load()
	for i := range ev.gens[old] {
		ev.gens[old][i].Store(0)
	}
	ev.cur.Store(old)
	ev.n.Store(0)
}

// has reports whether key was added lately (see evictions).
func (ev *evictions) has(key string) bool {
	if !ev.made.Load() {
		return false // nothing evicted yet (or being made: then too new to matter)
	}
	h := maphash.String(ev.seed, key)
	for _, g := range ev.gens {
		found := true
		for i := range uint64(genProbes) {
			b := bit(h, i)
			if g[b/64].Load()&(1<<(b%64)) == 0 {
				found = false
				break
			}
		}
		if found {
			return true
		}
	}
	return false
}

// bit returns the i-th probe of hash h in a generation: double hashing of
// h's two halves.
func bit(h, i uint64) uint64 {
	return (h + i*(h>>32|1)) % genBits
}
