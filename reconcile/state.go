package reconcile

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/hybridlimit/hybrid/local"
)

// Mode is how a key's consumption is settled with Redis.
type Mode uint8

// The settlement modes.
const (
	// Lease reserves allowance in Redis before it is spent here, so the
	// fleet never admits more than the global bucket holds.
	Lease Mode = iota
	// Optimistic spends a local budget first and charges Redis at the next
	// round: no wait on a cold key, a bounded overshoot.
	Optimistic
	// Exact asks Redis for every decision: one script call each.
	Exact
)

// String returns "lease", "optimistic" or "exact".
func (m Mode) String() string {
	switch m {
	case Lease:
		return "lease"
	case Optimistic:
		return "optimistic"
	case Exact:
		return "exact"
	}
	return fmt.Sprintf("reconcile.Mode(%d)", m)
}

// Spec is a key's limit as it is settled: the bucket in micro-tokens and the
// mode. Specs are immutable once made; the owner interns them so that an
// unchanged limit is the same pointer.
type Spec struct {
	Limit local.Limit
	Mode  Mode
	// Rate is the rate as the caller gave it, in tokens per second, before
	// rounding to micro-tokens: what a caller's limit is compared with.
	Rate float64

	nsPerMicro float64 // the time one micro-token takes to refill
}

// Duration estimates how long the bucket takes to refill n micro-tokens, with
// a float multiplication rather than the exact integer division of
// local.Bucket.RetryAfter: for the estimates of a Result.
func (sp *Spec) Duration(n int64) time.Duration {
	if n <= 0 {
		return 0
	}
	return time.Duration(float64(n)*sp.nsPerMicro + 0.5)
}

// NewSpec validates a limit of rate tokens per second and burst tokens and
// returns its spec in mode m.
func NewSpec(rate float64, burst int64, m Mode) (*Spec, error) {
	if m > Exact {
		return nil, fmt.Errorf("%w: mode %v", local.ErrInvalidLimit, m)
	}
	lim, err := local.NewLimit(rate, burst)
	if err != nil {
		return nil, err
	}
	return &Spec{Limit: lim, Mode: m, Rate: rate, nsPerMicro: 1e9 / float64(lim.Rate)}, nil
}

// Is reports whether sp is the spec of rate, burst and m.
func (sp *Spec) Is(rate float64, burst int64, m Mode) bool {
	return sp.Rate == rate && sp.Limit.Burst == burst*local.Micro && sp.Mode == m
}

// Entry is a shadow bucket with the reconciler's state.
type Entry = local.Entry[State]

// State is the reconciler's part of a shadow bucket. The zero State has no
// spec; the owner sets one with SetSpec before the entry is used.
type State struct {
	spec   atomic.Pointer[Spec]
	target atomic.Uint32 // lease: whole tokens of allowance to keep; 0 until first sized
	flags  atomic.Uint32 // the flags below; the upper half, see markForeign
	// lastNow is the Redis time, in microseconds, of this instance's
	// latest reply for the key (0: none yet); the tokens it left in the
	// bucket are the entry's view (see observe).
	lastNow atomic.Int64
}

// Flags of State.
const (
	flagStarved   uint32 = 1 << iota // a spend failed since the last round
	flagQueued                       // in the next round's batch already
	flagSetting                      // a spec change is under way
	flagSettling                     // a round's settlement is in flight
	flagFirst                        // the entry's first request is being decided (Trust)
	flagFirstDone                    // and was
	flagCharging                     // an optimistic key's consumption is being charged, by a round or a fetch
	flagIdle                         // a round took the key's lease back, untouched: its next fetch is no starvation
	flagFetching                     // a fetch of the key is on its way
	flagAlone                        // nobody else wrote the key's bucket between this instance's calls lately (see Askers)
	flagDoubt                        // and the last reply said otherwise, once
	flagAwaiting                     // a fetch of the key waits for a round charging it (see awaitCharge)
	flagPrepaid                      // the key's side may hold a prepaid grant (see sides)
	flagUntouched                    // a round found the key untouched and kept its lease (see settlement)
	flagReserved                     // the key's side may hold a turn taken ahead (see Reserve)
	flagDemand                       // the key's side may hold what requests waiting for its fetch need (see AddDemand)
)

// LockSpec serialises changes of the key's spec: whoever changes it adjusts
// what the entry holds first and publishes the spec with SetSpec last, under
// LockSpec. It spins (yielding) while another change is under way; changes
// are rare and short.
func (s *State) LockSpec() {
	for s.flags.Or(flagSetting)&flagSetting != 0 {
		runtime.Gosched()
	}
}

