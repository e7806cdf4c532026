package local

import (
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/time/rate"
)

// The benchmarks put a known key's allowance spend (the lease-mode hot path:
// a lock-free lookup and an atomic compare-and-swap, no clock) next to
// golang.org/x/time/rate's Allow in the same run. With many keys the
// x/time/rate side is a sync.Map of *rate.Limiter, the usual way to key it.
// Compare with: go test -run '^$' -bench Allow -count 6 ./local/ | benchstat -col /impl -

const benchGrant = 1 << 60 // micro-tokens: an allowance no benchmark runs out of

func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(i)
	}
	return keys
}

// benchSeq is the order keys are asked for: 1<<20 indices, uniform or Zipf.
func benchSeq(n int, zipf bool) []int32 {
	rng := rand.New(rand.NewPCG(1, 1))
	z := rand.NewZipf(rng, 1.1, 1, uint64(n-1))
	seq := make([]int32, 1<<20)
	for i := range seq {
		if zipf {
			seq[i] = int32(z.Uint64())
		} else {
			seq[i] = int32(rng.IntN(n))
		}
	}
	return seq
}

func BenchmarkAllow(b *testing.B) {
	cases := []struct {
		name string
		keys int
		zipf bool
	}{
		{"keys=1", 1, false},
		{"keys=1e3", 1000, false},
		{"keys=1e6/uniform", 1_000_000, false},
		{"keys=1e6/zipf", 1_000_000, true},
	}
	for _, c := range cases {
		keys := benchKeys(c.keys)
		seq := benchSeq(c.keys, c.zipf)
		s, err := New[none](Config[none]{Capacity: c.keys})
		if err != nil {
			b.Fatal(err)
		}
		for _, k := range keys {
			e, _ := s.GetOrAdd(k)
			e.Allowance.Add(benchGrant)
		}
		var m sync.Map
		for _, k := range keys {
			m.Store(k, rate.NewLimiter(1e12, 1<<30)) // finite, so Allow does its arithmetic
		}
		one, _ := m.Load(keys[0])
		for _, par := range []bool{false, true} {
			name := c.name + "/par=" + strconv.FormatBool(par)
			b.Run(name+"/impl=hybrid", func(b *testing.B) {
				run(b, par, func(i int) bool {
					return s.Get(keys[seq[i&(len(seq)-1)]]).Allowance.Spend(Micro)
				})
			})
			b.Run(name+"/impl=xrate", func(b *testing.B) {
				if c.keys == 1 { // x/time/rate's own Allow, no lookup
					l := one.(*rate.Limiter)
					run(b, par, func(int) bool { return l.Allow() })
					return
				}
				run(b, par, func(i int) bool {
					v, _ := m.Load(keys[seq[i&(len(seq)-1)]])
					return v.(*rate.Limiter).Allow()
				})
			})
		}
	}
}

// run calls f b.N times, serially or from parallel goroutines, with a running
// index, and fails the benchmark if f ever denies.
func run(b *testing.B, parallel bool, f func(i int) bool) {
	b.ReportAllocs()
	var denied atomic.Bool
	if !parallel {
		i := 0
		for b.Loop() {
			if !f(i) {
				denied.Store(true)
			}
			i++
		}
	} else {
		var next atomic.Int64
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			i := int(next.Add(1) << 16)
			for pb.Next() {
				if !f(i) {
					denied.Store(true)
				}
				i++
			}
		})
	}
	if denied.Load() {
		b.Fatal("a benchmark decision was a denial: it measured the wrong path")
	}
}

// BenchmarkStoreMemory tracks 1e6 keys and reports the heap they take per key:
// the entry, its key, the lookup table and the recency list together.
func BenchmarkStoreMemory(b *testing.B) {
	for b.Loop() {
		perKey := storeBytesPerKey(b, 1_000_000)
		b.ReportMetric(perKey, "B/key")
	}
}

// storeBytesPerKey fills a store with n keys ("user:<i>") and returns the
// live heap growth per key, measured with runtime.MemStats after GCs.
func storeBytesPerKey(tb testing.TB, n int) float64 {
	keys := benchKeys(n) // made before the first reading: the caller's strings
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s, err := New[none](Config[none]{Capacity: n})
	if err != nil {
		tb.Fatal(err)
	}
	for _, k := range keys {
		s.GetOrAdd(k)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if s.Len() != n {
		tb.Fatalf("store holds %d keys, want %d", s.Len(), n)
	}
	runtime.KeepAlive(keys)
	runtime.KeepAlive(s)
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
}

// TestStoreMemoryPerKey holds the store to its documented bound of 256 bytes
// per tracked key, over 1e6 keys. The race detector changes allocation sizes,
// and the short mode skips the 1e6 keys.
func TestStoreMemoryPerKey(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("1e6 keys; not under -short or -race")
	}
	const bound = 256
	if got := storeBytesPerKey(t, 1_000_000); got > bound {
		t.Fatalf("store takes %.1f bytes per key, more than %d", got, bound)
	} else {
		t.Logf("%.1f bytes per key", got)
	}
}
