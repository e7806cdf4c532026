package hybrid_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/hybridlimit/hybrid"
)

// The accuracy grid: every limit of rate x burst, in fleets of 1, 4 and 8
// instances, in lease and optimistic modes, each run in a synctest bubble on
// miniredis (Redis TIME on the bubble's clock), so that every point is
// deterministic in time. At each point:
//
//   - a flood: every instance asks for the key from 4 goroutines, four times
//     as fast as the limit gives (its burst over the run and its rate), and
//     at least 200 requests a second, for T. Lease admits at most B + R*T and at least 95% of it with one
//     instance, 90% with more (or of what x/time/rate admits of the same
//     requests, if less: a tiny burst refills nothing while it is full); optimistic stays within its documented bound
//     (Limiter.Overshoot), and within B + R*T plus one interval's refill
//     with one instance. The fleet's Redis calls for keys (rounds and
//     fetches) are counted: never more than one per decision, what exact
//     mode would send for the same requests.
//   - one waiter: a goroutine calling Wait on another key of one instance
//     for T gets at least 90% of what golang.org/x/time/rate's Wait gets for
//     the same limit, in the same bubble, in both modes (an optimistic key
//     that one instance asks for alone is granted the bucket: see
//     reconcile.Reconciler.Others).
//   - key churn: 16 keys asked round-robin through a store of 4 entries per
//     instance, twice as fast as the limit gives each (at most 8,000
//     requests in all): no key above its bound (as the flood's).
//
// A bubble's round trips take no time, and its callers cannot saturate the
// CPUs: TestSmallBurst and TestStorm run the flood on a real redis-server.
// Unless HYBRID_GRID=full, a part of the grid runs (gridShort): all of it
// takes about ten minutes.

// gridRates, gridBursts and gridFleets span the grid.
var (
	gridRates  = []float64{1, 10, 100, 1000, 10000}
	gridBursts = []int64{1, 10, 100, 1000}
	gridFleets = []int{1, 4, 8}
)

// gridPointID names a point of the grid, in both modes.
type gridPointID struct {
	rate  float64
	burst int64
	n     int
}

// gridShort is the part of the grid that runs unless HYBRID_GRID=full: the
// corners, and the small burst at a high rate.
var gridShort = []gridPointID{
	{1, 1, 1}, {1, 1, 8}, {1, 1000, 1}, {1, 1000, 8},
	{1000, 10, 1}, {1000, 10, 8},
	{10000, 1, 1}, {10000, 1000, 8},
}

// gridRow is what one point measured.
type gridRow struct {
	mode        hybrid.Mode
	lim         hybrid.Limit
	instances   int
	flood       float64 // admitted / (B + R*T)
	peer        float64 // admitted / what x/time/rate admitted of the same requests
	callsPerSec float64 // Redis calls for keys per second, the fleet's, during the flood
	perDecision float64 // Redis calls per decision
	wait        float64 // one waiter's tokens / x/time/rate's
	churnWorst  float64 // the most any churned key admitted / its bound
}

func TestGrid(t *testing.T) {
	if raceEnabled {
		t.Skip("the grid's floods take minutes under the race detector: .ci/run runs it without")
	}
	full := os.Getenv("HYBRID_GRID") == "full"
	if !full {
		t.Log("a part of the grid: HYBRID_GRID=full runs all of it")
	}
	var rows []gridRow
	for _, mode := range []hybrid.Mode{hybrid.Lease, hybrid.Optimistic} {
		for _, r := range gridRates {
			for _, b := range gridBursts {
				for _, n := range gridFleets {
					if !full && !slices.Contains(gridShort, gridPointID{r, b, n}) {
						continue
					}
					lim := hybrid.Limit{Rate: r, Burst: b, Mode: mode}
					t.Run(fmt.Sprintf("%v/%v-per-s/burst-%d/%d", mode, r, b, n), func(t *testing.T) {
						rows = append(rows, gridPoint(t, lim, n))
					})
				}
			}
		}
	}
	var sb strings.Builder
	sb.WriteString("\n| mode | rate/s | burst | instances | flood: admitted / B+R*T | / x/time/rate | Redis calls/s | per decision | one Wait / x/time/rate | churn: worst key / bound |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&sb, "| %v | %v | %d | %d | %.1f%% | %.1f%% | %.0f | %.3f | %.1f%% | %.1f%% |\n",
			r.mode, r.lim.Rate, r.lim.Burst, r.instances, 100*r.flood, 100*r.peer, r.callsPerSec, r.perDecision, 100*r.wait, 100*r.churnWorst)
	}
	t.Log(sb.String())
}

