package hybrid_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/go-redis/redis_rate/v10"
	"golang.org/x/time/rate"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/internal/proccpu"
	"github.com/hybridlimit/hybrid/internal/redistest"
)

// BenchmarkColdKeys: the long tail, per-user keys each asked once, from 32
// goroutines on a real redis-server (skipped without one): every decision
// needs Redis. The Limiter in lease and exact modes, beside
// go-redis/redis_rate on a plain client and on an auto-pipelined one, on the
// same server, 10 a minute with a burst of 20 (never denied). Reports the
// process's CPU time per decision (cpu-µs/op, every goroutine's, the
// client's and the runtime's: what a decision costs the host beside its
// wait for Redis), and the client's allocations with -benchmem; Redis's own
// cost per decision is in hybridbench -passes (bench/README.md).
//
//	go test -run '^$' -bench ColdKeys -benchmem -count 6 . | tee cold.txt
//	benchstat -col /impl cold.txt
func BenchmarkColdKeys(b *testing.B) {
	p := redistest.Server(b)
	limit := hybrid.Limit{Rate: 10.0 / 60, Burst: 20}
	var seq atomic.Int64
	key := func(prefix string) string { return prefix + strconv.FormatInt(seq.Add(1), 10) }
	run := func(b *testing.B, decide func(ctx context.Context, key string) (bool, error), prefix string) {
		b.SetParallelism(16) // 32 goroutines on 2 cores
		b.ResetTimer()
		cpu0, cpuOK := proccpu.Used()
		defer func() {
			if cpu1, ok := proccpu.Used(); ok && cpuOK {
				b.ReportMetric(float64(cpu1-cpu0)/1e3/float64(b.N), "cpu-µs/op")
			}
		}()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for pb.Next() {
				ok, err := decide(ctx, key(prefix))
				if err != nil || !ok {
					b.Errorf("a cold key: allowed %v, %v", ok, err)
					return
				}
			}
		})
	}
	for _, mode := range []hybrid.Mode{hybrid.Lease, hybrid.Exact} {
		b.Run("impl="+mode.String(), func(b *testing.B) {
			l := benchLimiter(b, redistest.Client(b, p), hybrid.Config{})
			lim := limit
			lim.Mode = mode
			run(b, func(ctx context.Context, key string) (bool, error) {
				res, err := l.Allow(ctx, key, lim)
				return res.Allowed, err
			}, "cold-"+mode.String()+"-")
			benchNoFallback(b, l)
		})
	}
	rr := redis_rate.Limit{Rate: 10, Burst: 20, Period: 60e9}
	b.Run("impl=redis_rate", func(b *testing.B) {
		rdb := redistest.Client(b, p)
		rl := redis_rate.NewLimiter(rdb)
		run(b, func(ctx context.Context, key string) (bool, error) {
			res, err := rl.Allow(ctx, key, rr)
			return res != nil && res.Allowed > 0, err
		}, "cold-rr-")
	})
	b.Run("impl=redis_rate_ap", func(b *testing.B) {
		rdb := redistest.Client(b, p)
		ap, err := rdb.AutoPipeline()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { ap.Close() })
		rl := redis_rate.NewLimiter(ap)
		run(b, func(ctx context.Context, key string) (bool, error) {
			res, err := rl.Allow(ctx, key, rr)
			return res != nil && res.Allowed > 0, err
		}, "cold-rrap-")
	})
}

