package hybrid_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/internal/redistest"
)

// BenchmarkWait: waiters on one key, on a real redis-server (skipped without
// one), against x/time/rate's Wait on the same limit: ns/op is the time a
// token takes, the limit's 1/R at best, so that the ratio of x/time/rate's
// to ours is the share of the rate the waiters get. One waiter at 200/s,
// 1000/s and 50/s with a burst of 1, and 1000/s with 10; 16 waiters
// together at 200/s burst 1, on one Limiter and on a fleet of 4 (never taking
// more than B + R*T). Each mode of the Limiter has a key of its own.
//
//	go test -run '^$' -bench Wait -benchtime 1.5s -count 6 . | tee wait.txt
//	benchstat -col /impl wait.txt
func BenchmarkWait(b *testing.B) {
	p := redistest.Server(b)
	l := benchLimiter(b, redistest.Client(b, p), hybrid.Config{})
	cases := []struct {
		lim     hybrid.Limit
		waiters int
	}{
		{hybrid.Limit{Rate: 200, Burst: 1}, 1},
		{hybrid.Limit{Rate: 1000, Burst: 1}, 1},
		{hybrid.Limit{Rate: 1000, Burst: 10}, 1},
		{hybrid.Limit{Rate: 50, Burst: 1}, 1},
		{hybrid.Limit{Rate: 200, Burst: 1}, 16},
	}
	for i, c := range cases {
		name := fmt.Sprintf("limit=%v-%d/waiters=%d", c.lim.Rate, c.lim.Burst, c.waiters)
		run := func(b *testing.B, wait func(ctx context.Context) error) {
			if c.waiters == 1 {
				for range b.N {
					if err := wait(context.Background()); err != nil {
						b.Fatal(err)
					}
				}
				return
			}
			b.SetParallelism((c.waiters + 1) / 2) // on 2 cores
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := wait(context.Background()); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		for _, mode := range []hybrid.Mode{hybrid.Lease, hybrid.Optimistic, hybrid.Exact} {
			lim := c.lim
			lim.Mode = mode
			key := fmt.Sprintf("wait-%d-%v", i, mode)
			b.Run(name+"/impl="+mode.String(), func(b *testing.B) {
				run(b, func(ctx context.Context) error { return l.Wait(ctx, key, lim) })
			})
		}
		b.Run(name+"/impl=x-time-rate", func(b *testing.B) {
			rl := rate.NewLimiter(rate.Limit(c.lim.Rate), int(c.lim.Burst))
			run(b, rl.Wait)
		})
	}
	// A fleet of 4 Limiters, each its own client, 4 waiters on each, on
	// one key at 200/s burst 1: ns/op is the fleet's time a token (the
	// waiters still waiting once b.N tokens are had give theirs back), and
	// the fleet may never take more than B + R*T.
	fleet := make([]*hybrid.Limiter, 4)
	for i := range fleet {
		fleet[i] = benchLimiter(b, redistest.Client(b, p), hybrid.Config{InstanceID: fmt.Sprintf("w%d", i)})
	}
	waiters := func(b *testing.B, n int, wait func(i int, ctx context.Context) error) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var taken atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for i := range n {
			wg.Go(func() {
				for wait(i, ctx) == nil {
					if taken.Add(1) >= int64(b.N) {
						cancel()
						return
					}
				}
			})
		}
		wg.Wait()
		if bound := 1 + 200*time.Since(start).Seconds() + 1; float64(taken.Load()) > bound {
			b.Errorf("the fleet took %d tokens in %v, above B + R*T = %.0f", taken.Load(), time.Since(start), bound)
		}
	}
	for _, mode := range []hybrid.Mode{hybrid.Lease, hybrid.Optimistic, hybrid.Exact} {
		lim := hybrid.Limit{Rate: 200, Burst: 1, Mode: mode}
		key := "wait-fleet-" + mode.String()
		b.Run("limit=200-1/waiters=4x4/impl="+mode.String(), func(b *testing.B) {
			waiters(b, 16, func(i int, ctx context.Context) error { return fleet[i%4].Wait(ctx, key, lim) })
		})
	}
	b.Run("limit=200-1/waiters=4x4/impl=x-time-rate", func(b *testing.B) {
		rl := rate.NewLimiter(200, 1)
		waiters(b, 16, func(_ int, ctx context.Context) error { return rl.Wait(ctx) })
	})
}