// gridRun is how long a point's flood and waiter run: 1s, or long enough
// for 20 tokens of refill.
func gridRun(lim hybrid.Limit) time.Duration {
	return max(time.Second, time.Duration(20/lim.Rate*float64(time.Second)))
}

// gridPoint measures lim in a fleet of n.
func gridPoint(t *testing.T, lim hybrid.Limit, n int) gridRow {
	row := gridRow{mode: lim.Mode, lim: lim, instances: n}
	inFleet(t, n, hybrid.Config{}, func(t *testing.T, f *fleet) {
		settle(time.Second) // heartbeats: every instance counts the fleet
		d := gridRun(lim)
		ideal := func(d time.Duration) float64 { return float64(lim.Burst) + lim.Rate*d.Seconds() }
		over := float64(f.lims[0].Overshoot(lim))
		if lim.Mode == hybrid.Optimistic && n == 1 {
			over = min(over, lim.Rate*interval.Seconds())
		}

		// The flood: four times the limit, and at least 200 requests a
		// second, so that a token waits 5ms at most for a request.
		before := settlements(f)
		admitted, peer, decisions, elapsed := flood(t, f, "flood", lim, max(4*ideal(d)/d.Seconds(), 200), d)
		row.flood = float64(admitted) / ideal(elapsed)
		row.peer = float64(admitted) / float64(peer)
		commands := settlements(f) - before
		row.callsPerSec = float64(commands) / elapsed.Seconds()
		row.perDecision = float64(commands) / float64(decisions)
		least := 0.9
		if n == 1 {
			least = 0.95
		}
		switch {
		case float64(admitted) > ideal(elapsed)+over:
			t.Errorf("flood: admitted %d, above B+R*T %.1f + %.1f", admitted, ideal(elapsed), over)
		case lim.Mode == hybrid.Lease && float64(admitted) < least*min(math.Floor(ideal(elapsed)), float64(peer)):
			t.Errorf("flood: admitted %d, under %.0f%% of B+R*T %.1f (floored) or of x/time/rate's %d", admitted, 100*least, ideal(elapsed), peer)
		}
		if commands > decisions {
			t.Errorf("flood: %d Redis calls for %d decisions, more than exact mode's one a decision", commands, decisions)
		}

		// One waiter, beside x/time/rate's.
		ours, theirs := waiter(t, f.lims[0], "waiter", lim, d)
		row.wait = float64(ours) / float64(theirs)
		if float64(ours) < 0.9*float64(theirs) {
			t.Errorf("one waiter: %d tokens, under 90%% of x/time/rate's %d", ours, theirs)
		}

		// Key churn.
		row.churnWorst = churn(t, f, lim, d, over)
		t.Logf("flood %d of B+R*T %.1f (%.1f%%; x/time/rate %d) in %d decisions, %.0f Redis calls/s (%.3f a decision); one waiter %d, x/time/rate %d; churn: worst key at %.1f%% of its bound",
			admitted, ideal(elapsed), 100*row.flood, peer, decisions, row.callsPerSec, row.perDecision, ours, theirs, 100*row.churnWorst)
	})
	return row
}

// settlements returns the Redis calls f's instances made for keys: rounds
// and fetches (heartbeats, which every mode sends alike, are not counted).
func settlements(f *fleet) int64 {
	var n uint64
	for _, l := range f.lims {
		st := l.Stats().Reconcile
		n += st.Rounds + st.Fetches
	}
	return int64(n)
}

