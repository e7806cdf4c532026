package hybrid_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/internal/parallel"
	"github.com/hybridlimit/hybrid/internal/redistest"
)

// The benchmarks put the full Limiter next to golang.org/x/time/rate in the
// same run, on the allowed path: limits so large that nothing is denied, on
// keys warmed first. With many keys the x/time/rate side is a sync.Map of
// *rate.Limiter, the usual way to key it. Compare with:
//
//	go test -run '^$' -bench . -count 6 . | tee root-bench.txt
//	benchstat -col /impl root-bench.txt
//
// BenchmarkRedisPerDecision, BenchmarkAllowKeys and BenchmarkAllow's
// lc=default need redis-server (they skip without it); the rest runs on
// miniredis. A run that takes more than benchBudget is stopped and failed.

// benchHuge is a limit no benchmark runs out of: the allowed path.
var benchHuge = hybrid.Limit{Rate: 1e9, Burst: 1e9, Mode: hybrid.Lease}

// BenchmarkAllow: one hot key, always allowed, through the full Limiter in
// lease mode (and in optimistic mode, impl=optimistic) and through
// x/time/rate's Allow with the same limit.
//
// lc=huge gives the key a lease that never runs dry (LocalCapacity 2^30):
// every decision is the in-memory hot path, the figure to hold against
// x/time/rate; impl=handle decides it through a Handle, without the key's
// lookup. lc=default runs the default LocalCapacity against a real
// redis-server (skipped without one): one decision in LocalCapacity then
// waits for a fetch, a Redis round trip, which is what a hot key costs at
// full speed with the defaults; BenchmarkRedisPerDecision counts those
// round trips.
func BenchmarkAllow(b *testing.B) {
	ctx := context.Background()
	hot := func(b *testing.B, l *hybrid.Limiter, par bool, lim hybrid.Limit) {
		benchWarm(b, l, []string{"hot"}, lim)
		benchLoop(b, par, func() bool {
			res, err := l.Allow(ctx, "hot", lim)
			return err == nil && res.Allowed && res.Source != hybrid.SourceFallback
		})
	}
	for _, par := range []bool{false, true} {
		name := "hot/par=" + strconv.FormatBool(par)
		b.Run(name+"/lc=huge/impl=hybrid", func(b *testing.B) {
			m := miniredis.RunT(b)
			hot(b, benchLimiter(b, redis.NewClient(&redis.Options{Addr: m.Addr()}), hybrid.Config{LocalCapacity: 1 << 30}), par, benchHuge)
		})
		b.Run(name+"/lc=huge/impl=optimistic", func(b *testing.B) {
			m := miniredis.RunT(b)
			lim := benchHuge
			lim.Mode = hybrid.Optimistic
			hot(b, benchLimiter(b, redis.NewClient(&redis.Options{Addr: m.Addr()}), hybrid.Config{LocalCapacity: 1 << 30}), par, lim)
		})
		b.Run(name+"/lc=huge/impl=handle", func(b *testing.B) {
			m := miniredis.RunT(b)
			l := benchLimiter(b, redis.NewClient(&redis.Options{Addr: m.Addr()}), hybrid.Config{LocalCapacity: 1 << 30})
			benchWarm(b, l, []string{"hot"}, benchHuge)
			h, err := l.Handle("hot", benchHuge)
			if err != nil {
				b.Fatal(err)
			}
			benchLoop(b, par, func() bool {
				res, err := h.Allow(ctx)
				return err == nil && res.Allowed && res.Source != hybrid.SourceFallback
			})
		})
		b.Run(name+"/lc=default/impl=hybrid", func(b *testing.B) {
			hot(b, benchLimiter(b, redistest.Client(b, redistest.Server(b)), hybrid.Config{}), par, benchHuge)
		})
		b.Run(name+"/impl=xrate", func(b *testing.B) {
			x := rate.NewLimiter(rate.Limit(benchHuge.Rate), int(benchHuge.Burst))
			benchLoop(b, par, x.Allow)
		})
	}
}

// benchLoop calls f b.N times, serially or from every processor, with as little
// around it as possible (f is the whole decision), and fails b if f ever
// reports a decision that is not an allowed one.
func benchLoop(b *testing.B, par bool, f func() bool) {
	b.ReportAllocs()
	var bad atomic.Int64
	if !par {
		n := int64(0)
		for b.Loop() {
			if !f() {
				n++
			}
		}
		bad.Add(n)
	} else {
		parallel.Run(b, func(_, iters int) {
			n := int64(0)
			for range iters {
				if !f() {
					n++
				}
			}
			bad.Add(n)
		})
	}
	if n := bad.Load(); n > 0 {
		b.Fatalf("%d decisions were not allowed, or failed, or fell back: the benchmark measured the wrong path", n)
	}
}

