package reconcile

import (
	"slices"
	"time"
)

// window is how many batches of one node may be on their way at once (see
// batcher), set by what the node's batches measure, as a delay-based TCP
// congestion control (Vegas, BBR) sets its window by the round trips it
// sees. The least round trip of late is the path: the network and a call's
// fixed costs. What a batch takes beyond it is Redis running the batch and
// queueing, at Redis or for the machine's cores. While the path is most
// of the round trip (Redis across a network), a batch is on the wire long
// before Redis needs the next, and the window opens so that a request that
// comes meanwhile leaves within a fraction of a round trip, rather than
// wait for a batch on its way to come back before its own can leave. While
// the rest is most of it (a busy Redis on loopback), another batch would
// only queue at Redis and split the batches, each call costing Redis and
// the process their overhead: the window stays at its floor and batches
// stay as large as the load makes them.
//
// So the window is about 1/(1 - base/rtt) batches: the round trip over its
// part that is not path (1 at loopback's 30µs against a busy batch's
// hundreds, 8 and more at 1ms against a few dozen µs), where rtt is the
// median of the last recentSamples batches' round trips: a stall of the
// machine's scheduler or the network's jitter delays some batches by many
// times the rest, and a window sized by their mean would close for them,
// while queueing at Redis delays most. (Not their least, as Vegas takes:
// a batch of one key is fast because Redis has little to do for it, and
// the least would open the window on a busy Redis.) With
//   - a floor of two for an instance alone, one in a fleet (floor): alone
//     on a busy Redis, a second batch gets its turn while the first's
//     replies are read, and in a fleet the other instances' batches fill
//     that time;
//   - a ceiling of a third of the requests outstanding (waiting or on
//     their way), so that a batch carries about three on average and
//     batching still saves Redis calls where requests meet; but both of
//     two: one batch for two requests saves no call, as each leaves while
//     the other's is on its way (a caller that sent its own batch hands
//     the next to a flusher when it is back) and they take turns, each
//     waiting a round trip more;
//   - and maxWindow.
//
// It opens by one batch a batch back and closes at once. The fields are
// under the batcher's mu.
type window struct {
	size int // batches that may be on their way; 0 until the first batch back: floor
	// base is the least round trip of the current epoch and the last one
	// (a windowed minimum: a path that got longer is followed within two
	// epochs, a shorter one at once); least is the current epoch's, last
	// the one before, the current begun at epoch (clock readings).
	base, least, last time.Duration
	epoch             time.Duration
	srtt              time.Duration                // smoothed round trip, 0 before the first
	recent            [recentSamples]time.Duration // the last round trips, a ring
	samples           int                          // round trips noted in all
	load              int                          // smoothed requests outstanding when a batch is back, in 1/16ths
	wire              int                          // requests on their way now
}

// maxWindow is the most batches of one node that may be on their way at
// once: enough for a 5ms round trip to leave a request waiting about a
// sixteenth of it, and the number of the node's flushers at most. At 1ms,
// four to six brought the long tail of one instance x 32 goroutines to the
// auto-pipelined redis_rate's decisions a second.
const maxWindow = 8

// recentSamples is how many of the last batches' round trips the window
// is sized by: a few round trips' worth at the windows a network opens.
const recentSamples = 16

// minEpoch is how long a least round trip stands as the path's before a
// later epoch's replaces it.
const minEpoch = 10 * time.Second

// allows reports whether another batch may leave with flights on their
// way, for an instance alone in its fleet or not.
func (w *window) allows(flights int, alone bool) bool {
	return flights < max(w.size, floor(alone))
}

// demand is the ceiling the requests outstanding put on the window: a
// third of them, or both of two; one at least. Their average is rounded,
// not truncated: two requests that take turns are counted one now and then
// (when a batch is back while the other is between its asks), and an
// average of 1.9 is two, whose window of one would have them wait a round
// trip each (hybridbench's long tail at 4 x 2 and 16 x 2 across 5 ms: 0.53x
// the peers' decisions a second, and 1.0x rounded).
func (w *window) demand() int {
	out := (w.load + 8) >> 4
	if out <= 2 {
		return max(out, 1)
	}
	return max(out/3, 1)
}

// floor is the window's least size: two for an instance alone, one in a
// fleet. In a fleet the other instances' batches keep a busy Redis busy,
// and a second flight of each would only split the batches: the long tail
// at 8 instances x 8 goroutines on loopback ran 15 to 20% faster with one
// than with two (hybridbench -passes 3 -keys 50000 -instances 8 -workers 8
// -rate 10 -burst 20), 4 x 8 as fast for 9% less of Redis's CPU; an
// instance alone x 32 ran 5 to 20% slower with one.
func floor(alone bool) int {
	if alone {
		return 2
	}
	return 1
}

// sent notes a batch of n requests leaving.
func (w *window) sent(n int) { w.wire += n }

// failed notes a batch of n requests back without a reply: it says
// nothing of the path.
func (w *window) failed(n int) { w.wire -= n }

// back notes a batch of n requests back after rtt, at clock reading now,
// with queued requests waiting for a batch, and sizes the window anew.
// The requests outstanding are counted now, before the batch's callers
// are answered, not when a batch leaves: two requests that take turns are
// one on its way and one waiting when a batch is back, but one alone on
// its way whenever a batch leaves; and a caller answered already might ask
// again before it is counted, and be counted twice, waiting and on its
// way (two requests counted three, whose third is one).
func (w *window) back(n, queued int, rtt, now time.Duration, alone bool) {
	out := (w.wire + queued) << 4
	if w.load == 0 {
		w.load = out
	} else {
		w.load += (out - w.load) / 8
	}
	w.wire -= n
	if rtt <= 0 {
		rtt = 1
	}
	if w.least == 0 || rtt < w.least {
		w.least = rtt
	}
	if now-w.epoch >= minEpoch {
		w.last, w.least, w.epoch = w.least, rtt, now
	}
	w.base = w.least
	if w.last > 0 && w.last < w.base {
		w.base = w.last
	}
	if w.srtt == 0 {
		w.srtt = rtt
	} else {
		w.srtt += (rtt - w.srtt) / 8
	}
	w.recent[w.samples%recentSamples] = rtt
	w.samples++
	mid := w.median()
	want := maxWindow
	if rest := mid - w.base; rest > 0 {
		want = min(int(mid/rest), maxWindow)
	}
	want = min(want, w.demand())
	want = max(want, floor(alone))
	switch {
	case w.size == 0 || want < w.size:
		w.size = want
	case want > w.size:
		w.size++
	}
}

// median returns the median of the round trips in recent (the upper one of
// an even count).
func (w *window) median() time.Duration {
	var buf [recentSamples]time.Duration
	r := buf[:min(w.samples, recentSamples)]
	copy(r, w.recent[:len(r)])
	slices.Sort(r)
	return r[len(r)/2]
}
