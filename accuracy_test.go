package hybrid_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/hybridlimit/hybrid"
)

// The accuracy tests run a fleet in a synctest bubble, so time is fully
// controlled: Redis TIME follows the bubble's clock, and every instance's
// requests arrive on a fixed schedule. TestAccuracyHotKey and
// TestAccuracyZipf skip themselves under the race detector, as TestGrid
// does (each takes 40-50 s there, 12 s without): .ci/run runs them without.

// TestAccuracyHotKey: 8 instances, one key, R=100/s B=100, demand 4x the
// limit spread over the instances, 60 simulated seconds. Lease admits at most
// B+R*T and at least 98% of it; Optimistic stays within its documented bound.
func TestAccuracyHotKey(t *testing.T) {
	if raceEnabled {
		t.Skip("its fleet takes most of a minute under the race detector: .ci/run runs it without")
	}
	for _, mode := range []hybrid.Mode{hybrid.Lease, hybrid.Optimistic} {
		t.Run(mode.String(), func(t *testing.T) {
			m := miniredis.RunT(t)
			synctest.Test(t, func(t *testing.T) {
				const (
					instances = 8
					rate      = 100
					burst     = 100
					d         = 60 * time.Second
				)
				lim := hybrid.Limit{Rate: rate, Burst: burst, Mode: mode}
				f := newFleet(t, m, instances, hybrid.Config{})
				time.Sleep(time.Second) // heartbeats: every instance counts the fleet
				var c tally
				gap := time.Second * instances / (4 * rate) // 4x the limit over the fleet
				drive(f, "hot", lim, gap, d, &c, nil)
				c.check(t)
				ideal := float64(burst + rate*d.Seconds())
				got := float64(c.allowed.Load())
				bound := ideal
				if mode == hybrid.Optimistic {
					bound += float64(f.lims[0].Overshoot(lim))
				}
				t.Logf("admitted %v of %v requests: ideal B+R*T = %v, bound %v (%.2f%%); Redis commands %d (%.4f per decision); sources %v",
					got, c.allowed.Load()+c.denied.Load(), ideal, bound, 100*got/ideal, f.commands(),
					float64(f.commands())/float64(c.allowed.Load()+c.denied.Load()), sources(&c))
				noFaults(t, f)
				if got > bound {
					t.Errorf("admitted %v, more than %v", got, bound)
				}
				if got < 0.98*ideal {
					t.Errorf("admitted %v, less than 98%% of %v", got, ideal)
				}
				f.close(t)
			})
		})
	}
}

// TestAccuracyZipf: 8 instances, 1,000 keys asked for with a Zipf
// distribution, each key limited to R=10/s B=20, 20 simulated seconds. Every
// key stays within its bound, and the keys asked for at 4x their limit or
// more get at least 90% of it.
func TestAccuracyZipf(t *testing.T) {
	if raceEnabled {
		t.Skip("its fleet takes most of a minute under the race detector: .ci/run runs it without")
	}
	for _, mode := range []hybrid.Mode{hybrid.Lease, hybrid.Optimistic} {
		t.Run(mode.String(), func(t *testing.T) {
			m := miniredis.RunT(t)
			synctest.Test(t, func(t *testing.T) {
				const (
					instances = 8
					keys      = 1000
					rate      = 10
					burst     = 20
					d         = 20 * time.Second
					gap       = 4 * time.Millisecond // 250 requests/s per instance
				)
				lim := hybrid.Limit{Rate: rate, Burst: burst, Mode: mode}
				f := newFleet(t, m, instances, hybrid.Config{})
				time.Sleep(time.Second)
				// Each instance draws its keys from its own seeded Zipf.
				zipfs := make([]*rand.Zipf, instances)
				for i := range zipfs {
					zipfs[i] = rand.NewZipf(rand.New(rand.NewPCG(uint64(i), 42)), 1.1, 1, keys-1)
				}
				var c tally
				drive(f, "", lim, gap, d, &c, func(inst, n int) string {
					return fmt.Sprint("key-", zipfs[inst].Uint64())
				})
				c.check(t)
				noFaults(t, f)
				ideal := float64(burst + rate*d.Seconds())
				bound := ideal + float64(f.lims[0].Overshoot(lim))
				f.close(t)
				var hot, hotAdmitted, hotIdeal, over float64
				worst := 1.0
				for k, asked := range c.asked {
					got := float64(c.admitted[k])
					if got > bound {
						t.Errorf("key %s: admitted %v, more than %v", k, got, bound)
					}
					over = max(over, got-ideal)
					if float64(asked) >= 4*ideal {
						hot++
						hotAdmitted += got
						hotIdeal += ideal
						worst = min(worst, got/ideal)
					}
				}
				t.Logf("%d keys asked for, %v at 4x their limit or more: they got %.2f%% of B+R*T (worst key %.2f%%); largest excess over B+R*T %v (bound %v); Redis commands %d for %d decisions",
					len(c.asked), hot, 100*hotAdmitted/hotIdeal, 100*worst, over, bound-ideal, f.commands(), c.allowed.Load()+c.denied.Load())
				if hot == 0 {
					t.Fatal("no key was asked for at 4x its limit: the test tests nothing")
				}
				if hotAdmitted < 0.98*hotIdeal {
					t.Errorf("the keys at 4x their limit got %.2f%% of B+R*T, want at least 98%%", 100*hotAdmitted/hotIdeal)
				}
			})
		})
	}
}