// BenchmarkRedisPerDecision runs 1e6 decisions per iteration on one hot key
// (R=1e6/s, B=1e6, lease) against a real redis-server and reports the Redis
// commands sent per decision (a pipeline counts each of its commands), all
// commands of the client included: fetches, rounds and heartbeats. Each
// iteration uses a key of its own, so that it starts from a full bucket.
func BenchmarkRedisPerDecision(b *testing.B) {
	const perIter = 1_000_000
	lim := hybrid.Limit{Rate: 1e6, Burst: 1e6, Mode: hybrid.Lease}
	p := redistest.Server(b)
	rdb := redistest.Client(b, p)
	var cmds redistest.Counter
	rdb.AddHook(&cmds)
	l := benchLimiter(b, rdb, hybrid.Config{})
	benchWarm(b, l, []string{"warm"}, lim)
	ctx := context.Background()
	var decisions, allowed int64
	before := cmds.Load()
	iter := 0
	for b.Loop() {
		key := "hot-" + strconv.Itoa(iter)
		iter++
		for range perIter {
			res, err := l.Allow(ctx, key, lim)
			if err != nil {
				b.Fatal(err)
			}
			if res.Allowed {
				allowed++
			}
		}
		decisions += perIter
	}
	sent := cmds.Load() - before
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(decisions), "ns/decision")
	b.ReportMetric(float64(sent)/float64(decisions), "cmds/decision")
	b.ReportMetric(100*float64(allowed)/float64(decisions), "allowed%")
	benchNoFallback(b, l)
}

// BenchmarkAllowKeys: 1e3, 1e5 and 1e6 keys asked for uniformly, always
// allowed, through a sync.Map of x/time/rate limiters and through the full
// Limiter (lease mode, on a real redis-server). The x/time/rate side runs
// first, so that nothing of the Limiter runs beside it.
//
// Every decision is the in-memory path, the figure to hold against
// x/time/rate at that many keys: each key is given a lease that outlasts
// the runs first (a Reserve of 2^20 tokens, the Limiter's LocalCapacity,
// cancelled: one fetch a key, the tokens kept here; -count runs all share
// the one Limiter), and the Limiter's SyncInterval is a minute,
// so that no round runs meanwhile (a round would give back what a key
// holds beyond its lease size, and the lease of every key idle since the
// round before, as it should on a service; at a million keys the uniform
// order touches a key every 60 to 200 ms). Its breaker gets a call timeout
// (and ColdWait) of 2 s: the warm-up's fetches, 32 at a time, queue in Redis.
// Warming 1e6 keys takes about 20 s on 2 cores: pick the sizes with -bench
// 'BenchmarkAllowKeys/keys=1e3' and the like.
//
// Each reports the heap it holds a key (heapB/key: the heap after the keys
// are in, less the heap before, over the keys; the key strings themselves
// are the benchmark's, which the sync.Map shares and the Limiter copies).
// The Limiter's is measured at steady state, on a Limiter of its own with
// the default rounds, each key asked once and settled (see benchKeyHeap);
// the log also says what the timed Limiter holds a key, each with its lease
// and no round since.
func BenchmarkAllowKeys(b *testing.B) {
	cfg := hybrid.Config{
		MaxKeys:       1 << 21,
		LocalCapacity: 1 << 20,
		SyncInterval:  time.Minute,
		ColdWait:      2 * time.Second,
		Breaker:       breaker.Config{CallTimeout: 2 * time.Second},
	}
	for _, n := range []int{1_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("keys=1e%d", int(math.Log10(float64(n)))), func(b *testing.B) {
			keys := make([]string, n)
			for i := range keys {
				keys[i] = "user:" + strconv.Itoa(i)
			}
			seq := benchUniform(n)
			key := func(i int) string { return keys[seq[i&(len(seq)-1)]] }
			pars := []bool{false, true}

			before := heapAlloc()
			m := new(sync.Map)
			for _, k := range keys {
				m.Store(k, rate.NewLimiter(rate.Limit(benchHuge.Rate), int(benchHuge.Burst)))
			}
			perKey := float64(heapAlloc()-before) / float64(n)
			for _, par := range pars {
				b.Run("par="+strconv.FormatBool(par)+"/impl=xrate", func(b *testing.B) {
					benchDecide(b, nil, par, func(i int) (hybrid.Result, error) {
						v, _ := m.Load(key(i))
						return hybrid.Result{Allowed: v.(*rate.Limiter).Allow()}, nil
					})
					b.ReportMetric(perKey, "heapB/key")
				})
			}
			m = nil

			// The heap a key at steady state, on a Limiter of its own,
			// closed before the timed one is made (whose first round, a
			// minute in, would build a round of every key beside it).
			perKey = benchKeyHeap(b, keys, cfg.MaxKeys)

			// One Limiter for both sub-benchmarks and every -count run,
			// warmed once: each key holds 2^20 tokens.
			before = heapAlloc()
			l := benchLimiter(b, redistest.Client(b, redistest.Server(b)), cfg)
			start := time.Now()
			benchHold(b, l, keys, benchHuge, cfg.LocalCapacity)
			b.Logf("warmed %d keys in %v", n, time.Since(start).Round(time.Millisecond))
			held := float64(heapAlloc()-before) / float64(n)
			b.Logf("heap a key: %.1f B settled (each key asked once, rounds every 100ms), %.1f B holding its lease (no round since)", perKey, held)
			ctx := context.Background()
			for _, par := range pars {
				b.Run("par="+strconv.FormatBool(par)+"/impl=hybrid", func(b *testing.B) {
					benchDecide(b, l, par, func(i int) (hybrid.Result, error) {
						return l.Allow(ctx, key(i), benchHuge)
					})
					b.ReportMetric(perKey, "heapB/key")
				})
			}
		})
	}
}

