package reconcile

import (
	"math"
	"testing"
)

// TestModeChangeResetsShared: the upper half of a key's flags is a count
// of takers to a lease key and a time to an optimistic one; a change of
// mode resets it, so that neither reads the other's.
func TestModeChangeResetsShared(t *testing.T) {
	lease, err := NewSpec(100, 100, Lease)
	if err != nil {
		t.Fatal(err)
	}
	opt, err := NewSpec(100, 100, Optimistic)
	if err != nil {
		t.Fatal(err)
	}
	const now = 1_800_000_000_000_000 // Redis time of the key's latest reply, µs

	var s State
	s.SetSpec(lease)
	s.lastNow.Store(now)
	s.setTakers(40000) // read as a time, a foreign write 40000*131 ms after the epoch's wrap
	s.flags.Or(flagStarved)
	s.SetSpec(opt)
	if got := s.sinceForeign(now); got != 0 {
		t.Errorf("lease to optimistic: sinceForeign = %v, want 0 (the latest reply counted as another's write)", got)
	}
	if s.flags.Load()&flagStarved == 0 {
		t.Error("lease to optimistic: the lower flags changed")
	}

	s.markForeign(now)
	s.SetSpec(lease)
	if got := s.takers(); got != 0 {
		t.Errorf("optimistic to lease: takers = %d, want 0 (not counted yet)", got)
	}

	var fresh State // no reply yet: nothing to count as another's
	fresh.SetSpec(lease)
	fresh.setTakers(3)
	fresh.SetSpec(opt)
	if got := fresh.sinceForeign(now); got != math.MaxInt64 {
		t.Errorf("lease to optimistic, no reply: sinceForeign = %v, want none", got)
	}

	s.setTakers(5)
	s.SetSpec(lease) // the same mode: kept
	if got := s.takers(); got != 5 {
		t.Errorf("a change within a mode: takers = %d, want 5", got)
	}
}
