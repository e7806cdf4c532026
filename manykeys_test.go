package hybrid_test

import (
	"context"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// maxBytesPerKey bounds the heap a Limiter holds per tracked key, all told
// (entry, key, lookup table, recency list, settlement state), for short
// keys. docs/design.md quotes the measured figure.
const maxBytesPerKey = 1024

// TestManyKeys drives one Limiter with the default Config (MaxKeys 100,000)
// through 1,000,000 distinct keys, each asked for once in optimistic mode
// with a cost of 1 to 3 tokens, on a real redis-server:
//
//   - the store stays at MaxKeys and evicts the rest;
//   - the heap it holds stays within maxBytesPerKey per tracked key;
//   - every eviction's pending consumption is settled: after Close each of
//     the million buckets in Redis was charged exactly its key's cost.
func TestManyKeys(t *testing.T) {
	const (
		keys    = 1_000_000
		workers = 4
		maxKeys = 100_000 // the default Config.MaxKeys
	)
	if os.Getenv("HYBRID_HEAPPROFILE") != "" {
		defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
		runtime.MemProfileRate = 4096 // a sample every 4 KiB, not 512
	}
	if testing.Short() {
		t.Skip("a million keys: not in -short")
	}
	if raceEnabled {
		// It would take minutes, measure the race detector's memory rather
		// than the Limiter's, and leave the detector's state so large that
		// the real-time tests after it in the same process time out
		// (TestIntegrationWarmManyKeys did, before and after this change).
		// .ci/run runs it on its own, without -race.
		t.Skip("a million keys: run without -race (.ci/run does)")
	}
	proc := redistest.Server(t)
	if !proc.Owned() {
		t.Skip("REDIS_ADDR names a shared server: this test writes a million keys")
	}
	// Generous timeouts: this test is about memory and accounting, and a
	// settlement that timed out after Redis applied it would be charged
	// twice (see docs/accuracy.md), which is not what it checks.
	rdb := loadClient(proc.Addr(), 5*time.Second, nil)
	defer rdb.Close()
	// Burst 10, and a refill of one micro-token a second: a bucket's
	// tokens after the test say exactly what it was charged.
	lim := hybrid.Limit{Rate: 1e-6, Burst: 10, Mode: hybrid.Optimistic}
	cost := func(k int) int64 { return 1 + int64(k%3) }
	name := func(k int) string { return "many:" + strconv.Itoa(k) }

	base := heapInuse()
	l, err := hybrid.New(rdb, hybrid.Config{Breaker: breaker.Config{CallTimeout: 5 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())

	start := time.Now()
	var next atomic.Int64
	var denied, fallback atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for k := int(next.Add(1) - 1); k < keys; k = int(next.Add(1) - 1) {
				res, err := l.AllowN(t.Context(), name(k), lim, cost(k))
				if err != nil {
					t.Errorf("AllowN(%s) = %v", name(k), err)
					return
				}
				if !res.Allowed {
					denied.Add(1)
				}
				if res.Source == hybrid.SourceFallback {
					fallback.Add(1)
				}
			}
		})
	}
	wg.Wait()
	inserted := time.Since(start)
	if t.Failed() {
		return
	}
	if n := denied.Load(); n > 0 {
		t.Fatalf("%d of %d first requests denied, want none: each key's budget holds its cost", n, keys)
	}
	// Every eviction's dues are settled by the rounds that follow: wait
	// until no orphan is left, in the store or in a round under way, and
	// no key has been settled for ten intervals.
	var st hybrid.Stats
	var settled uint64
	var quiet time.Time
	if !pollUntil(60*time.Second, 10*time.Millisecond, func() bool {
		st = l.Stats()
		if st.Reconcile.Orphans > 0 || st.Reconcile.InFlight > 0 || st.Reconcile.KeysSettled != settled {
			settled, quiet = st.Reconcile.KeysSettled, time.Now()
			return false
		}
		return time.Since(quiet) >= 10*interval
	}) {
		t.Fatalf("rounds still settling a minute after the load: %+v", st)
	}
	// The rounds let go of their large buffers once they are small again:
	// on a loaded machine a round may still be in flight, so give them a
	// few seconds.
	var full uint64
	var perKey float64
	pollUntil(10*time.Second, 200*time.Millisecond, func() bool {
		full = heapInuse()
		perKey = float64(full-min(base, full)) / float64(l.Stats().Reconcile.Keys)
		return perKey <= maxBytesPerKey
	})
	if path := os.Getenv("HYBRID_HEAPPROFILE"); path != "" {
		writeHeapProfile(t, path)
	}
	st = l.Stats()
	t.Logf("%d keys in %v (%.0f/s, %d by the fallback); %d tracked, %d evicted; heap %.1f MiB over %.1f MiB before: %.0f bytes per tracked key (bound %d)",
		keys, inserted, keys/inserted.Seconds(), fallback.Load(), st.Reconcile.Keys, st.Reconcile.Evicted,
		float64(full-min(base, full))/(1<<20), float64(base)/(1<<20), perKey, maxBytesPerKey)
	if st.Reconcile.Keys != maxKeys {
		t.Errorf("%d keys tracked, want MaxKeys = %d", st.Reconcile.Keys, maxKeys)
	}
	if st.Reconcile.Evicted < keys-maxKeys {
		t.Errorf("%d keys evicted, want at least %d", st.Reconcile.Evicted, keys-maxKeys)
	}
	if perKey > maxBytesPerKey {
		t.Errorf("%.0f bytes of heap per tracked key, more than %d", perKey, maxBytesPerKey)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := l.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if st := l.Stats(); st.Reconcile.DoubtsExpired > 0 {
		t.Fatalf("%d settlements stayed in doubt until they were given up: the charges below cannot be exact; stats %+v", st.Reconcile.DoubtsExpired, st)
	} else if st.Reconcile.Uncertain > 0 {
		t.Logf("%d settlements timed out after they may have been applied; sent again, %d of them had been", st.Reconcile.Uncertain, st.Reconcile.Duplicates)
	}

	// Read every bucket back, on the server (a million round trips from
	// here would take longer than the test): each was charged its key's
	// cost, once.
	check := redis.NewScript(`
local from, to, burst = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local charged, wrong, first = 0, 0, -1
for k = from, to - 1 do
  -- A bucket is a string "<t> <ts>", or a hash once it has records.
  local rk = 'hybrid:{many:' .. k .. '}'
  local v = redis.pcall('GET', rk)
  local t
  if type(v) == 'string' then
    t = tonumber(string.match(v, '^(%-?%d+) '))
  else
    t = tonumber(redis.call('HGET', rk, 't'))
  end
  local c = -1
  if t then
    c = math.floor((burst - t + 500000) / 1000000)
  end
  if c == 1 + k % 3 then
    charged = charged + c
  else
    wrong = wrong + 1
    if first < 0 then
      first = k
    end
  end
end
return {charged, wrong, first}`)
	var admitted, charged, wrong int64
	first := int64(-1)
	for k := range keys {
		admitted += cost(k)
	}
	const batch = 100_000
	for from := 0; from < keys; from += batch {
		v, err := check.Run(ctx, rdb, nil, from, from+batch, lim.Burst*micro).Int64Slice()
		if err != nil || len(v) != 3 {
			t.Fatalf("checking keys %d to %d: %v, %v", from, from+batch-1, v, err)
		}
		charged += v[0]
		wrong += v[1]
		if first < 0 && v[2] >= 0 {
			first = v[2]
		}
	}
	t.Logf("Redis was charged %d tokens for %d admitted", charged, admitted)
	if wrong > 0 || charged != admitted {
		s, _ := redistest.BucketTokens(ctx, rdb, "hybrid:{"+name(int(max(first, 0)))+"}")
		t.Errorf("Redis was charged %d tokens for %d admitted; %d buckets charged other than their key's cost, the first %s (holding %d, cost %d)",
			charged, admitted, wrong, name(int(first)), s, cost(int(first)))
	}
}

// writeHeapProfile writes a heap profile to path, after a GC: with
// HYBRID_HEAPPROFILE=file, TestManyKeys writes one where it measures the
// bytes per tracked key, for go tool pprof -sample_index=inuse_space.
func writeHeapProfile(t testing.TB, path string) {
	t.Helper()
	runtime.GC()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		t.Fatal(err)
	}
}