// benchHold gives every key a lease of hold tokens held here (a Reserve of
// them, cancelled), and fails b unless every one was allowed and kept.
func benchHold(b *testing.B, l *hybrid.Limiter, keys []string, lim hybrid.Limit, hold int64) {
	b.Helper()
	benchEach(b, l, keys, func(key string) (hybrid.Result, error) {
		r, err := l.Reserve(context.Background(), key, lim, hold)
		if err != nil {
			return hybrid.Result{}, err
		}
		r.Cancel()
		return r.Result(), nil
	})
}

// benchKeyHeap returns the heap a tracked key costs a Limiter at steady
// state, in bytes: a Limiter with the default rounds (and MaxKeys maxKeys)
// asks once for each key, then waits until the rounds have settled them:
// until its lost-writes journal, which holds what the keys' fetches and the
// rounds' give-backs took and which a heartbeat empties three heartbeat
// intervals after the last write (some thirty rounds), is empty, with
// nothing in flight, orphaned or unsettled, for two seconds in a row.
// The Limiter is closed after the measure.
func benchKeyHeap(b *testing.B, keys []string, maxKeys int) float64 {
	b.Helper()
	before := heapAlloc()
	rdb := redistest.Client(b, redistest.Server(b))
	l, err := hybrid.New(rdb, hybrid.Config{MaxKeys: maxKeys, ColdWait: 2 * time.Second, Breaker: breaker.Config{CallTimeout: 2 * time.Second}})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		l.Close(context.Background())
		rdb.Close()
	}()
	benchWarm(b, l, keys, benchHuge)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(time.Minute)
	if n := l.Stats().Reconcile.Journal; n == 0 {
		b.Fatal("the journal holds nothing once the keys were asked: their fetches are not in it, and it tells nothing of the rounds")
	}
	for calm := 0; calm < 20; { // two seconds in a row: a large round takes a while to build
		st := l.Stats().Reconcile
		if st.InFlight == 0 && st.Orphans == 0 && st.Journal == 0 && st.Unsettled == 0 {
			calm++
		} else {
			calm = 0
		}
		select {
		case <-tick.C:
		case <-deadline:
			b.Fatalf("not settled a minute after the keys were asked: %d in flight, %d orphans, %d journal entries", st.InFlight, st.Orphans, st.Journal)
		}
	}
	if got := l.Stats().Reconcile.Keys; got != len(keys) {
		b.Fatalf("%d keys tracked, want %d", got, len(keys))
	}
	if path := os.Getenv("HYBRID_HEAPPROFILE"); path != "" {
		writeHeapProfile(b, path) // where the bytes a key go, for go tool pprof
	}
	return float64(heapAlloc()-before) / float64(len(keys))
}

// heapAlloc returns the bytes of live heap objects after two collections.
func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// benchLimiter returns a Limiter on rdb, closed (and rdb with it) at cleanup.
func benchLimiter(b *testing.B, rdb *redis.Client, cfg hybrid.Config) *hybrid.Limiter {
	b.Helper()
	l, err := hybrid.New(rdb, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		l.Close(context.Background())
		rdb.Close()
	})
	return l
}

