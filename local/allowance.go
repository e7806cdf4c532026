package local

import "sync/atomic"

// The word of an Allowance: micro-tokens in the low bits, the spends not yet
// carried out in the bits above, the sign for retirement.
const (
	spendShift = 53
	// MaxAllowance is the most micro-tokens an Allowance holds (about 9e9
	// tokens); adding more saturates. Allowances stay below it: they are
	// bounded by LocalCapacity, at most 2^31 tokens.
	MaxAllowance = 1<<spendShift - 1
	spendOne     = int64(1) << spendShift
	spendMask    = int64(1023) << spendShift // bits 53 to 62
	spendCarry   = 1024                      // a full field and one more
)

// Allowance is the Tokens an Entry may spend without asking anyone (in lease
// mode Redis granted them before they are spent, so spending needs no clock,
// only an atomic compare-and-swap), which also counts the spends made with
// Spend and SpendLeft: the decisions answered from the allowance.
//
// The count is kept in the same word as the tokens, so counting costs a spend
// no write besides the compare-and-swap it makes anyway (a counter beside it
// would cost a second atomic instruction on the hot path); once every 1024
// spends it is carried to a second counter. TakeSpends returns it.
//
// It is retired like Tokens. The zero Allowance holds nothing, has counted
// nothing and is ready to use. It is safe for concurrent use.
type Allowance struct {
	word
	// st is the allowance's stripes, nil until SpendLeftShared finds the
	// word contended (stripes.go).
	st atomic.Pointer[stripes]
}

// word is an allowance's micro-tokens and spend count, in one word, and the
// spends carried out of it: an Allowance's own, and each of its stripes'.
type word struct {
	v      atomic.Int64  // micro-tokens in the low 53 bits, spends above; retiredMark once retired
	spends atomic.Uint64 // spends carried out of v
}

// clampAllowance bounds n to what an Allowance holds.
func clampAllowance(n int64) int64 { return min(max(n, 0), MaxAllowance) }

// SpendLeft takes n micro-tokens if a holds at least n, counts the spend,
// and returns what a holds after it. n must not be negative. On an
// Allowance it spends from the allowance's own word alone, never from its
// stripes: an allowance that SpendLeftShared splits is spent with that.
func (a *word) SpendLeft(n int64) (left int64, ok bool) {
	// Small enough to be inlined: the hot path's only atomic instruction.
	for {
		v := a.v.Load()
		bal := v & MaxAllowance // 0 if retired
		if v < 0 || bal < n {
			return bal, false
		}
		// A full count overflows into the sign bit: it is carried, with
		// this spend, to a.spends.
		nv := v - n + spendOne
		if a.v.CompareAndSwap(v, nv&^(nv>>63&^MaxAllowance)) {
			if nv < 0 {
				a.spends.Add(spendCarry)
			}
			return bal - n, true
		}
	}
}

// spendUncounted is SpendLeft without counting the spend: for tokens fetched
// for the request that spends them, a decision that did not come from the
// allowance.
func (a *word) spendUncounted(n int64) (left int64, ok bool) {
	for {
		v := a.v.Load()
		bal := v & MaxAllowance
		if v < 0 || bal < n {
			return bal, false
		}
		if a.v.CompareAndSwap(v, v-n) {
			return bal - n, true
		}
	}
}

// takeSpends returns the spends counted since the last call, and starts
// counting again from zero.
func (a *word) takeSpends() uint64 {
	for {
		v := a.v.Load()
		if v < 0 || v&spendMask == 0 {
			break // retired (Retire carried the count) or nothing to carry
		}
		if a.v.CompareAndSwap(v, v&^spendMask) {
			return uint64(v&spendMask>>spendShift) + a.spends.Swap(0)
		}
	}
	if a.spends.Load() == 0 {
		return 0 // no write: the hot key's cache line is left alone
	}
	return a.spends.Swap(0)
}

// takeUpTo takes at most n micro-tokens, as many as a holds, and returns how
// many it took.
func (a *word) takeUpTo(n int64) int64 {
	for {
		v := a.v.Load()
		if v < 0 {
			return 0
		}
		take := min(v&MaxAllowance, n)
		if take <= 0 {
			return 0
		}
		if a.v.CompareAndSwap(v, v-take) {
			return take
		}
	}
}