// BenchmarkPeek: a peek against the decision it foretells, and against
// go-redis/redis_rate's peek (AllowN with 0), on the same real redis-server
// (skipped without one), from 32 goroutines: at cold keys, each peeked at
// once (one read of Redis each), and at one hot key this instance holds a
// lease for (no round trip), beside x/time/rate's Tokens.
//
//	go test -run '^$' -bench Peek -benchmem -count 6 . | tee peek.txt
//	benchstat -col /impl peek.txt
func BenchmarkPeek(b *testing.B) {
	p := redistest.Server(b)
	limit := hybrid.Limit{Rate: 10.0 / 60, Burst: 20}
	var seq atomic.Int64
	key := func(prefix string) string { return prefix + strconv.FormatInt(seq.Add(1), 10) }
	run := func(b *testing.B, decide func(ctx context.Context, key string) error, prefix string) {
		b.SetParallelism(16) // 32 goroutines on 2 cores
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for pb.Next() {
				if err := decide(ctx, key(prefix)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	for _, mode := range []hybrid.Mode{hybrid.Lease, hybrid.Exact} {
		lim := limit
		lim.Mode = mode
		b.Run("cold/impl=peek-"+mode.String(), func(b *testing.B) {
			l := benchLimiter(b, redistest.Client(b, p), hybrid.Config{})
			run(b, func(ctx context.Context, key string) error {
				_, err := l.Peek(ctx, key, lim, 1)
				return err
			}, "peek-"+mode.String()+"-")
		})
		b.Run("cold/impl=allow-"+mode.String(), func(b *testing.B) {
			l := benchLimiter(b, redistest.Client(b, p), hybrid.Config{})
			run(b, func(ctx context.Context, key string) error {
				_, err := l.Allow(ctx, key, lim)
				return err
			}, "allow-"+mode.String()+"-")
		})
	}
	rr := redis_rate.Limit{Rate: 10, Burst: 20, Period: 60e9}
	b.Run("cold/impl=redis_rate", func(b *testing.B) {
		rl := redis_rate.NewLimiter(redistest.Client(b, p))
		run(b, func(ctx context.Context, key string) error {
			_, err := rl.AllowN(ctx, key, rr, 0)
			return err
		}, "rr-")
	})
	b.Run("cold/impl=redis_rate_ap", func(b *testing.B) {
		ap, err := redistest.Client(b, p).AutoPipeline()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { ap.Close() })
		rl := redis_rate.NewLimiter(ap)
		run(b, func(ctx context.Context, key string) error {
			_, err := rl.AllowN(ctx, key, rr, 0)
			return err
		}, "rrap-")
	})
	// A key in use: every other request of each goroutine is a peek, so
	// that the key keeps its lease; against requests that are all
	// decisions, and x/time/rate's Allow and Tokens alike.
	hot := hybrid.Limit{Rate: 1e9, Burst: 1e9}
	hotRun := func(b *testing.B, allow, peek func(ctx context.Context) error) {
		b.SetParallelism(16)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for i := 0; pb.Next(); i++ {
				f := allow
				if i%2 == 1 {
					f = peek
				}
				if err := f(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	hl := benchLimiter(b, redistest.Client(b, p), hybrid.Config{})
	hotAllow := func(ctx context.Context) error {
		res, err := hl.Allow(ctx, "hot", hot)
		if err == nil && !res.Allowed {
			err = errors.New("a hot key's request denied")
		}
		return err
	}
	b.Run("hot/impl=allow-peek", func(b *testing.B) {
		for i := 0; i < 1e5; i++ { // until the key holds a lease
			if res, err := hl.Peek(context.Background(), "hot", hot, 1); err == nil && res.Source == hybrid.SourceLocal {
				break
			}
			if err := hotAllow(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
		var remote atomic.Int64 // peeks that found the lease dry
		hotRun(b, hotAllow, func(ctx context.Context) error {
			res, err := hl.Peek(ctx, "hot", hot, 1)
			if res.Source != hybrid.SourceLocal {
				remote.Add(1)
			}
			return err
		})
		b.ReportMetric(float64(remote.Load())/float64(b.N), "redis-peeks/op")
	})
	b.Run("hot/impl=allow-allow", func(b *testing.B) { hotRun(b, hotAllow, hotAllow) })
	rl := rate.NewLimiter(rate.Limit(1e9), 1e9)
	b.Run("hot/impl=x-time-rate", func(b *testing.B) {
		hotRun(b, func(context.Context) error {
			rl.Allow()
			return nil
		}, func(context.Context) error {
			rl.Tokens()
			return nil
		})
	})
}

// BenchmarkReset: a reset of a key's bucket, against go-redis/redis_rate's
// Reset, on the same real redis-server (skipped without one), one caller at
// a time: ours makes two round trips (the bucket, then the fleet's news),
// redis_rate's one (a DEL).
//
//	go test -run '^$' -bench Reset -count 6 . | tee reset.txt
func BenchmarkReset(b *testing.B) {
	p := redistest.Server(b)
	lim := hybrid.Limit{Rate: 10, Burst: 20}
	b.Run("impl=hybrid", func(b *testing.B) {
		l := benchLimiter(b, redistest.Client(b, p), hybrid.Config{})
		ctx := context.Background()
		if _, err := l.Allow(ctx, "reset", lim); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for range b.N {
			if err := l.Reset(ctx, "reset"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("impl=redis_rate", func(b *testing.B) {
		rl := redis_rate.NewLimiter(redistest.Client(b, p))
		ctx := context.Background()
		if _, err := rl.Allow(ctx, "reset", redis_rate.PerSecond(10)); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for range b.N {
			if err := rl.Reset(ctx, "reset"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