// benchWarm asks once for each key, and fails b unless every request was
// allowed from Redis or the allowance.
func benchWarm(b *testing.B, l *hybrid.Limiter, keys []string, lim hybrid.Limit) {
	b.Helper()
	benchEach(b, l, keys, func(key string) (hybrid.Result, error) {
		return l.Allow(context.Background(), key, lim)
	})
}

// benchEach decides each key with decide, from as many goroutines as there
// are CPUs times 16 (the fetches are round trips), and fails b unless every
// decision was allowed, and not by the fallback.
func benchEach(b *testing.B, l *hybrid.Limiter, keys []string, decide func(key string) (hybrid.Result, error)) {
	b.Helper()
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	for range min(len(keys), 16*runtime.GOMAXPROCS(0)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(keys) {
					return
				}
				res, err := decide(keys[i])
				if err == nil && (!res.Allowed || res.Source == hybrid.SourceFallback) {
					err = &benchError{"warming " + keys[i] + ": allowed " + strconv.FormatBool(res.Allowed) + " from " + res.Source.String()}
				}
				if err != nil {
					failed.CompareAndSwap(nil, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		b.Fatalf("%v; stats %+v", err, l.Stats())
	}
}

type benchError struct{ s string }

func (e *benchError) Error() string { return e.s }

// benchBudget bounds the wall time of one benchmark run. A run past it has
// fallen off the path it measures (the limiter waits for Redis on most
// decisions) and is stopped and failed rather than left to run for minutes.
const benchBudget = 20 * time.Second

// benchDecide calls f b.N times, serially with b.Loop or from parallel
// goroutines, with a running index, and fails the benchmark if a decision
// is denied, fails, or (for the Limiter l, if not nil) came from the
// fallback: it measured the wrong path. It also fails it, early, when the
// run takes longer than benchBudget.
func benchDecide(b *testing.B, l *hybrid.Limiter, par bool, f func(i int) (hybrid.Result, error)) {
	b.ReportAllocs()
	var denied, fallback atomic.Int64
	var failed atomic.Value
	var slow atomic.Bool
	var done atomic.Int64
	start := time.Now()
	check := func(i int) bool {
		res, err := f(i)
		switch {
		case err != nil:
			failed.CompareAndSwap(nil, err)
		case !res.Allowed:
			denied.Add(1)
		case res.Source == hybrid.SourceFallback:
			fallback.Add(1)
		}
		if i&(1<<10-1) == 0 {
			done.Add(1 << 10)
			if time.Since(start) > benchBudget {
				slow.Store(true)
			}
		}
		return !slow.Load()
	}
	if !par {
		i := 0
		for b.Loop() {
			if !check(i) {
				break
			}
			i++
		}
	} else {
		parallel.Run(b, func(w, iters int) {
			i := (w + 1) << 16
			for range iters {
				if !check(i) {
					return
				}
				i++
			}
		})
	}
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatalf("a decision failed: %v", err)
	}
	if n := denied.Load(); n > 0 {
		b.Fatalf("%d of %d decisions were denials: the benchmark measured the wrong path%s", n, b.N, benchStats(l))
	}
	if n := fallback.Load(); n > 0 {
		b.Fatalf("%d of %d decisions came from the fallback: the benchmark measured the wrong path%s", n, b.N, benchStats(l))
	}
	if slow.Load() {
		n := done.Load()
		b.Fatalf("stopped after %v, at about decision %d (%v each): the decisions became far slower than when the iteration count was chosen%s",
			benchBudget, n, time.Since(start)/time.Duration(max(n, 1)), benchStats(l))
	}
}

// benchStats describes l's statistics for a failure message, if l is not nil.
func benchStats(l *hybrid.Limiter) string {
	if l == nil {
		return ""
	}
	return fmt.Sprintf("; stats %+v", l.Stats())
}

// benchNoFallback fails b if l fell back or lost a settlement.
func benchNoFallback(b *testing.B, l *hybrid.Limiter) {
	b.Helper()
	st := l.Stats()
	if st.FallbackAllowed+st.FallbackDenied+st.Reconcile.RoundErrors+st.Reconcile.KeyErrors > 0 {
		b.Fatalf("the limiter fell back or failed to settle: %+v", st)
	}
}

// benchUniform returns 1<<20 key indices drawn uniformly from [0, n).
func benchUniform(n int) []int32 {
	rng := rand.New(rand.NewPCG(1, 1))
	seq := make([]int32, 1<<20)
	for i := range seq {
		seq[i] = int32(rng.IntN(n))
	}
	return seq
}

// cmdCounter is a go-redis hook counting the commands sent, each command of
