package hybrid_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/go-redis/redis_rate/v10"

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
