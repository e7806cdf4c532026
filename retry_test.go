package hybrid_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/internal/redistest"
)

// TestRetryAfterAlone: in a fleet, a key that one instance alone asks for is
// paced for one instance, not for the fleet: a lease denial's RetryAfter is
// within 1 ms of when the global bucket, refilled since, holds the token
// (as Redis itself says), and honoured, it admits. The key is saturated: its
// caller asks again as soon as it is told to, for 200 decisions. Before the
// key's askers were counted, a fleet of 8 at 1000/s burst 10 told its lone
// caller to wait about 5 ms for a token due in 1.
func TestRetryAfterAlone(t *testing.T) {
	for _, n := range []int{1, 4, 8} {
		for _, lim := range []hybrid.Limit{{Rate: 1000, Burst: 10}, {Rate: 100, Burst: 100}, {Rate: 10, Burst: 1}} {
			t.Run(fmt.Sprintf("%d/%v-per-s/burst-%d", n, lim.Rate, lim.Burst), func(t *testing.T) {
				inFleet(t, n, hybrid.Config{}, func(t *testing.T, f *fleet) {
					settle(time.Second) // the instances count one another
					l := f.lims[n-1]
					ctx := context.Background()
					var denials, admitted int
					for range 200 {
						res, err := l.Allow(ctx, "k", lim)
						if err != nil {
							t.Fatal(err)
						}
						if res.Allowed {
							admitted++
							continue
						}
						denials++
						retryWithin(t, f, "k", lim, res, fmt.Sprintf("denial %d", denials))
						time.Sleep(res.RetryAfter)
						if res, err := l.Allow(ctx, "k", lim); err != nil || !res.Allowed {
							t.Errorf("denial %d: Allow after RetryAfter %v = %+v, %v, want allowed", denials, res.RetryAfter, res, err)
						} else {
							admitted++
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
