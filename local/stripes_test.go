package local

import (
	"sync"
	"sync/atomic"
	"testing"
)

// TestStripes: a striped allowance spends from its stripes, counts what they
// hold in Load, gathers them before it denies a spend the whole could make,
// and hands everything back to TakeAll and Retire.
func TestStripes(t *testing.T) {
	var a Allowance
	a.Add(100)
	a.stripe()
	if a.st.Load() != nil {
		t.Fatal("an allowance of 100 micro-tokens was striped")
	}
	a.split(8)
	// A spend refills its stripe with a share of the word.
	if left, ok := a.SpendLeftShared(10); !ok || left != 90 {
		t.Fatalf("SpendLeftShared(10) = %d, %v; want 90, true", left, ok)
	}
	if a.Load() != 90 || a.word.load() == 90 {
		t.Fatalf("Load = %d, word %d: want 90 in all, part of it in a stripe", a.Load(), a.word.load())
	}
	// Move all but 5 into other stripes, then spend 20: the word alone is
	// short, the whole is not.
	st := a.st.Load()
	for i := range st.s {
		if n := a.word.takeUpTo(a.word.load() - 5); n > 0 {
			st.s[i].w.add(n)
			break
		}
	}
	if left, ok := a.SpendLeftShared(20); !ok || left != 70 {
		t.Fatalf("SpendLeftShared(20) with the tokens in other stripes = %d, %v; want 70, true", left, ok)
	}
	if _, ok := a.SpendLeftShared(71); ok {
		t.Fatal("SpendLeftShared(71) of 70 succeeded")
	}
	if got := a.TakeSpends(); got != 2 {
		t.Errorf("TakeSpends = %d, want 2", got)
	}
	if got := a.TakeUpTo(30); got != 30 || a.Load() != 40 {
		t.Errorf("TakeUpTo(30) = %d, Load after %d; want 30, 40", got, a.Load())
	}
	a.SpendLeftShared(1) // a stripe holds tokens again
	if got := a.TakeAll(); got != 39 || a.Load() != 0 {
		t.Errorf("TakeAll = %d, Load after %d; want 39, 0", got, a.Load())
	}
	a.Add(50)
	a.SpendLeftShared(1)
	if got := a.Retire(); got != 49 || !a.Retired() || a.Load() != 0 {
		t.Errorf("Retire = %d, Retired %v, Load %d; want 49, true, 0", got, a.Retired(), a.Load())
	}
	if _, ok := a.SpendLeftShared(1); ok || a.Add(1) {
		t.Error("a retired allowance spent or took tokens")
	}
}

// TestStripesContended: spends from many goroutines at once split the
// allowance into stripes; an uncontended one stays a word.
func TestStripesContended(t *testing.T) {
	var lone Allowance
	lone.Add(1 << 40)
	for range 10000 {
		lone.SpendLeftShared(1)
	}
	if lone.st.Load() != nil {
		t.Error("an allowance spent by one goroutine was striped")
	}
	var a Allowance
	a.Add(1 << 40)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100000 {
				if a.st.Load() != nil {
					return
				}
				a.SpendLeftShared(1)
			}
		})
	}
	wg.Wait()
	if a.st.Load() == nil {
		t.Skip("8 goroutines never contended for the word (one processor?)")
	}
}

// TestStripesConservation spends shared from many goroutines while others
// add, take back, count and retire: every micro-token added is spent or
// handed back, and every counted spend is returned by TakeSpends once.
func TestStripesConservation(t *testing.T) {
	for iter := range 40 {
		var a Allowance
		if iter%2 == 0 {
			a.split(8) // else never striped: it holds too little
		}
		var spent, added, back atomic.Int64
		var spends, taken atomic.Uint64
		var wg sync.WaitGroup
		for g := range 6 {
			wg.Go(func() {
				for i := range 4000 {
					switch {
					case g == 0 && i%2 == 0:
						if a.Add(7) {
							added.Add(7)
						}
					case g == 1 && i%40 == 0:
						back.Add(a.TakeAll())
					case g == 1 && i%25 == 0:
						back.Add(a.TakeUpTo(3))
					case g == 1 && i%9 == 0:
						taken.Add(a.TakeSpends())
					case g == 2 && i%5 == 0:
						if _, ok := a.SpendUncounted(2); ok {
							spent.Add(2)
						}
					case g == 3 && i%50 == 0 && iter%3 != 2:
						a.Unstripe() // let go under the spends, and made again
					case g == 3 && i%50 == 25 && iter%3 != 2:
						a.split(8)
					case g == 4:
						// The hot path's way: the inlined try first.
						n := 1 + int64(i%3)
						w := a.Spender()
						if _, ok := w.TrySpend(n); ok {
							spent.Add(n)
							spends.Add(1)
						} else if _, ok := a.SpendLeftShared(n); ok {
							spent.Add(n)
							spends.Add(1)
						}
					default:
						if _, ok := a.SpendLeftShared(1 + int64(i%3)); ok {
							spent.Add(1 + int64(i%3))
							spends.Add(1)
						}
					}
				}
			})
		}
		if iter%4 == 1 { // retired mid-run
			wg.Go(func() { back.Add(a.Retire()) })
		}
		wg.Wait()
		back.Add(a.Retire())
		taken.Add(a.TakeSpends())
		if spent.Load()+back.Load() != added.Load() {
			t.Fatalf("iteration %d: spent %d + handed back %d != added %d", iter, spent.Load(), back.Load(), added.Load())
		}
		if taken.Load() != spends.Load() {
			t.Fatalf("iteration %d: TakeSpends returned %d in all, want the %d counted spends", iter, taken.Load(), spends.Load())
		}
	}
}

