package runner

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
)

// TestFloorPercent: GOGC puts the next target, live + scan x GOGC/100,
// at the floor while GOGC=100 would put it lower, and is 100 after.
func TestFloorPercent(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		live, scan, floor uint64
		want              int
	}{
		{4 * mib, 4 * mib, 64 * mib, 1500}, // 4 + 4 x 15 = 64
		{4 * mib, 8 * mib, 64 * mib, 750},  // 4 + 8 x 7.5 = 64
		{2 * mib, 4 * mib, 16 * mib, 350},  // 2 + 4 x 3.5 = 16
		{4 * mib, 0, 64 * mib, 1500},       // no scan told: the live heap
		{16 * mib, 16 * mib, 64 * mib, 300},
		{32 * mib, 32 * mib, 64 * mib, 100}, // GOGC=100's own target is the floor
		{28 * mib, 36 * mib, 64 * mib, 100}, // 28 + 36 = 64
		{33 * mib, 33 * mib, 64 * mib, 100},
		{1 << 40, 1 << 40, 64 * mib, 100},
		{0, 0, 64 * mib, 6300}, // at start: taken as minLive, 1 MiB
		{mib / 2, 0, 64 * mib, 6300},
		{mib, mib, 1 << 62, math.MaxInt32},       // bounded
		{mib, mib, math.MaxInt64, math.MaxInt32}, // and no overflow
	} {
		if got := floorPercent(c.live, c.scan, c.floor); got != c.want {
			t.Errorf("floorPercent(%d, %d, %d) = %d, want %d", c.live, c.scan, c.floor, got, c.want)
		}
	}
}

// TestScanned: what GOGC is a percent of, from the target it made.
func TestScanned(t *testing.T) {
	for _, c := range []struct {
		live, target, percent, want uint64
	}{
		{4 << 20, 12 << 20, 100, 8 << 20}, // 4 + 8 x 1
		{2 << 20, 26 << 20, 600, 4 << 20}, // 2 + 4 x 6
		{4 << 20, 4 << 20, 100, 0},        // no room: not told
		{4 << 20, 12 << 20, 0, 0},         // GOGC off: not told
	} {
		if got := scanned(c.live, c.target, c.percent); got != c.want {
			t.Errorf("scanned(%d, %d, %d) = %d, want %d", c.live, c.target, c.percent, got, c.want)
		}
	}
}

// gogc reads GOGC as the runtime has it.
func gogc() int64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// TestHeapFloor: started, the floor sets GOGC for the live heap and again
// after each collection, by the cleanup it arms; stopped, it restores 100
// and sets nothing more.
func TestHeapFloor(t *testing.T) {
	before := gogc()
	t.Cleanup(func() { debug.SetGCPercent(int(before)) })

	h := newHeapFloor(1 << 40) // far above any live heap: GOGC well above 100
	tuned := make(chan int, 1)
	h.tuned = func(p int) {
		select {
		case tuned <- p:
		default:
		}
	}
	h.tune()
	if p := <-tuned; p <= basePercent || gogc() != int64(p) {
		t.Fatalf("after the first tuning: percent %d, GOGC %d; want them equal and above %d", p, gogc(), basePercent)
	}
	h.arm()
	// The cleanup runs after a collection, on the runtime's goroutine:
	// collect until it has, a bounded number of times.
	ran := false
	for i := 0; i < 1000 && !ran; i++ {
		runtime.GC()
		select {
		case <-tuned:
			ran = true
		default:
			runtime.Gosched()
		}
	}
	if !ran {
		t.Fatal("no tuning after 1000 collections: the cleanup did not run")
	}

	h.stop()
	h.stop() // again: nothing more
	if got := gogc(); got != basePercent {
		t.Errorf("after stop: GOGC %d, want %d", got, basePercent)
	}
	if h.tune() {
		t.Error("tune after stop reports the floor running")
	}
	if got := gogc(); got != basePercent {
		t.Errorf("a tuning after stop set GOGC %d", got)
	}
}

// TestStartHeapFloorNone: a floor of 0 sets nothing.
func TestStartHeapFloorNone(t *testing.T) {
	before := gogc()
	StartHeapFloor(0)()
	if got := gogc(); got != before {
		t.Errorf("StartHeapFloor(0) changed GOGC from %d to %d", before, got)
	}
}