// update replaces what a holds, v, with f(v), atomically: f may be called
// more than once. It reports false, changing nothing, if a is retired.
func (a *word) update(f func(v int64) int64) bool {
	for {
		v := a.v.Load()
		if v < 0 {
			return false
		}
		if a.v.CompareAndSwap(v, v&^MaxAllowance|clampAllowance(f(v&MaxAllowance))) {
			return true
		}
	}
}

// set replaces what a holds with n and returns what it held. It reports
// false, changing nothing, if a is retired.
func (a *word) set(n int64) (old int64, ok bool) {
	for {
		v := a.v.Load()
		if v < 0 {
			return 0, false
		}
		if a.v.CompareAndSwap(v, v&^MaxAllowance|clampAllowance(n)) {
			return v & MaxAllowance, true
		}
	}
}

// add adds n micro-tokens, up to MaxAllowance. It reports false, adding
// nothing, if a is retired: the caller still owns the n tokens and must
// account for them elsewhere.
func (a *word) add(n int64) bool {
	for {
		v := a.v.Load()
		if v < 0 {
			return false
		}
		if a.v.CompareAndSwap(v, v&^MaxAllowance|clampAllowance(v&MaxAllowance+n)) {
			return true
		}
	}
}

// takeAll empties a and returns what it held (zero if retired), for the
// caller to give back.
func (a *word) takeAll() int64 {
	for {
		v := a.v.Load()
		if v < 0 || v&MaxAllowance == 0 {
			return 0
		}
		if a.v.CompareAndSwap(v, v&^MaxAllowance) {
			return v & MaxAllowance
		}
	}
}

// load returns the micro-tokens a holds; zero once retired.
func (a *word) load() int64 {
	v := a.v.Load()
	if v < 0 {
		return 0
	}
	return v & MaxAllowance
}

// retire empties a for good and returns what it held; the spends it counted
// stay for TakeSpends. Only the first call returns anything.
func (a *word) retire() int64 {
	v := a.v.Swap(retiredMark)
	if v < 0 {
		return 0
	}
	if n := uint64(v & spendMask >> spendShift); n > 0 {
		a.spends.Add(n)
	}
	return v & MaxAllowance
}

// retired reports whether Retire was called.
func (a *word) retired() bool { return a.v.Load() < 0 }

// Spend takes n micro-tokens if a holds at least n, counts the spend, and
// reports whether it did. It reads no clock and never blocks.
func (a *Allowance) Spend(n int64) bool {
	_, ok := a.SpendLeft(n)
	return ok
}

// SpendLeftShared is SpendLeft for an allowance that many goroutines may
// spend at once (a lease): once they contend for its word, it splits into
// stripes that each spend alone (stripes.go). left is then what the
// caller's stripe and the word hold after the spend, not the other
// stripes'.
func (a *Allowance) SpendLeftShared(n int64) (left int64, ok bool) {
	if st := a.st.Load(); st != nil {
		// The caller's stripe, with no call before the atomic instruction
		// (which waits for the stores a call's spills make).
		salt := st.salt.Load()
		s := st.mine(salt)
		if v := s.w.v.Load(); v >= 0 && v&MaxAllowance >= n {
			if nv := v - n + spendOne; nv >= 0 {
				if s.w.v.CompareAndSwap(v, nv) {
					return v&MaxAllowance - n + a.word.load(), true
				}
				st.salt.CompareAndSwap(salt, salt+1) // another goroutine spends from this stripe now: pick again
			}
		}
		return a.spendStriped(st, s, n)
	}
	if v := a.word.v.Load(); v >= 0 && v&MaxAllowance >= n {
		nv := v - n + spendOne
		if nv < 0 { // a full count: spendLeft carries it
			return a.word.SpendLeft(n)
		}
		if a.word.v.CompareAndSwap(v, nv) {
			return v&MaxAllowance - n, true
		}
		a.stripe() // another writer was quicker: the word is contended
	}
	return a.word.SpendLeft(n)
}

// Word is one word of an Allowance that spends are made on: its own, or
// one of its stripes once it is split (see SpendLeftShared).
type Word = word