// flood asks for key under lim from 4 goroutines on each instance of f,
// perSec requests a second in all, evenly spread, for d, and returns the
// tokens admitted, those that one golang.org/x/time/rate limiter asked at the
// same moments admitted, the decisions made and the time from the first
// request to the last. Requests that come at intervals let a full bucket
// refill nothing until the next one: x/time/rate's count is what a limiter
// with no round trips admits of them.
func flood(t *testing.T, f *fleet, key string, lim hybrid.Limit, perSec float64, d time.Duration) (admitted, peer, decisions int64, elapsed time.Duration) {
	const workers = 4
	all := len(f.lims) * workers
	gap := time.Duration(float64(all) / perSec * float64(time.Second))
	ideal := rate.NewLimiter(rate.Limit(lim.Rate), int(lim.Burst))
	var adm, dec, errs, peers atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(d)
	for i, l := range f.lims {
		for w := range workers {
			wg.Go(func() {
				time.Sleep(gap * time.Duration(i*workers+w) / time.Duration(all))
				for time.Now().Before(end) {
					if ideal.Allow() {
						peers.Add(1)
					}
					res, err := l.Allow(context.Background(), key, lim)
					dec.Add(1)
					switch {
					case err != nil:
						errs.Add(1)
					case res.Allowed:
						adm.Add(1)
						if res.Source == hybrid.SourceFallback {
							t.Errorf("the fallback decided on a healthy Redis")
						}
					}
					time.Sleep(gap)
				}
			})
		}
	}
	wg.Wait()
	if errs.Load() > 0 {
		t.Errorf("flood: %d decisions failed", errs.Load())
	}
	return adm.Load(), peers.Load(), dec.Load(), time.Since(start) - gap
}

// waiter runs Wait on key under lim on l, and x/time/rate's Wait for the
// same limit, side by side for d, and returns the tokens each got.
func waiter(t *testing.T, l *hybrid.Limiter, key string, lim hybrid.Limit, d time.Duration) (ours, theirs int64) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	peer := rate.NewLimiter(rate.Limit(lim.Rate), int(lim.Burst))
	var wg sync.WaitGroup
	wg.Go(func() {
		for l.Wait(ctx, key, lim) == nil {
			ours++
		}
	})
	wg.Go(func() {
		for peer.Wait(ctx) == nil {
			theirs++
		}
	})
	wg.Wait()
	return ours, theirs
}

// churn asks for 16 keys round-robin on every instance of f, through stores
// of 4 entries, twice as fast as lim gives each key, for d, and returns the
// most any key admitted over its bound, B + R*T + over.
func churn(t *testing.T, f *fleet, lim hybrid.Limit, d time.Duration, over float64) float64 {
	const keys = 16
	cf := &fleet{m: f.m}
	for i := range len(f.lims) {
		cf.add(t, hybrid.Config{MaxKeys: 4, Prefix: "churn"}, fmt.Sprintf("churn-%d", i))
	}
	defer cf.close(t)
	settle(time.Second)
	// Twice the limit of each key, at most 8,000 requests in all.
	perKey := min(2*(float64(lim.Burst)/d.Seconds()+lim.Rate), 8000/(keys*d.Seconds()))
	gap := time.Duration(float64(len(cf.lims)) / (keys * perKey) * float64(time.Second))
	var admitted [keys]atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(d)
	for i, l := range cf.lims {
		wg.Go(func() {
			time.Sleep(gap * time.Duration(i) / time.Duration(len(cf.lims)))
			for k := 0; time.Now().Before(end); k++ {
				res, err := l.Allow(context.Background(), fmt.Sprintf("c%d", k%keys), lim)
				if err != nil {
					t.Errorf("churn: %v", err)
					return
				}
				if res.Allowed {
					admitted[k%keys].Add(1)
				}
				time.Sleep(gap)
			}
		})
	}
	wg.Wait()
	bound := float64(lim.Burst) + lim.Rate*time.Since(start).Seconds() + over
	worst := 0.0
	for k := range admitted {
		if got := float64(admitted[k].Load()); got > bound {
			t.Errorf("churn: key c%d admitted %.0f, above B+R*T+E %.1f", k, got, bound)
		} else {
			worst = max(worst, got/bound)
		}
	}
	return worst
}
