package hybrid_test

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/internal/redistest"
)

// An outage with key churn: more keys than Config.MaxKeys, asked round-robin
// by a fleet whose Redis is unreachable from the start, or is killed
// mid-run. Each key's entry is evicted and made again many times during the
// outage; the fallback's shares must hold all the same, each key admitting
// at most B + R*T across the fleet over the run (plus, for an Optimistic
// key, what its mode may overshoot while Redis was up).

// churnKeys returns the keys a churn test asks: def, or HYBRID_CHURN_KEYS.
func churnKeys(t *testing.T, def int) int {
	s := os.Getenv("HYBRID_CHURN_KEYS")
	if s == "" {
		return def
	}
	keys, err := strconv.Atoi(s)
	if err != nil || keys < 20 {
		t.Fatalf("HYBRID_CHURN_KEYS=%q: want a number of keys, at least 20", s)
	}
	return keys
}

// churnFleet asks keys keys round-robin, passes times, through lims, each
// with workers goroutines, and adds what each key was admitted to admitted
// and the fallback's admissions to fallback.
func churnFleet(ctx context.Context, lims []*hybrid.Limiter, workers, keys, passes int, lim hybrid.Limit, admitted []atomic.Int64, fallback, errs *atomic.Int64) {
	var wg sync.WaitGroup
	for _, l := range lims {
		var next atomic.Int64
		for range workers {
			wg.Go(func() {
				for i := next.Add(1) - 1; i < int64(keys*passes); i = next.Add(1) - 1 {
					k := int(i) % keys
					res, err := l.Allow(ctx, "k"+strconv.Itoa(k), lim)
					switch {
					case err != nil:
						errs.Add(1)
					case res.Allowed:
						admitted[k].Add(1)
						if res.Source == hybrid.SourceFallback {
							fallback.Add(1)
						}
					}
				}
			})
		}
	}
	wg.Wait()
}