// TestSpender: the hot path's spend (Spender, Word.TrySpend, Besides) is
// SpendLeftShared's when nothing is in its way, and fails, taking nothing,
// when something is: too little, a count to carry, a retired allowance.
func TestSpender(t *testing.T) {
	var a Allowance
	a.Add(100)
	w := a.Spender()
	if w != &a.word || a.Besides(w) != 0 {
		t.Fatal("an allowance not striped spends from a stripe")
	}
	if left, ok := w.TrySpend(30); !ok || left != 70 || a.Load() != 70 {
		t.Fatalf("TrySpend(30) of 100 = %d, %v, Load %d; want 70, true, 70", left, ok, a.Load())
	}
	if _, ok := w.TrySpend(71); ok || a.Load() != 70 {
		t.Fatal("TrySpend(71) of 70 succeeded or took something")
	}
	// The count field holds 1023 spends; the next one carries.
	a.Add(2000)
	for range 1022 {
		if _, ok := a.Spender().TrySpend(1); !ok {
			t.Fatal("a spend under the count's bound failed")
		}
	}
	if _, ok := a.Spender().TrySpend(1); ok {
		t.Fatal("TrySpend made a spend whose count carries")
	}
	if _, ok := a.SpendLeftShared(1); !ok {
		t.Fatal("SpendLeftShared failed the spend TrySpend left to it")
	}
	if got := a.TakeSpends(); got != 1+1022+1 {
		t.Fatalf("TakeSpends = %d, want %d", got, 1+1022+1)
	}
	// Striped: the spender is the caller's stripe, and what the spend
	// leaves counts the word's tokens besides the stripe's.
	a.split(8)
	st := a.st.Load()
	for i := range st.s { // every stripe holds some: whichever the caller picks
		st.s[i].w.add(a.word.takeUpTo(50))
	}
	before := a.Load()
	w = a.Spender()
	if w == &a.word {
		t.Fatal("a striped allowance spends from its word")
	}
	if left, ok := w.TrySpend(5); !ok || left != 45 || a.Besides(w) != a.word.load() || a.Load() != before-5 {
		t.Fatalf("TrySpend(5) from a stripe of 50 = %d, %v, Besides %d, Load %d; want 45, true, %d, %d", left, ok, a.Besides(w), a.Load(), a.word.load(), before-5)
	}
	a.Retire()
	if _, ok := a.Spender().TrySpend(1); ok {
		t.Fatal("TrySpend spent from a retired allowance")
	}
}

// TestUnstripe: an allowance that lets its stripes go keeps what they held
// and the spends they counted, in its word, and spends on from it; it
// splits again once its spends contend.
func TestUnstripe(t *testing.T) {
	var a Allowance
	a.Add(100 * Micro)
	a.split(8)
	for range 10 {
		if _, ok := a.SpendLeftShared(Micro); !ok {
			t.Fatal("a spend from the stripes failed")
		}
	}
	st := a.st.Load()
	var striped int64
	for i := range st.s {
		striped += st.s[i].w.load()
	}
	if striped == 0 {
		t.Fatal("the stripes hold nothing: the test does not test letting them go")
	}
	a.Unstripe()
	if a.st.Load() != nil {
		t.Fatal("still striped after Unstripe")
	}
	if got := a.Load(); got != 90*Micro {
		t.Fatalf("holds %d after Unstripe, want %d", got, 90*Micro)
	}
	if got := a.word.load(); got != 90*Micro {
		t.Fatalf("the word holds %d, want all %d", got, 90*Micro)
	}
	if _, ok := a.SpendLeftShared(Micro); !ok {
		t.Fatal("a spend after Unstripe failed")
	}
	if got := a.TakeSpends(); got != 11 {
		t.Fatalf("TakeSpends = %d, want the 11 spends", got)
	}
	a.Unstripe() // nothing to let go: a no-op
	if got := a.Retire(); got != 89*Micro {
		t.Fatalf("Retire returned %d, want %d", got, 89*Micro)
	}
}
