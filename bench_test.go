package hybrid_test

import (
	"context"
	"fmt"
	"math/rand/v2"
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
// lease mode and through x/time/rate's Allow with the same limit.
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
	hot := func(b *testing.B, l *hybrid.Limiter, par bool) {
		benchWarm(b, l, []string{"hot"}, benchHuge)
		benchLoop(b, par, func() bool {
			res, err := l.Allow(ctx, "hot", benchHuge)
			return err == nil && res.Allowed && res.Source != hybrid.SourceFallback
		})
	}
	for _, par := range []bool{false, true} {
		name := "hot/par=" + strconv.FormatBool(par)
		b.Run(name+"/lc=huge/impl=hybrid", func(b *testing.B) {
			m := miniredis.RunT(b)
			hot(b, benchLimiter(b, redis.NewClient(&redis.Options{Addr: m.Addr()}), hybrid.Config{LocalCapacity: 1 << 30}), par)
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
			hot(b, benchLimiter(b, redistest.Client(b, redistest.Server(b)), hybrid.Config{}), par)
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
func benchLoop(b *testing.B, parallel bool, f func() bool) {
	b.ReportAllocs()
	var bad atomic.Int64
	if !parallel {
		n := int64(0)
		for b.Loop() {
			if !f() {
				n++
			}
		}
		bad.Add(n)
	} else {
		runParallel(b, func(_, iters int) {
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

// runParallel runs body on GOMAXPROCS goroutines, the w-th for iters of
// b.N's iterations, and times them together, as b.RunParallel does but
// with nothing shared between the goroutines: RunParallel's testing.PB
// values are small neighbours on the heap, each Next writes to its own, and
// so they share a cache line that every iteration moves between the cores
// (a quarter of the time of a hot key's decisions in a CPU profile).
func runParallel(b *testing.B, body func(w, iters int)) {
	procs := runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	b.ResetTimer()
	for w := range procs {
		iters := b.N / procs
		if w < b.N%procs {
			iters++
		}
		wg.Go(func() { body(w, iters) })
	}
	wg.Wait()
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

// BenchmarkAllowKeys: 1e3 and 1e5 keys asked for uniformly, always allowed,
// through a sync.Map of x/time/rate limiters and through the full Limiter
// (lease mode, on a real redis-server, every key warmed first). The
// x/time/rate side runs first, so that the Limiter's background rounds do
// not run beside it.
//
// 1e5 keys, not 1e6: warming 1e6 keys (one fetch each, 32 at a time) takes
// about 60 s on 2 cores, 1e5 about 6 s. For them the Limiter's breaker gets
// a call timeout (and ColdWait) of 2 s instead of 50 ms: with the defaults,
// the warm-up's settlement rounds outgrow the call timeout and fail, and the
// fetches queued behind them in Redis fail too, which opens the breaker (see
// TestIntegrationWarmManyKeys); the Limiter would then answer from the
// fallback, and this benchmark measure the wrong path.
func BenchmarkAllowKeys(b *testing.B) {
	cases := []struct {
		name string
		keys int
		cfg  hybrid.Config
	}{
		{"keys=1e3", 1_000, hybrid.Config{}},
		{"keys=1e5", 100_000, hybrid.Config{
			MaxKeys:  1 << 21,
			ColdWait: 2 * time.Second,
			Breaker:  breaker.Config{CallTimeout: 2 * time.Second},
		}},
	}
	pars := []bool{false, true}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			keys := make([]string, c.keys)
			for i := range keys {
				keys[i] = "user:" + strconv.Itoa(i)
			}
			seq := benchUniform(c.keys)
			key := func(i int) string { return keys[seq[i&(len(seq)-1)]] }

			m := new(sync.Map)
			for _, k := range keys {
				m.Store(k, rate.NewLimiter(rate.Limit(benchHuge.Rate), int(benchHuge.Burst)))
			}
			for _, par := range pars {
				b.Run("par="+strconv.FormatBool(par)+"/impl=xrate", func(b *testing.B) {
					benchDecide(b, nil, par, func(i int) (hybrid.Result, error) {
						v, _ := m.Load(key(i))
						return hybrid.Result{Allowed: v.(*rate.Limiter).Allow()}, nil
					})
				})
			}
			m = nil

			// One Limiter for both sub-benchmarks: RunParallel calls its
			// function more than once, and warming 1e5 keys takes seconds.
			l := benchLimiter(b, redistest.Client(b, redistest.Server(b)), c.cfg)
			start := time.Now()
			benchWarm(b, l, keys, benchHuge)
			b.Logf("warmed %d keys in %v", len(keys), time.Since(start).Round(time.Millisecond))
			ctx := context.Background()
			for _, par := range pars {
				b.Run("par="+strconv.FormatBool(par)+"/impl=hybrid", func(b *testing.B) {
					benchDecide(b, l, par, func(i int) (hybrid.Result, error) {
						return l.Allow(ctx, key(i), benchHuge)
					})
				})
			}
		})
	}
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

// benchWarm asks once for each key, from as many goroutines as there are
// CPUs times 16 (the fetches are round trips), and fails b unless every
// request was allowed from Redis or the allowance.
func benchWarm(b *testing.B, l *hybrid.Limiter, keys []string, lim hybrid.Limit) {
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
				res, err := l.Allow(context.Background(), keys[i], lim)
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
func benchDecide(b *testing.B, l *hybrid.Limiter, parallel bool, f func(i int) (hybrid.Result, error)) {
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
	if !parallel {
		i := 0
		for b.Loop() {
			if !check(i) {
				break
			}
			i++
		}
	} else {
		runParallel(b, func(w, iters int) {
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
