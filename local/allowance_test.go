package local

import (
	"sync"
	"sync/atomic"
	"testing"
)

// TestAllowance: an Allowance holds tokens as Tokens does, and counts the
// spends of Spend and SpendLeft (not those of SpendUncounted) through every
// other operation, past the carry of its in-word count, and across Retire.
func TestAllowance(t *testing.T) {
	var a Allowance
	steps := []struct {
		name       string
		do         func() bool // reports whether the step did what it should
		load       int64       // Load after the step
		spends     uint64      // spends counted since the last TakeSpends
		takeSpends bool        // call TakeSpends after the step, expecting spends
	}{
		{"zero", func() bool { return !a.Spend(1) }, 0, 0, false},
		{"Add(10)", func() bool { return a.Add(10) }, 10, 0, false},
		{"Spend(4)", func() bool { return a.Spend(4) }, 6, 1, false},
		{"Spend(7) refused", func() bool { return !a.Spend(7) }, 6, 1, false},
		{"SpendLeft(6)", func() bool { left, ok := a.SpendLeft(6); return ok && left == 0 }, 0, 2, false},
		{"Add(5000)", func() bool { return a.Add(5000) }, 5000, 2, false},
		{"SpendUncounted(100)", func() bool { left, ok := a.SpendUncounted(100); return ok && left == 4900 }, 4900, 2, false},
		{"TakeUpTo(900)", func() bool { return a.TakeUpTo(900) == 900 }, 4000, 2, false},
		{"Update(x2)", func() bool { return a.Update(func(v int64) int64 { return 2 * v }) }, 8000, 2, false},
		{"Set(3000)", func() bool { old, ok := a.Set(3000); return ok && old == 8000 }, 3000, 2, false},
		{"1022 spends: the field is full", func() bool {
			for range 1021 {
				if !a.Spend(1) {
					return false
				}
			}
			return true
		}, 3000 - 1021, 1023, false},
		{"one more: carried", func() bool { return a.Spend(1) }, 3000 - 1022, 1024, false},
		{"and more", func() bool { return a.Spend(2) && a.Spend(3) }, 3000 - 1027, 1026, true},
		{"TakeAll", func() bool { return a.TakeAll() == 3000-1027 }, 0, 0, false},
		{"Add beyond the bound saturates", func() bool { return a.Add(MaxAllowance) && a.Add(5) }, MaxAllowance, 0, false},
		{"Spend at the bound", func() bool { return a.Spend(MaxAllowance) && !a.Spend(1) }, 0, 1, false},
		{"Add(7), Spend(2) x3", func() bool { return a.Add(7) && a.Spend(2) && a.Spend(2) && a.Spend(2) }, 1, 4, false},
		{"Retire", func() bool { return a.Retire() == 1 }, 0, 4, true},
		{"retired", func() bool {
			return a.Retired() && !a.Add(5) && !a.Spend(0) && a.TakeAll() == 0 && a.TakeUpTo(1) == 0 &&
				!a.Update(func(int64) int64 { return 9 }) && a.Retire() == 0
		}, 0, 0, false},
	}
	var counted uint64 // spends taken so far
	for _, s := range steps {
		if !s.do() {
			t.Fatalf("%s: failed", s.name)
		}
		if got := a.Load(); got != s.load {
			t.Fatalf("%s: Load = %d, want %d", s.name, got, s.load)
		}
		if s.takeSpends {
			if got := a.TakeSpends(); got != s.spends {
				t.Fatalf("%s: TakeSpends = %d, want %d", s.name, got, s.spends)
			}
			counted += s.spends
			continue
		}
		// Peek: the count is in the word and in the carry.
		if got := uint64(a.word.v.Load()&spendMask>>spendShift) + a.word.spends.Load(); a.word.v.Load() >= 0 && got != s.spends {
			t.Fatalf("%s: %d spends counted, want %d", s.name, got, s.spends)
		}
	}
	if counted != 1026+4 {
		t.Errorf("%d spends taken in all, want %d", counted, 1026+4)
	}
}

// TestAllowanceConservation spends, adds, takes the spends and retires
// concurrently: every micro-token added is spent or handed back, and every
// counted spend that succeeded is returned by TakeSpends exactly once.
func TestAllowanceConservation(t *testing.T) {
	for iter := range 50 {
		var a Allowance
		var spent, added, back atomic.Int64
		var spends, uncounted, taken atomic.Uint64
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				for i := range 3000 {
					switch {
					case g == 0 && i%3 == 0:
						if a.Add(5) {
							added.Add(5)
						}
					case g == 1 && i%50 == 0:
						back.Add(a.TakeAll())
					case g == 1 && i%7 == 0:
						taken.Add(a.TakeSpends())
					case g == 2 && i%5 == 0:
						if _, ok := a.SpendUncounted(1); ok {
							spent.Add(1)
							uncounted.Add(1)
						}
					default:
						if a.Spend(1) {
							spent.Add(1)
							spends.Add(1)
						}
					}
				}
			})
		}
		if iter%2 == 0 { // else retired at the end, after many carries
			wg.Go(func() { back.Add(a.Retire()) })
		}
		wg.Wait()
		back.Add(a.Retire())
		taken.Add(a.TakeSpends())
		if spent.Load()+back.Load() != added.Load() {
			t.Fatalf("spent %d + handed back %d != added %d", spent.Load(), back.Load(), added.Load())
		}
		if taken.Load() != spends.Load() {
			t.Fatalf("TakeSpends returned %d in all, want the %d counted spends (and not the %d uncounted)", taken.Load(), spends.Load(), uncounted.Load())
		}
	}
}
