package local

import (
	"math"
	"sync/atomic"
)

// retiredMark is the value of a retired counter. Any count added to it stays
// negative, so a retired counter is recognised by its sign.
const retiredMark = math.MinInt64

// Tokens is a count of micro-tokens that can be retired. An Entry keeps its
// pending consumption in one, spent here and not yet settled with Redis (and
// its allowance in an Allowance, which counts its spends too).
//
// Retiring (when the entry leaves the store) hands back what the count held;
// from then on it spends nothing and accepts nothing, so no token is stranded
// in an entry nobody will settle. A caller that finds a retired count looks
// its key up again.
//
// The zero Tokens holds nothing and is ready to use. It is safe for
// concurrent use.
type Tokens struct {
	v atomic.Int64 // micro-tokens, >= 0; retiredMark once retired
}

// Spend takes n micro-tokens if a holds at least n, and reports whether it
// did. It reads no clock and never blocks.
func (a *Tokens) Spend(n int64) bool {
	_, ok := a.SpendLeft(n)
	return ok
}

// SpendLeft is Spend that also returns what a holds after it.
func (a *Tokens) SpendLeft(n int64) (left int64, ok bool) {
	for {
		v := a.v.Load()
		if v < n {
			return max(v, 0), false
		}
		if a.v.CompareAndSwap(v, v-n) {
			return v - n, true
		}
	}
}

// TakeUpTo takes at most n micro-tokens, as many as a holds, and returns how
// many it took.
func (a *Tokens) TakeUpTo(n int64) int64 {
	for {
		v := a.v.Load()
		take := min(v, n)
		if take <= 0 {
			return 0
		}
		if a.v.CompareAndSwap(v, v-take) {
			return take
		}
	}
}

// Update replaces what a holds, v, with f(v), atomically: f may be called
// more than once. It reports false, changing nothing, if a is retired.
func (a *Tokens) Update(f func(v int64) int64) bool {
	for {
		v := a.v.Load()
		if v < 0 {
			return false
		}
		if a.v.CompareAndSwap(v, max(f(v), 0)) {
			return true
		}
	}
}

// Set replaces what a holds with n and returns what it held. It reports
// false, changing nothing, if a is retired.
func (a *Tokens) Set(n int64) (old int64, ok bool) {
	for {
		v := a.v.Load()
		if v < 0 {
			return 0, false
		}
		if a.v.CompareAndSwap(v, n) {
			return v, true
		}
	}
}

// Add adds n micro-tokens. It reports false, adding nothing, if a is retired:
// the caller still owns the n tokens and must account for them elsewhere.
func (a *Tokens) Add(n int64) bool {
	for {
		v := a.v.Load()
		if v < 0 {
			return false
		}
		if a.v.CompareAndSwap(v, v+n) {
			return true
		}
	}
}

// TakeAll empties a and returns what it held (zero if retired),
// for the caller to give back.
func (a *Tokens) TakeAll() int64 {
	for {
		v := a.v.Load()
		if v <= 0 {
			return 0
		}
		if a.v.CompareAndSwap(v, 0) {
			return v
		}
	}
}

// Load returns the micro-tokens a holds; zero once retired.
func (a *Tokens) Load() int64 { return max(a.v.Load(), 0) }

// Retire empties a for good and returns what it held. Only the
// first call returns anything.
func (a *Tokens) Retire() int64 { return max(a.v.Swap(retiredMark), 0) }

// Retired reports whether Retire was called.
func (a *Tokens) Retired() bool { return a.v.Load() < 0 }
