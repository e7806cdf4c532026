package rls_test

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/envoyrls/rls"
	"github.com/hybridlimit/hybrid/internal/redistest"
)

// The integration tests run service instances, each a Limiter with a
// Server of its own on its own loopback port, against a real redis-server
// (internal/redistest), and ask them over gRPC. They skip when
// redis-server is not installed, and fail instead when
// HYBRID_REQUIRE_REDIS=1. Load is paced with tickers, and the faults come
// on a schedule: that is load generation, not synchronisation.

// fleetYAML is the limit the fleet shares: 100 a second, so B = 100 and R
// = 100/s.
const fleetYAML = `
domain: fleet
descriptors:
  - key: api
    rate_limit: {unit: second, requests_per_unit: 100}
`

// Its burst and rate.
const (
	fleetBurst = 100
	fleetRate  = 100.0
)

// instance is one service instance: a Limiter on its own client, and a
// gRPC client of its Server.
type instance struct {
	lim *hybrid.Limiter
	c   rlspb.RateLimitServiceClient
}

// newFleet starts n instances on the Redis at addr, closed when t ends.
// Their clients give up on a dead server fast, send nothing twice, and
// honour the deadlines of the Limiter's calls, as the library's own
// integration tests' do.
func newFleet(t *testing.T, addr string, n int) []*instance {
	t.Helper()
	rules := rls.NewRules(load(t, fleetYAML))
	fleet := make([]*instance, n)
	for i := range fleet {
		const netTimeout = 50 * time.Millisecond
		rdb := redis.NewClient(&redis.Options{
			Addr:                     addr,
			Dialer:                   redistest.LoopbackDialer(netTimeout),
			MaxRetries:               -1,
			DialTimeout:              netTimeout,
			ReadTimeout:              netTimeout,
			WriteTimeout:             netTimeout,
			ContextTimeoutEnabled:    true,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		})
		lim, err := hybrid.New(rdb, hybrid.Config{InstanceID: "rls-" + strconv.Itoa(i)})
		if err != nil {
			rdb.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := lim.Close(ctx); err != nil {
				t.Logf("instance %d: Close: %v", i, err)
			}
			rdb.Close()
		})
		fleet[i] = &instance{lim: lim, c: serve(t, newServer(t, lim, rules, rls.Config{}))}
	}
	return fleet
}

// outcome is one call of the load.
type outcome struct {
	inst     int
	start    time.Time
	took     time.Duration
	admitted bool
	err      error
}

// hammer asks the fleet about one descriptor, workers goroutines per
// instance, each a call every period, for d; at each of the times in
// schedule after the start it calls the matching func. It returns every
// call's outcome, and the time from the first call sent to the last answer.
func hammer(fleet []*instance, workers int, period, d time.Duration, schedule map[time.Duration]func()) ([]outcome, time.Duration) {
	var (
		mu  sync.Mutex // protects all
		all []outcome
		wg  sync.WaitGroup
	)
	start := time.Now()
	end := start.Add(d)
	for i, in := range fleet {
		for range workers {
			wg.Go(func() {
				tick := time.NewTicker(period)
				defer tick.Stop()
				var mine []outcome
				for now := range tick.C {
					if now.After(end) {
						break
					}
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					t0 := time.Now()
					resp, err := in.c.ShouldRateLimit(ctx, req("fleet", desc("api", "shared")))
					cancel()
					mine = append(mine, outcome{inst: i, start: t0, took: time.Since(t0), admitted: err == nil && resp.GetOverallCode() == rlspb.RateLimitResponse_OK, err: err})
				}
				mu.Lock()
				all = append(all, mine...)
				mu.Unlock()
			})
		}
	}
	at := slices.Sorted(func(yield func(time.Duration) bool) {
		for k := range schedule {
			if !yield(k) {
				return
			}
		}
	})
	for _, k := range at {
		<-time.After(time.Until(start.Add(k)))
		schedule[k]()
	}
	wg.Wait()
	return all, time.Since(start)
}

// summary counts the outcomes: admitted, errors, and the slowest call.
func summary(all []outcome) (admitted, errs int, slowest time.Duration, firstErr error) {
	for _, o := range all {
		if o.admitted {
			admitted++
		}
		if o.err != nil {
			if errs == 0 {
				firstErr = o.err
			}
			errs++
		}
		slowest = max(slowest, o.took)
	}
	return admitted, errs, slowest, firstErr
}

