package breaker

import (
	"sync"
	"time"
)

// timeouts adapts the deadline of a breaker's calls to the latency of those
// that succeeded, as TCP's retransmission timeout adapts to round trips (RFC
// 6298): a smoothed mean and mean deviation of the latency a call has
// beyond its size's work, and a smoothed work per unit of size, from calls
// of at least unitCalls units (unitPrior until one succeeded). A call of n
// units gets
//
//	max(mean + 4*deviation, floor) + 2*(n-1)*unit
//
// at most ceiling: the floor is the deadline of a call of one unit to a
// fast Redis, and a larger call has the time its work takes on top.
type timeouts struct {
	floor, ceiling time.Duration

	mu    sync.Mutex
	seen  bool          // a call succeeded
	mean  time.Duration // smoothed latency beyond the work of the call's units
	dev   time.Duration // its smoothed mean deviation
	unit  time.Duration // smoothed work per unit; 0: unitPrior
	cache time.Duration // the timeout of a call of one unit, for the common case
}

// unitCalls is the fewest units a call must carry to teach the work per
// unit: smaller calls are mostly latency.
const unitCalls = 16

// unitPrior is the work per unit until a call of unitCalls units or more
// has succeeded: a few times what a key of a settlement script costs Redis
// on a busy machine.
const unitPrior = 25 * time.Microsecond

// timeout returns the deadline of a call of n >= 1 units.
func (t *timeouts) timeout(n int) time.Duration {
	if t.floor == t.ceiling {
		return t.floor
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if n == 1 && t.seen {
		return t.cache
	}
	return t.compute(n)
}

// compute is timeout with t.mu held.
func (t *timeouts) compute(n int) time.Duration {
	unit := t.unit
	if unit == 0 {
		unit = unitPrior
	}
	d := max(t.mean+4*t.dev, t.floor) + 2*time.Duration(n-1)*unit
	return min(d, t.ceiling)
}

// observe learns from a call of n >= 1 units that succeeded in d.
func (t *timeouts) observe(n int, d time.Duration) {
	if t.floor == t.ceiling {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if n >= unitCalls {
		u := d / time.Duration(n)
		if t.unit == 0 {
			t.unit = u
		} else {
			t.unit += (u - t.unit) / 8
		}
	}
	unit := t.unit
	if unit == 0 {
		unit = unitPrior
	}
	s := max(d-time.Duration(n)*unit, 0)
	if !t.seen {
		t.seen, t.mean, t.dev = true, s, s/2
	} else {
		diff := t.mean - s
		if diff < 0 {
			diff = -diff
		}
		t.dev += (diff - t.dev) / 4
		t.mean += (s - t.mean) / 8
	}
	t.cache = t.compute(1)
}