// Spender returns the word a spend of the caller's is made on: the stripe
// its goroutine picks if a is split into stripes, else a's own word. With
// Word.TrySpend and Besides it is SpendLeftShared's spend when nothing is in
// its way, each small enough to be inlined, for a hot path that makes no
// call before its atomic instruction (which waits for the stores that a
// call's spills make).
func (a *Allowance) Spender() *Word {
	if st := a.st.Load(); st != nil {
		return &st.mine(st.salt.Load()).w
	}
	return &a.word
}

// TrySpend takes n micro-tokens from w and counts the spend, if w holds n,
// the count does not carry and no other writer comes between, and returns
// what w holds after it; else it takes nothing and ok is false, and
// SpendLeftShared decides.
func (w *word) TrySpend(n int64) (left int64, ok bool) {
	v := w.v.Load()
	if nv := v - n + spendOne; v|nv >= 0 && v&MaxAllowance >= n && w.v.CompareAndSwap(v, nv) {
		return v&MaxAllowance - n, true
	}
	return 0, false
}

// Besides returns what a holds besides its word w (Spender): its own
// word's tokens if w is a stripe, else nothing. A spend from a stripe
// leaves the stripe's tokens and the word's, as SpendLeftShared counts.
func (a *Allowance) Besides(w *Word) int64 {
	if w == &a.word {
		return 0
	}
	return a.word.load()
}

// SpendUncounted is SpendLeft without counting the spend: for tokens fetched
// for the request that spends them, a decision that did not come from the
// allowance. What stripes hold is gathered if the word is short.
func (a *Allowance) SpendUncounted(n int64) (left int64, ok bool) {
	if left, ok = a.word.spendUncounted(n); ok || a.st.Load() == nil {
		return left, ok
	}
	a.collect()
	return a.word.spendUncounted(n)
}

// TakeSpends returns the spends counted since the last call, the stripes'
// too, and starts counting again from zero.
func (a *Allowance) TakeSpends() uint64 {
	n := a.word.takeSpends()
	if st := a.st.Load(); st != nil {
		for i := range st.s {
			n += st.s[i].w.takeSpends()
		}
	}
	return n
}

// TakeUpTo takes at most n micro-tokens, as many as a holds, and returns how
// many it took. What stripes hold is gathered if the word is short.
func (a *Allowance) TakeUpTo(n int64) int64 {
	if a.st.Load() != nil && a.word.load() < n {
		a.collect()
	}
	return a.word.takeUpTo(n)
}

// Update replaces what a holds, v, with f(v), atomically: f may be called
// more than once. It reports false, changing nothing, if a is retired.
// What stripes hold is gathered into v first; a SpendLeftShared under way
// may move part of the result to its stripe, so Update is for allowances
// that are not spent shared (optimistic budgets).
func (a *Allowance) Update(f func(v int64) int64) bool {
	a.collect()
	return a.word.update(f)
}

// Set replaces what a holds with n and returns what it held. It reports
// false, changing nothing, if a is retired. As for Update, what stripes hold
// is gathered first.
func (a *Allowance) Set(n int64) (old int64, ok bool) {
	a.collect()
	return a.word.set(n)
}

// Add adds n micro-tokens, up to MaxAllowance. It reports false, adding
// nothing, if a is retired: the caller still owns the n tokens and must
// account for them elsewhere.
func (a *Allowance) Add(n int64) bool { return a.word.add(n) }

// TakeAll empties a, its stripes too, and returns what it held (zero if
// retired), for the caller to give back. Tokens that a spender moves into
// its stripe while TakeAll runs stay there, its to spend.
func (a *Allowance) TakeAll() int64 {
	a.collect()
	return a.word.takeAll()
}

// Load returns the micro-tokens a holds, its stripes' too; zero once
// retired.
func (a *Allowance) Load() int64 {
	n := a.word.load()
	if st := a.st.Load(); st != nil {
		for i := range st.s {
			n += st.s[i].w.load()
		}
	}
	return n
}

// Retire empties a for good and returns what it held, its stripes' too; the
// spends it counted stay for TakeSpends. Only the first call returns
// anything.
func (a *Allowance) Retire() int64 {
	n := a.word.retire() // first: no refill takes from the word after this
	if st := a.st.Load(); st != nil {
		st.mu.Lock() // after an Unstripe under way, which may leave its tokens in spill
		n += st.retire()
		st.mu.Unlock()
	}
	return n
}

// Retired reports whether Retire was called.
func (a *Allowance) Retired() bool { return a.word.retired() }
