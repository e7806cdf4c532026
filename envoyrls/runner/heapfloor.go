package runner

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// The heap floor. The service's live heap is small (a few MiB: its
// buckets, its configuration, gRPC's buffers), while each call allocates
// gRPC's and protobuf's few kilobytes (4.8 KB and 74 allocations a hot
// decision). With GOGC's 100 the collector then runs whenever the heap has
// grown by about the live heap: under a hot descriptor's load, sixty times
// a second, each marking the whole live heap (envoyrls/bench, the
// service's /metrics). A heap floor lets the heap grow to the floor before
// a collection while the live heap is small, and is GOGC's 100 once that
// reaches the floor: the collector's target is the floor or what GOGC=100
// makes it, whichever is more, and so is the heap's size.
//
// The floor is small on purpose: a heap about the size of the processor's
// cache keeps the memory the calls allocate in it. Under a hot
// descriptor's load (envoyrls/bench, this build against the one before
// it, 3 repeats each), a target of 16, 24 and 32 MiB took the service's
// CPU a decision from 26.9-32.3 µs to 18.5-24.2, and its decisions a second up
// 1.21x, 1.26x and 1.31x; a target of about 130 MB gave 0.99x, no better
// than none, and the process's resident memory 250-290 MB.
//
// It sets GOGC (debug.SetGCPercent) after each collection from the live
// heap that collection found, through a cleanup of an object made
// unreachable for it: no goroutine of its own, and nothing on the calls'
// path. A process whose GOGC is set in its environment keeps it: FromEnv
// leaves the floor at 0 then.

// DefaultHeapFloor is the heap floor hybrid-rls starts with when GOGC is
// not set: 32 MiB.
const DefaultHeapFloor = 32 << 20

// basePercent is GOGC's default, which the floor never goes below and
// which stop restores.
const basePercent = 100

// minLive is the least live heap the floor computes with: a collection
// that found less (at start) is taken as this much.
const minLive = 1 << 20

// heapFloor keeps the collector's target at floor bytes or more.
type heapFloor struct {
	floor uint64
	// mu orders the settings of GOGC and stop: a cleanup that read
	// stopped false sets its percent before stop restores the base.
	mu      sync.Mutex
	stopped bool
	percent int               // GOGC as last set
	sample  []metrics.Sample  // the live heap, the target, GOGC
	tuned   func(percent int) // called after each setting, for tests; nil: none
}

// StartHeapFloor keeps the garbage collector from running before the heap
// reaches floor bytes while GOGC=100 would run it sooner, by setting GOGC
// after each collection; stop ends it and restores GOGC to 100. A
// floor of 0 or less does nothing. Start at most one per process: GOGC is
// the process's.
func StartHeapFloor(floor int64) (stop func()) {
	if floor <= 0 {
		return func() {}
	}
	h := newHeapFloor(uint64(floor))
	h.tune()
	h.arm()
	return h.stop
}

// newHeapFloor returns a floor that has not set GOGC yet.
func newHeapFloor(floor uint64) *heapFloor {
	return &heapFloor{
		floor:   floor,
		percent: basePercent,
		sample: []metrics.Sample{
			{Name: "/gc/heap/live:bytes"},
			{Name: "/gc/heap/goal:bytes"},
			{Name: "/gc/gogc:percent"},
		},
	}
}

// sentinel is the object whose cleanup runs after each collection. It
// holds a pointer so that it is not placed in a tiny block with others,
// whose cleanups would wait for all of them.
type sentinel struct{ _ *byte }

// arm makes an object that the next collection finds unreachable, whose
// cleanup tunes GOGC and arms the next.
func (h *heapFloor) arm() {
	runtime.AddCleanup(new(sentinel), (*heapFloor).collected, h)
}

// collected runs after a collection, on the runtime's cleanup goroutine.
func (h *heapFloor) collected() {
	if h.tune() {
		h.arm()
	}
}

// tune sets GOGC for the live heap the last collection found, and reports
// whether the floor still runs.
func (h *heapFloor) tune() bool {
	metrics.Read(h.sample)
	var v [3]uint64
	for i, s := range h.sample {
		if s.Value.Kind() == metrics.KindUint64 {
			v[i] = s.Value.Uint64()
		}
	}
	p := floorPercent(v[0], scanned(v[0], v[1], v[2]), h.floor)
	h.mu.Lock()
	running := !h.stopped
	if running && p != h.percent {
		debug.SetGCPercent(p)
		h.percent = p
	}
	h.mu.Unlock()
	if running && h.tuned != nil {
		h.tuned(p)
	}
	return running
}

// stop ends the floor and restores GOGC's 100; it may be called more than
// once.
func (h *heapFloor) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return
	}
	h.stopped = true
	if h.percent != basePercent {
		debug.SetGCPercent(basePercent)
		h.percent = basePercent
	}
}

// scanned returns what GOGC is a percent of in the collector's target,
// target = live + scanned x GOGC/100: the live heap and the roots (the
// goroutines' stacks and the globals) as the runtime counts them, found
// from the target it set with GOGC percent. 0 where that cannot be told.
func scanned(live, target, percent uint64) uint64 {
	if percent == 0 || target <= live {
		return 0
	}
	return (target - live) * 100 / percent
}

// floorPercent is the GOGC that puts the collector's next target at floor
// for a live heap of live bytes, GOGC being a percent of scan bytes (the
// live heap and the roots: scanned; the live heap alone where that is
// less). 100 at least, which it is once that makes floor or more.
func floorPercent(live, scan, floor uint64) int {
	live = max(live, minLive)
	scan = max(scan, live)
	if floor <= live+scan {
		return basePercent
	}
	if floor-live > math.MaxUint64/100 {
		return math.MaxInt32
	}
	p := (floor - live) * 100 / scan
	return int(min(max(p, basePercent), math.MaxInt32))
}
