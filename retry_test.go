package hybrid_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"golang.org/x/time/rate"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/internal/redistest"
)

// TestRetryAfterAlone: in a fleet, a key that one instance alone asks for is
// paced for one instance, not for the fleet, in lease and optimistic modes:
// a denial's RetryAfter is within 1 ms of when a token is due, and honoured,
// it admits. When a token is due: in lease mode, when the global bucket,
// refilled since, holds it (as Redis itself says); in optimistic mode, whose
// spending reaches Redis at settlements, when a bucket of the same limit
// that every admission took from (x/time/rate's) holds it. The key is
// saturated: its caller asks again as soon as it is told to, for 200
// decisions. Before the key's askers were counted, a fleet of 8 at 1000/s
// burst 10 told its lone lease caller to wait about 5 ms for a token due in
// 1; before an optimistic key's were, a fleet of 4 at 10/s burst 1 gave its
// lone caller 2.5 a second.
func TestRetryAfterAlone(t *testing.T) {
	for _, mode := range []hybrid.Mode{hybrid.Lease, hybrid.Optimistic} {
		for _, n := range []int{1, 4, 8} {
			for _, lim := range []hybrid.Limit{{Rate: 1000, Burst: 10}, {Rate: 100, Burst: 100}, {Rate: 10, Burst: 1}} {
				lim.Mode = mode
				t.Run(fmt.Sprintf("%v/%d/%v-per-s/burst-%d", mode, n, lim.Rate, lim.Burst), func(t *testing.T) {
					inFleet(t, n, hybrid.Config{}, func(t *testing.T, f *fleet) {
						settle(time.Second) // the instances count one another
						l := f.lims[n-1]
						ideal := rate.NewLimiter(rate.Limit(lim.Rate), int(lim.Burst))
						ctx := context.Background()
						var denials, admitted int
						admit := func() {
							admitted++
							ideal.ReserveN(time.Now(), 1) // what it took, even if the bucket is short
						}
						for range 200 {
							res, err := l.Allow(ctx, "k", lim)
							if err != nil {
								t.Fatal(err)
							}
							if res.Allowed {
								admit()
								continue
							}
							denials++
							what := fmt.Sprintf("denial %d", denials)
							if mode == hybrid.Lease {
								retryWithin(t, f, "k", lim, res, what)
							} else {
								r := ideal.ReserveN(time.Now(), 1)
								due := r.DelayFrom(time.Now())
								r.CancelAt(time.Now())
								if diff := res.RetryAfter - due; diff < -time.Millisecond || diff > time.Millisecond {
									t.Errorf("%s: RetryAfter %v, a token is due in %v: off by %v, more than 1ms", what, res.RetryAfter, due, diff)
								}
							}
							time.Sleep(res.RetryAfter)
							if res, err := l.Allow(ctx, "k", lim); err != nil || !res.Allowed {
								t.Errorf("%s: Allow after RetryAfter %v = %+v, %v, want allowed", what, res.RetryAfter, res, err)
							} else {
								admit()
							}
						}
						if denials == 0 {
							t.Fatalf("no denial in 200 requests: the key was not saturated")
						}
						t.Logf("%d denials, %d admitted", denials, admitted)
					})
				})
			}
		}
	}
}

// retryWithin checks that res, a denial of key under lim, tells to retry
// within 1 ms of when the Redis bucket holds a token (dueIn).
func retryWithin(t *testing.T, f *fleet, key string, lim hybrid.Limit, res hybrid.Result, what string) {
	t.Helper()
	due := dueIn(t, f.m, key, lim)
	if diff := res.RetryAfter - due; diff < -time.Millisecond || diff > time.Millisecond {
		t.Errorf("%s: RetryAfter %v, Redis holds the token in %v: off by %v, more than 1ms", what, res.RetryAfter, due, diff)
	}
}

// dueIn returns how long the Redis bucket of key, refilled at lim's rate
// from its last write to now, takes to hold one token (0 if it does): Redis
// TIME is the test's clock.
func dueIn(t *testing.T, m *miniredis.Miniredis, key string, lim hybrid.Limit) time.Duration {
	t.Helper()
	tokens := tokensIn(t, m, key)
	_, ts, _, err := redistest.MiniBucket(m, "hybrid:{"+key+"}")
	if err != nil {
		t.Fatalf("bucket %s: %v", key, err)
	}
	elapsed := time.Now().UnixMicro() - ts
	rate := int64(lim.Rate * micro)
	tokens = min(tokens+elapsed*rate/1e6, lim.Burst*micro)
	if tokens >= micro {
		return 0
	}
	return time.Duration(float64(micro-tokens) / float64(rate) * float64(time.Second))
}

// TestRetryAfterAloneComposite: a lease key that one instance of a fleet
// of 4 asks alone, through AllowAll (with another key, in one script call)
// and Allow in turns, is paced as alone: each denial's RetryAfter is within
// 1 ms of when Redis holds the token. A composite reply is observed as any
// other, before it sets the key's view (Reconciler.Observe).
func TestRetryAfterAloneComposite(t *testing.T) {
	lim := hybrid.Limit{Rate: 100, Burst: 10}
	inFleet(t, 4, hybrid.Config{}, func(t *testing.T, f *fleet) {
		settle(time.Second) // the instances count one another
		l := f.lims[3]
		ctx := context.Background()
		var denials int
		for i := range 300 {
			if i%3 == 0 {
				d, err := l.AllowAll(ctx, hybrid.Check{Tier: "a", Key: "k", Limit: lim}, hybrid.Check{Tier: "b", Key: "other", Limit: lim})
				if err != nil {
					t.Fatal(err)
				}
				if !d.Allowed {
					time.Sleep(d.Result().RetryAfter)
				}
				continue
			}
			res, err := l.Allow(ctx, "k", lim)
			if err != nil {
				t.Fatal(err)
			}
			if res.Allowed {
				continue
			}
			denials++
			retryWithin(t, f, "k", lim, res, fmt.Sprintf("request %d", i))
			time.Sleep(res.RetryAfter)
		}
		if denials == 0 {
			t.Fatal("no denial: the key was not saturated")
		}
		t.Logf("%d denials", denials)
	})
}