// UnlockSpec ends a change begun with LockSpec.
func (s *State) UnlockSpec() { s.flags.And(^flagSetting) }

// Spec returns the key's spec, nil before SetSpec.
func (s *State) Spec() *Spec { return s.spec.Load() }

// SetSpec sets the key's spec; a changed limit takes effect at once. A
// change of mode first resets the upper half of the flags, which means one
// thing to a lease key and another to an optimistic one (see takers and
// markForeign), so that the new mode never reads the old one's: a lease
// key's count of takers starts over (the live count until a reply counts
// them), and an optimistic key counts the key's latest reply as one that
// found another instance's write, so that it takes itself for alone on the
// key only after a quiet spell of its own (see observe).
func (s *State) SetSpec(sp *Spec) {
	if old := s.spec.Load(); old != nil && sp != nil && old.Mode != sp.Mode {
		s.resetShared(sp.Mode)
	}
	s.spec.Store(sp)
}

// resetShared resets the upper half of the flags for a key of mode m.
func (s *State) resetShared(m Mode) {
	if last := s.lastNow.Load(); m == Optimistic && last > 0 {
		s.markForeign(last)
		return
	}
	for {
		old := s.flags.Load()
		if old>>foreignShift == 0 || s.flags.CompareAndSwap(old, old&(1<<foreignShift-1)) {
			return
		}
	}
}

// starve records that a spend failed, and reports whether this is the
// first since the last round.
func (s *State) starve() bool {
	if s.flags.Load()&flagStarved != 0 {
		return false // already: no write, so a hot key's spends do not contend on it
	}
	return s.flags.Or(flagStarved)&flagStarved == 0
}

// clearStarved clears the starved flag and reports whether it was set.
func (s *State) clearStarved() bool { return s.flags.And(^flagStarved)&flagStarved != 0 }

// settling reports whether a round's settlement of the key is in flight.
func (s *State) settling() bool { return s.flags.Load()&flagSettling != 0 }

// setSettling and clearSettling mark a round's settlement of the key sent,
// and its reply handled.
func (s *State) setSettling()   { s.flags.Or(flagSettling) }
func (s *State) clearSettling() { s.flags.And(^flagSettling) }

// claimFirst reports whether this is the first call of claimFirst for the
// entry.
func (s *State) claimFirst() bool { return s.flags.Or(flagFirst)&flagFirst == 0 }

// firstDone records that the entry's first request was decided.
func (s *State) firstDone() { s.flags.Or(flagFirstDone) }

// firstPending reports whether the entry's first request is being decided.
func (s *State) firstPending() bool {
	return s.flags.Load()&(flagFirst|flagFirstDone) == flagFirst
}

// setQueued sets the queued flag and reports whether it was clear.
func (s *State) setQueued() bool { return s.flags.Or(flagQueued)&flagQueued == 0 }

// clearQueued clears the queued flag.
func (s *State) clearQueued() { s.flags.And(^flagQueued) }

// claimCharge claims the charging of an optimistic key's consumption, and
// reports whether it was free: one settlement at a time charges a key (see
// Reconciler.fetch), so that none is answered from a bucket that another's
// charge, sent and not applied, has yet to reach.
func (s *State) claimCharge() bool { return s.flags.Or(flagCharging)&flagCharging == 0 }

// roundCharging reports whether a round holds the claim of claimCharge: the
// key's charge is claimed, and not by a fetch (none on its way, or the one
// on its way waits for the claim). A fetch about to wait is not seen.
func (s *State) roundCharging() bool {
	f := s.flags.Load()
	return f&flagCharging != 0 && (f&flagFetching == 0 || f&flagAwaiting != 0)
}

// releaseCharge ends a claim of claimCharge.
func (s *State) releaseCharge() { s.flags.And(^flagCharging) }

// markUntouched records that a round found the key untouched and reports
// whether this is the first such round since it was touched (see
// settlement).
func (s *State) markUntouched() bool { return s.flags.Or(flagUntouched)&flagUntouched == 0 }

// clearUntouched clears the untouched flag; no write when it is clear, so
// that a hot key's rounds do not contend on it.
func (s *State) clearUntouched() {
	if s.flags.Load()&flagUntouched != 0 {
		s.flags.And(^flagUntouched)
	}
}

// setIdle records that a round took the key's whole lease back because the
// key was not touched since the last round.
func (s *State) setIdle() { s.flags.Or(flagIdle) }

// clearIdle clears the idle flag and reports whether it was set.
func (s *State) clearIdle() bool {
	if s.flags.Load()&flagIdle == 0 {
		return false // no write on a hot key's fetches
	}
	return s.flags.And(^flagIdle)&flagIdle != 0
}