func TestOutageChurn(t *testing.T) {
	keys := churnKeys(t, 2000)
	passes := 10
	if s := os.Getenv("HYBRID_CHURN_PASSES"); s != "" {
		var err error
		if passes, err = strconv.Atoi(s); err != nil || passes < 2 {
			t.Fatalf("HYBRID_CHURN_PASSES=%q: want a number of passes, at least 2", s)
		}
	}
	const (
		instances = 4
		workers   = 4
	)
	// static: Redis down, the Static fallback; fits: Redis down, MaxKeys
	// above the keys (no churn); killed: Redis killed after one pass.
	static := hybrid.Limit{Rate: 1.0 / 60, Burst: 2}
	for _, start := range []string{"down", "fits", "static", "killed"} {
		for _, mode := range []hybrid.Mode{hybrid.Lease, hybrid.Optimistic, hybrid.Exact} {
			t.Run(start+"/"+mode.String(), func(t *testing.T) {
				// Killed mid-run, a key's bucket holds three quarters of
				// its burst when Redis goes: the outage's shares start from
				// that, which an entry made again no longer knows.
				lim := hybrid.Limit{Rate: 1.0 / 60, Burst: 5, Mode: mode}
				if start == "killed" {
					lim.Burst = 20
				}
				ctx := context.Background()
				var proc *redistest.Proc
				addr := redistest.ClosedAddr(t)
				if start == "killed" {
					proc = redistest.Server(t)
					addr = proc.Addr()
				}
				cfg := hybrid.Config{Prefix: "churn-out", MaxKeys: keys / 20, Instances: instances}
				switch start {
				case "fits":
					cfg.MaxKeys = 2 * keys
				case "static":
					cfg.Fallback = hybrid.Static(static)
				}
				lims := make([]*hybrid.Limiter, instances)
				for i := range lims {
					rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
					t.Cleanup(func() { rdb.Close() })
					l, err := hybrid.New(rdb, cfg)
					if err != nil {
						t.Fatal(err)
					}
					lims[i] = l
				}
				admitted := make([]atomic.Int64, keys)
				var errs, fallback atomic.Int64
				begin := time.Now()
				var bound int64    // what the run may admit beyond B + R*T
				var before []int64 // what each key admitted before the kill
				if start == "killed" {
					churnFleet(ctx, lims, workers, keys, 1, lim, admitted, &fallback, &errs)
					bound = lims[0].Overshoot(lim)
					if err := proc.Kill(); err != nil {
						t.Fatal(err)
					}
					before = make([]int64, keys)
					for k := range before {
						before[k] = admitted[k].Load()
					}
				}
				churnFleet(ctx, lims, workers, keys, passes, lim, admitted, &fallback, &errs)
				elapsed := time.Since(begin)
				most := float64(lim.Burst) + lim.Rate*elapsed.Seconds() + float64(bound)
				if start == "static" { // the static limit, per instance
					most = instances * (float64(static.Burst) + static.Rate*elapsed.Seconds())
				}
				worst, total, over, strict := int64(0), int64(0), 0, 0
				for k := range admitted {
					n := admitted[k].Load()
					total += n
					worst = max(worst, n)
					// Each instance's share starts from its own last view
					// of the bucket: what the others took from it after
					// that view is counted in its share again, at most
					// (N-1)/N of what the fleet took before the kill (a
					// lease of the need of a key's first request: what it
					// admitted), charged as debt once Redis is back
					// (docs/accuracy.md, "Outages and the debt").
					stale := 0.0
					if before != nil {
						stale = float64(before[k]) * (instances - 1) / instances
					}
					if float64(n) > most+stale {
						over++
					}
					if float64(n) > most {
						strict++
					}
				}
				runtime.GC()
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				if path := os.Getenv("HYBRID_HEAPPROFILE"); path != "" {
					writeHeapProfile(t, path)
				}
				var ledger hybrid.Stats
				for _, l := range lims {
					st := l.Stats()
					if !st.Degraded {
						t.Errorf("after the outage's passes: Degraded false, want true")
					}
					ledger.Ledger.Keys += st.Ledger.Keys
					ledger.Ledger.Bytes += st.Ledger.Bytes
					ledger.Ledger.Unknown += st.Ledger.Unknown
					ledger.Ledger.Dropped += st.Ledger.Dropped
					ledger.FallbackCrowded += st.FallbackCrowded
					ledger.Reconcile.Orphans += st.Reconcile.Orphans
					ledger.Reconcile.InFlight += st.Reconcile.InFlight
				}
				t.Logf("%s, %d keys (MaxKeys %d) x %d passes x %d instances in %v: %d admitted (%d by the fallback), the most for one key %d (bound %.2f); ledgers: %d records, %d bytes, %d dropped, %d unknown; heap %.1f MiB; %d orphans, %d in flight, %d denied crowded",
					start, keys, cfg.MaxKeys, passes, instances, elapsed.Round(time.Millisecond), total, fallback.Load(), worst, most,
					ledger.Ledger.Keys, ledger.Ledger.Bytes, ledger.Ledger.Dropped, ledger.Ledger.Unknown, float64(ms.HeapAlloc)/(1<<20), ledger.Reconcile.Orphans, ledger.Reconcile.InFlight, ledger.FallbackCrowded)
				if errs.Load() > 0 {
					t.Errorf("%d decisions failed", errs.Load())
				}
				if over > 0 {
					t.Errorf("%d keys admitted more than B + R*T + %d = %.2f, and what the shares' views did not see (the most: %d)", over, bound, most, worst)
				}
				if strict > 0 {
					t.Logf("%d keys admitted more than B + R*T + %d = %.2f: shares seeded from views the others' takes had made stale", strict, bound, most)
				}
				var decided uint64
				for _, l := range lims {
					st := l.Stats()
					decided += st.FallbackAllowed + st.FallbackDenied
				}
				if decided == 0 {
					t.Errorf("the fallback decided nothing: the outage was not one")
				}
				if start == "killed" {
					// Redis back: the breakers close, and the rounds charge
					// what the fallback admitted, the evicted keys' dues
					// included, before Close has anything to do.
					if err := proc.Restart(); err != nil {
						t.Fatal(err)
					}
					for i, l := range lims {
						charged := pollUntil(20*time.Second, 10*time.Millisecond, func() bool {
							st := l.Stats()
							return !st.Degraded && st.Reconcile.Unsettled == 0 && st.Reconcile.Orphans == 0 && st.Reconcile.InFlight == 0
						})
						if st := l.Stats(); !charged {
							t.Errorf("instance %d, 20 s after Redis came back: Degraded %v, %d micro-tokens unsettled, %d orphans, %d in flight; want all charged",
								i, st.Degraded, st.Reconcile.Unsettled, st.Reconcile.Orphans, st.Reconcile.InFlight)
						}
					}
				}
				wait := 10 * time.Second
				if start != "killed" {
					wait = 100 * time.Millisecond // nothing can be settled
				}
				cctx, cancel := context.WithTimeout(ctx, wait)
				defer cancel()
				for i, l := range lims {
					err := l.Close(cctx)
					if start == "killed" && err != nil {
						t.Errorf("instance %d: Close: %v", i, err)
					}
					if st := l.Stats(); start == "killed" && (st.Reconcile.Unsettled != 0 || st.Reconcile.Orphans != 0) {
						t.Errorf("instance %d: after Close with Redis back, %d micro-tokens unsettled and %d orphans, want all charged", i, st.Reconcile.Unsettled, st.Reconcile.Orphans)
					}
				}
			})
		}
	}
}
