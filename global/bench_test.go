package global_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/internal/limit"
	"github.com/hybridlimit/hybrid/internal/redistest"
)

// benchGoroutines is how many goroutines the parallel benchmarks run.
const benchGoroutines = 32

// BenchmarkAllow compares the exact limiter with go-redis/redis_rate on a
// real redis-server, one hot key, serially and from 32 goroutines. The limit
// is high enough that every decision is an allow, so both scripts write.
// Compare with: benchstat -col /impl.
func BenchmarkAllow(b *testing.B) {
	rdb := redistest.Client(b, redistest.Server(b))
	l, err := global.New(rdb, global.Config{})
	if err != nil {
		b.Fatal(err)
	}
	rl := redis_rate.NewLimiter(rdb)
	const rate = 1_000_000
	lim := global.Limit{Rate: rate, Burst: rate}
	rlim := redis_rate.Limit{Rate: rate, Burst: rate, Period: time.Second}

	impls := []struct {
		name  string
		allow func(ctx context.Context) (bool, error)
	}{
		{"global", func(ctx context.Context) (bool, error) {
			r, err := l.Allow(ctx, "bench", lim, 1)
			return r.Allowed, err
		}},
		{"redis_rate", func(ctx context.Context) (bool, error) {
			r, err := rl.Allow(ctx, "bench", rlim)
			return r != nil && r.Allowed > 0, err
		}},
	}
	for _, impl := range impls {
		b.Run("impl="+impl.name+"/goroutines=1", func(b *testing.B) {
			ctx := b.Context()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := impl.allow(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
		})
		b.Run(fmt.Sprintf("impl=%s/goroutines=%d", impl.name, benchGoroutines), func(b *testing.B) {
			ctx := b.Context()
			b.SetParallelism((benchGoroutines + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := impl.allow(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
}

// BenchmarkSettle settles batches of 100 and 1,000 keys in one call on a
// real redis-server: each key is charged, and takes an allowance; with
// seq=1 each settlement carries an Instance and a Seq, as a round's do (the
// script then reads and writes the instance's record too).
func BenchmarkSettle(b *testing.B) {
	rdb := redistest.Client(b, redistest.Server(b))
	l, err := global.New(rdb, global.Config{})
	if err != nil {
		b.Fatal(err)
	}
	m, err := global.Limit{Rate: 1e6, Burst: 1e6}.Micro()
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		size int
		seq  bool
	}{{100, false}, {100, true}, {1000, false}, {1000, true}} {
		size := tc.size
		b.Run(fmt.Sprintf("keys=%d/seq=%d", size, map[bool]int{false: 0, true: 1}[tc.seq]), func(b *testing.B) {
			ctx := b.Context()
			batch := make([]global.Settlement, size)
			for i := range batch {
				batch[i] = global.Settlement{
					Key:      fmt.Sprintf("user%d", i),
					Limit:    m,
					Consumed: limit.Micro,
					Want:     limit.Micro,
					MinGrant: 1,
				}
			}
			replies := make([]global.Reply, size)
			b.ReportAllocs()
			var seq int64
			for b.Loop() {
				if tc.seq {
					seq++
					for i := range batch {
						batch[i].Instance, batch[i].Seq = "bench", seq
					}
				}
				if err := l.Settle(ctx, batch, replies); err != nil {
					b.Fatal(err)
				}
				for i := range replies {
					if replies[i].Err != nil {
						b.Fatal(replies[i].Err)
					}
				}
			}
			b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "keys/s")
		})
	}
}