// noFaults fails the test if an instance of f fell back or failed to
// settle something in a run without faults.
func noFaults(t *testing.T, f *fleet) {
	t.Helper()
	for i, l := range f.lims {
		st := l.Stats()
		if st.FallbackAllowed+st.FallbackDenied+st.Reconcile.KeyErrors+st.Reconcile.RoundErrors+st.Reconcile.FetchErrors+st.Reconcile.HeartbeatErrors > 0 {
			t.Errorf("instance %d had errors or fell back with no fault: %+v", i, st)
		}
	}
}

func sources(c *tally) map[string]int64 {
	return map[string]int64{
		"local":    c.bySource[hybrid.SourceLocal].Load(),
		"redis":    c.bySource[hybrid.SourceRedis].Load(),
		"fallback": c.bySource[hybrid.SourceFallback].Load(),
	}
}

// TestBudgetGrantedOnce: an optimistic key's budget is never granted twice
// for the same tokens. One instance, R=50/s B=500, a fresh key:
//
//  1. 16 goroutines ask for it at once, 6 times each: only the first
//     request is admitted on trust, the others share one fetch of the
//     bucket and spend the budget it sets;
//  2. a settlement round charges those 96, and while its reply is on its
//     way (the link delays it) the rest of the budget is spent. The
//     reply's bucket does not hold that spending yet: the budget it sets
//     counts it, so the key admits at most B + R*T (+ one interval's
//     refill), not a second burst.
func TestBudgetGrantedOnce(t *testing.T) {
	const rate, burst = 50, 500
	lim := hybrid.Limit{Rate: rate, Burst: burst, Mode: hybrid.Optimistic}
	inFleet(t, 1, hybrid.Config{Instances: 1}, func(t *testing.T, f *fleet) {
		l := f.lims[0]
		start := time.Now()
		var admitted atomic.Int64
		spend := func(most int) { // until denied
			for range most {
				res, err := l.Allow(context.Background(), "k", lim)
				if err != nil {
					t.Error(err)
					return
				}
				if !res.Allowed {
					return
				}
				admitted.Add(1)
			}
		}
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() { spend(6) })
		}
		wg.Wait()
		if n := admitted.Load(); n != 96 {
			t.Fatalf("16 x 6 first requests at once admitted %d, want all 96", n)
		}
		time.Sleep(interval - 2*time.Millisecond - time.Since(start)) // just before the first round
		f.links[0].delay.Store(int64(20 * time.Millisecond))
		time.Sleep(5 * time.Millisecond) // the round is on its way, held by the link
		synctest.Wait()
		spend(2 * burst)                  // the rest of the budget, spent after the round took the 96
		time.Sleep(20 * time.Millisecond) // its reply is applied
		synctest.Wait()
		f.links[0].delay.Store(0)
		spend(2 * burst)
		elapsed := time.Since(start)
		most := burst + rate*elapsed.Seconds() + rate*interval.Seconds()
		if n := admitted.Load(); float64(n) > most {
			t.Errorf("admitted %d in %v, want at most B + R*T + R*I = %.1f", n, elapsed, most)
		} else {
			t.Logf("admitted %d in %v (B + R*T = %.1f)", n, elapsed, burst+rate*elapsed.Seconds())
		}
		// The race: a round charging the key while the budget is spent
		// (or, when the round comes late, behind a heartbeat held by the
		// link, a fetch charging it on its way while the round comes,
		// which leaves the key to the next round).
		if st := l.Stats(); st.Reconcile.Rounds == 0 && st.Reconcile.Fetches < 2 {
			t.Errorf("no settlement was on its way while the budget was spent: the test did not make the race")
		}
	})
}
