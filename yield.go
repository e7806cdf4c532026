package hybrid

import (
	"runtime"
	"time"

	"github.com/hybridlimit/hybrid/reconcile"
)

// yield gives up the processor (runtime.Gosched), at a denial answered here
// at now, once per yieldGap of this Limiter's denials, while a round trip
// to Redis is under way in the process (reconcile.Busy).
//
// Callers that ask again at once, in a loop, would otherwise keep every
// core busy with denials, and the goroutine whose reply ends the denial (a
// settlement round's, a fetch's, another Limiter's) would wait for the
// scheduler to preempt them: on saturated cores, past its call timeout, so
// that a healthy Redis looked down (round trips of 0.3 to 1.4 s were
// measured so). A yield sends one spinning caller to the back of the run
// queue, where the goroutines that Redis's replies woke wait, and the next
// yield comes soon after: those run within a few milliseconds. Spaced so,
// the yields cost the denials nothing that a benchmark shows.
func (l *Limiter) yield(now time.Duration) {
	last := l.lastYield.Load()
	if now-time.Duration(last) >= yieldGap && reconcile.Busy() && l.lastYield.CompareAndSwap(last, int64(now)) {
		runtime.Gosched()
	}
}

// yieldGap is the least time between two yields of a Limiter's denials.
const yieldGap = 250 * time.Microsecond
