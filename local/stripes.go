package local

import (
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// A lease on a hot key is spent by every core at once, and one word that
// every core writes is a cache line that travels between them on each
// spend: the cores take turns. Once spends of an Allowance lose a
// compare-and-swap to each other (SpendLeftShared) and it holds enough for
// each stripe to spend a while (minShare), it splits into stripes, one
// cache line each, four per CPU. A goroutine spends from the stripe
// its stack address picks (and picks again when it finds another spending
// there), and refills it from the allowance's own word a share at a time;
// when the word runs short, the stripes' tokens are gathered back into it
// before anything is denied, so that striping never denies a spend the
// allowance as a whole could make. Everything but the spend itself (Load,
// TakeAll, TakeUpTo, Retire, TakeSpends) counts the stripes too: the
// reconciler sees one allowance. An allowance stays striped until it is
// retired, or until its owner lets the stripes go (Unstripe: a lease a round
// takes back from a key nobody asked since); an uncontended or small one
// never pays for stripes.

const (
	// maxStripes bounds the stripes of an allowance.
	maxStripes = 64
	// cacheLine is the size a stripe is padded to.
	cacheLine = 64
	// minShare is the least an allowance must hold for each of its
	// stripes-to-be before it splits: 4096 tokens.
	minShare = 4096 * Micro
)

// stripes are the parts of a striped Allowance.
type stripes struct {
	s     []stripe
	shift uint64               // 64 - log2(len(s)): a hash's top bits pick a stripe
	_     [cacheLine - 32]byte // s and shift are read by every spend: apart from salt
	// salt mixes into the stripe a goroutine picks; a spend that finds its
	// stripe contended under the salt it picked with changes it, so that
	// goroutines that picked the same stripe pick again (and a spend that
	// picked with a salt changed since does not change it twice).
	salt atomic.Uint64
	_    [cacheLine - 8]byte
	// refills counts the refills under way, between taking tokens from
	// the word and putting them in a stripe; spill holds the tokens of a
	// refill that found its stripe and the word retired, for Retire.
	refills atomic.Int64
	spill   atomic.Int64
	// mu orders Unstripe and Retire, which both retire the stripes.
	mu sync.Mutex
}

// stripe is one part of a striped Allowance, alone on its cache line.
type stripe struct {
	w word
	_ [cacheLine - unsafe.Sizeof(word{})]byte
}

// stripe splits a into stripes, unless another spend did already, or a
// holds less than minShare a stripe: a lease that small runs dry within a
// few thousand spends, and stripes would spend their time being refilled
// and gathered back (measured: the default LocalCapacity of 4096 tokens,
// striped on 2 cores, decided 20% fewer requests a second in a closed loop
// of 32 workers).
func (a *Allowance) stripe() {
	n := stripeCount()
	if a.st.Load() != nil || a.word.load() < int64(n)*minShare { // 0 once retired
		return
	}
	a.split(n)
}

// stripeCount is how many stripes an allowance splits into: four per CPU,
// rounded up to a power of two, at most maxStripes. (runtime.NumCPU reads a
// number; runtime.GOMAXPROCS takes the scheduler's lock, which a storm of
// contended spends would then contend for too.)
func stripeCount() int {
	n := 1
	for n < 4*runtime.NumCPU() && n < maxStripes {
		n <<= 1
	}
	return n
}

// split splits a into n stripes, a power of two, unless it is already.
func (a *Allowance) split(n int) {
	a.st.CompareAndSwap(nil, &stripes{s: make([]stripe, n), shift: uint64(64 - bits.TrailingZeros(uint(n)))})
}

// mine returns the caller's stripe under salt (st.salt as the caller loaded
// it): the one its goroutine's stack address picks, so that goroutines
// running at once mostly spend from different stripes, and each goroutine
// from the same one. Goroutine stacks are 2 KiB at least and aligned to
// their size, so the address in 2 KiB units tells two goroutines apart
// (4 KiB would not: two small stacks can share a page).
func (st *stripes) mine(salt uint64) *stripe {
	var x byte
	// Fibonacci hashing of the address and the salt: one multiplication,
	// whose top bits spread neighbouring stacks across the stripes, and
	// move two goroutines that collide apart under a new salt as often as
	// not. (The spend's atomic instruction waits for the stripe's address:
	// a longer hash would delay every spend.)
	h := (uint64(uintptr(unsafe.Pointer(&x))>>11) ^ salt) * 0x9e3779b97f4a7c15
	return &st.s[h>>st.shift]
}

// spendStriped is SpendLeftShared on a's stripes st, past a spend from s,
// the caller's stripe, that did not go through at once.
func (a *Allowance) spendStriped(st *stripes, s *stripe, n int64) (left int64, ok bool) {
	if bal, ok := s.w.SpendLeft(n); ok {
		return bal + a.word.load(), true
	}
	if a.refill(st, s, n) {
		if bal, ok := s.w.SpendLeft(n); ok {
			return bal + a.word.load(), true
		}
	}
	// The word is short (or another spender of the stripe was quicker):
	// gather what the stripes hold and spend from the word.
	a.collect()
	left, ok = a.word.SpendLeft(n)
	return left, ok
}

// refill moves a share of what the word holds, at least n, into stripe s,
// and reports whether it did.
func (a *Allowance) refill(st *stripes, s *stripe, n int64) bool {
	st.refills.Add(1)
	defer st.refills.Add(-1)
	if s.w.retired() {
		// Let go (Unstripe) or retired with the allowance: take nothing
		// from the word. Counted as under way first, so that Unstripe,
		// which retires the stripes and then waits for the refills under
		// way, misses none that could take from the word.
		return false
	}
	for {
		v := a.word.v.Load()
		bal := v & MaxAllowance
		if v < 0 || bal < n {
			return false
		}
		share := max(n, bal/int64(len(st.s)+1)) // leave the others their share
		if !a.word.v.CompareAndSwap(v, v-share) {
			continue
		}
		if s.w.add(share) {
			return true
		}
		// The stripe is retired: the allowance is being retired too.
		if !a.word.add(share) {
			st.spill.Add(share)
		}
		return false
	}
}

// collect moves what a's stripes hold back into its word; their spend
// counts stay with them.
func (a *Allowance) collect() {
	st := a.st.Load()
	if st == nil {
		return
	}
	for i := range st.s {
		if n := st.s[i].w.takeAll(); n > 0 && !a.word.add(n) {
			st.spill.Add(n) // the word is retired: Retire returns it
		}
	}
}

// Unstripe lets a's stripes go, if it has any: what they hold and the spends
// they counted go back to its word, and a is one word again until its
// spends contend anew. For an allowance nobody spends for a while (a lease
// that a round takes back from an idle key), so that an idle key keeps no
// cache lines for cores that left it. A spend under way on a stripe fails
// there and is made on the word.
func (a *Allowance) Unstripe() {
	st := a.st.Load()
	if st == nil {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	var n int64
	var spends uint64
	for i := range st.s {
		n += st.s[i].w.retire()
		spends += st.s[i].w.takeSpends()
	}
	// A refill that began before the stripes were retired puts what it
	// took back in the word, or in spill if the word is retired; one that
	// begins after takes nothing (refill).
	for st.refills.Load() > 0 {
		runtime.Gosched()
	}
	n += st.spill.Swap(0)
	a.word.spends.Add(spends)
	if !a.word.add(n) {
		// The allowance is being retired: its Retire, waiting for st.mu,
		// returns what the stripes held.
		st.spill.Add(n)
		return
	}
	a.st.CompareAndSwap(st, nil)
}

// retire retires every stripe, once the refills under way are done, and
// returns what the stripes held and what those refills could put nowhere.
// The word is retired already, so no refill starts.
func (st *stripes) retire() int64 {
	for st.refills.Load() > 0 {
		runtime.Gosched()
	}
	var n int64
	for i := range st.s {
		n += st.s[i].w.retire()
	}
	return n + st.spill.Swap(0)
}