// TestFleet runs 3 instances on one Redis and asks all of them about one
// descriptor at 3 times its limit for 2 s: together they admit at most B +
// R*T (T measured by Redis's clock, lease mode being exact for the fleet),
// and at least 80% of it, every instance some of it, with no error.
func TestFleet(t *testing.T) {
	proc := redistest.Server(t)
	clock := redistest.Client(t, proc)
	fleet := newFleet(t, proc.Addr(), 3)
	const (
		workers = 2
		period  = 20 * time.Millisecond // 3 instances x 2 workers x 50/s = 3x the limit
		runFor  = 2 * time.Second
	)
	t1, err := clock.Time(t.Context()).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	all, _ := hammer(fleet, workers, period, runFor, nil)
	t2, err := clock.Time(t.Context()).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	admitted, errs, slowest, firstErr := summary(all)
	window := t2.Sub(t1)
	ideal := fleetBurst + fleetRate*window.Seconds()
	t.Logf("%d calls, %d admitted in %v (Redis TIME): B+R*T = %.1f, %.1f%% of it; slowest call %v",
		len(all), admitted, window, ideal, 100*float64(admitted)/ideal, slowest)
	if errs > 0 {
		t.Errorf("%d calls failed; the first: %v", errs, firstErr)
	}
	if float64(admitted) > ideal {
		t.Errorf("admitted %d, more than B+R*T = %.1f", admitted, ideal)
	}
	if float64(admitted) < 0.8*ideal {
		t.Errorf("admitted %d, less than 80%% of B+R*T = %.1f", admitted, ideal)
	}
	perInst := make([]int, len(fleet))
	for _, o := range all {
		if o.admitted {
			perInst[o.inst]++
		}
	}
	for i, n := range perInst {
		if n == 0 {
			t.Errorf("instance %d admitted nothing", i)
		}
	}
	t.Logf("admitted per instance %v", perInst)
}

// TestRedisKilled runs 3 instances on one Redis at 3 times the limit of
// one descriptor while Redis is killed (SIGKILL) and restarted empty:
// no call fails, the Limiters' fallback decides while Redis is down, the
// fleet admits again once it is back, and over the whole run it admits at
// most what docs/accuracy.md and docs/failure.md allow:
//
//	B + R*T   lease mode and the fallback's shares (LocalShare: each
//	          instance R/N, starting from its share of what it last saw
//	          the bucket hold), over the run;
//	+ B       the restarted Redis holds no data: its bucket starts full;
//	+ L       the leases the instances held when it lost them (at most
//	          B between them), spent once more;
//	+ N       a token of rounding per instance.
func TestRedisKilled(t *testing.T) {
	proc := redistest.Server(t)
	if !proc.Owned() {
		t.Skip("REDIS_ADDR names a server this test cannot kill")
	}
	fleet := newFleet(t, proc.Addr(), 3)
	const (
		workers   = 2
		period    = 20 * time.Millisecond
		killAt    = 1 * time.Second
		restartAt = 2500 * time.Millisecond
		runFor    = 4 * time.Second
	)
	var killed, restarted time.Time
	all, took := hammer(fleet, workers, period, runFor, map[time.Duration]func(){
		killAt: func() {
			killed = time.Now()
			if err := proc.Kill(); err != nil {
				t.Errorf("Kill: %v", err)
			}
		},
		restartAt: func() {
			if err := proc.Restart(); err != nil {
				t.Errorf("Restart: %v", err)
			}
			restarted = time.Now()
		},
	})
	admitted, errs, slowest, firstErr := summary(all)
	bound := 3*fleetBurst + fleetRate*took.Seconds() + float64(len(fleet))
	var during, after int
	for _, o := range all {
		switch {
		case !o.admitted:
		case o.start.After(killed) && o.start.Before(restarted):
			during++
		case o.start.After(restarted):
			after++
		}
	}
	t.Logf("%d calls in %v: %d admitted (%d while Redis was down, %d after the restart), bound 3B + R*T + N = %.1f; slowest call %v",
		len(all), took.Round(time.Millisecond), admitted, during, after, bound, slowest)
	for i, in := range fleet {
		st := in.lim.Stats()
		t.Logf("instance %d: fallback allowed %d, denied %d; breaker transitions %d; degraded now %t",
			i, st.FallbackAllowed, st.FallbackDenied, st.Reconcile.Transitions, st.Degraded)
	}
	if errs > 0 {
		t.Errorf("%d calls failed; the first: %v", errs, firstErr)
	}
	if float64(admitted) > bound {
		t.Errorf("admitted %d, more than the bound %.1f", admitted, bound)
	}
	var fallback uint64
	for _, in := range fleet {
		fallback += in.lim.Stats().FallbackAllowed
	}
	if fallback == 0 {
		t.Errorf("the fallback admitted nothing while Redis was down")
	}
	if after == 0 {
		t.Errorf("nothing admitted after the restart")
	}
}
