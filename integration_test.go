package hybrid_test

import (
	"bytes"
	"context"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/internal/redistest"
	"github.com/hybridlimit/hybrid/local"
)

// The integration tests run Limiters against real redis-server processes on
// loopback ports (internal/redistest). They skip when redis-server is not
// installed, and fail instead when HYBRID_REQUIRE_REDIS=1.
//
// Load is paced with tickers; that is load generation, not synchronisation.
// The tests wait for breaker transitions on channels fed by
// breaker.Config.OnStateChange. The other waits are bounded polls on a
// counter, because nothing signals them: the reconciler's round count, and
// the goroutine count after Close.

// Timeouts of the go-redis clients of the fleet test: a dead server is
// detected within one of them.
const itNetTimeout = 50 * time.Millisecond

// TestIntegrationLeaseFleet runs 4 instances on one hot key in lease mode, at
// 4x the limit, through a Redis crash (SIGKILL) and a restart with no data:
//
//  1. normal: the fleet admits at most B+R*T (T from Redis TIME) and at
//     least 90% of it;
//  2. outage: every decision is answered without an error, within a bounded
//     time, and in under 1 ms at the 99th percentile once the breaker is
//     open; the fallback (LocalShare) decides, within its own bound;
//  3. recovery: every breaker closes again, the outage's consumption is
//     charged to the new bucket, decisions come from the allowance and
//     Redis again, and admit again once the refill has paid what the
//     charges owe;
//
// and Close leaves no goroutine behind.
func TestIntegrationLeaseFleet(t *testing.T) {
	const (
		instances = 4
		workers   = 4 // goroutines per instance
		rate      = 200
		burst     = 100
		normalFor = 3 * time.Second
		outageFor = 2 * time.Second
		afterFor  = 500 * time.Millisecond // load after the fleet admits again
		stateWait = 5 * time.Second        // bound on waiting for a breaker transition
		roundWait = 2 * time.Second        // bound on waiting for a round after recovery
		leakWait  = 3 * time.Second        // bound on waiting for goroutines to end
		p99Bound  = time.Millisecond
		margin    = 250 * time.Millisecond
	)
	lim := hybrid.Limit{Rate: rate, Burst: burst, Mode: hybrid.Lease}
	// 4x the limit, spread over instances*workers goroutines.
	period := time.Second * instances * workers / (4 * rate)

	proc := redistest.Server(t)
	if !proc.Owned() {
		t.Skip("REDIS_ADDR names a server this test cannot kill")
	}
	clock := redistest.Client(t, proc) // Redis TIME and the bucket's hash
	ctx := t.Context()
	if err := clock.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	baseline := runtime.NumGoroutine()

	cfg := hybrid.Config{}
	bc := breaker.Config{}
	callTimeout := breaker.DefaultCallTimeout
	coldWait := callTimeout // Config.ColdWait 0 means the breaker's call timeout
	fleet := make(itFleet, instances)
	for i := range fleet {
		fleet[i] = newITInstance(t, proc.Addr(), cfg, bc, "inst-"+strconv.Itoa(i))
	}

	// Phase 1: normal.
	t1 := redisTime(t, clock)
	normal := runITLoad(fleet, workers, "hot", lim, period, normalFor)
	t2 := redisTime(t, clock)
	normal.check(t, "normal")
	window := t2.Sub(t1)
	ideal := burst + rate*window.Seconds()
	got := float64(normal.allowed())
	t.Logf("normal: admitted %v of %d requests in %v (Redis TIME); B+R*T = %.1f; %.2f%% of it; sources %v",
		got, len(normal.all), window, ideal, 100*got/ideal, normal.sources())
	if got > ideal {
		t.Errorf("normal: admitted %v, more than B+R*T = %.1f", got, ideal)
	}
	if got < 0.9*ideal {
		t.Errorf("normal: admitted %v, less than 90%% of B+R*T = %.1f", got, ideal)
	}
	for i, in := range fleet {
		if tr := in.states.since(0); len(tr) > 0 {
			t.Errorf("normal: instance %d: breaker transitions with Redis up: %v", i, tr)
		}
	}

	// Phase 2: outage. The load starts before the kill and goes on while
	// the breakers open.
	marks := fleet.marks()
	var killAt time.Time
	outage := runITLoad(fleet, workers, "hot", lim, period, outageFor, func(*itLoad) {
		killAt = time.Now()
		if err := proc.Kill(); err != nil {
			t.Errorf("Kill: %v", err)
		}
	}, func(*itLoad) {
		for i, in := range fleet {
			if _, ok := in.states.wait(breaker.Open, marks[i], stateWait); !ok {
				t.Errorf("outage: instance %d: breaker not open %v after the kill; transitions %v", i, stateWait, in.states.since(marks[i]))
			}
		}
	}, func(*itLoad) {
		for i, in := range fleet {
			if !in.lim.Stats().Degraded {
				t.Errorf("outage: instance %d: Stats().Degraded = false, want true", i)
			}
		}
	})
	outageEnd := time.Now()
	outage.check(t, "outage")
	opened := make([]time.Time, instances)
	for i, in := range fleet {
		if tr, ok := in.states.wait(breaker.Open, marks[i], 0); ok {
			opened[i] = tr.at
		}
	}
	var all, afterOpen []time.Duration
	perInst := make([]int, instances)
	fallbackAdmitted, fallbackPerInst := 0, make([]int, instances)
	for _, d := range outage.all {
		all = append(all, d.lat)
		if !opened[d.inst].IsZero() && d.start.After(opened[d.inst]) {
			afterOpen = append(afterOpen, d.lat)
		}
		if d.allowed {
			perInst[d.inst]++
			if d.src == hybrid.SourceFallback {
				fallbackAdmitted++
				fallbackPerInst[d.inst]++
			}
		}
	}
	slices.Sort(all)
	slices.Sort(afterOpen)
	t.Logf("outage: %d decisions, latency p50 %v, p99 %v, max %v; after the breaker opened: %d decisions, p50 %v, p99 %v, max %v",
		len(all), pct(all, 0.50), pct(all, 0.99), pct(all, 1),
		len(afterOpen), pct(afterOpen, 0.50), pct(afterOpen, 0.99), pct(afterOpen, 1))
	for i := range fleet {
		t.Logf("outage: instance %d: breaker open %v after the kill; admitted %d (%d by the fallback)",
			i, opened[i].Sub(killAt).Round(time.Millisecond), perInst[i], fallbackPerInst[i])
	}
	if bound := coldWait + callTimeout + margin; pct(all, 1) > bound {
		t.Errorf("outage: slowest decision took %v, more than ColdWait %v + CallTimeout %v + %v", pct(all, 1), coldWait, callTimeout, margin)
	}
	if len(afterOpen) == 0 {
		t.Errorf("outage: no decision after the breakers opened")
	} else if p := pct(afterOpen, 0.99); p >= p99Bound {
		t.Errorf("outage: p99 latency after the breaker opened is %v, want under %v", p, p99Bound)
	}
	// LocalShare: each instance has a local bucket of B/N, refilled at R/N
	// and full at its first use (after the kill), so the fallback admits at
	// most about B + R*T over the fleet.
	var fbBound float64
	outageWindow := outageEnd.Sub(killAt).Seconds()
	for i, in := range fleet {
		if fallbackPerInst[i] == 0 {
			t.Errorf("outage: instance %d: no decision by the fallback", i)
		}
		n := in.lim.Stats().Reconcile.Instances
		fbBound += float64(burst/n) + rate/float64(n)*outageWindow
	}
	t.Logf("outage: admitted %d over the fleet, %d of them by the fallback (LocalShare bound %.1f over %.2fs); sources %v",
		outage.allowed(), fallbackAdmitted, fbBound, outageWindow, outage.sources())
	if float64(fallbackAdmitted) > fbBound+instances { // a token of rounding per instance
		t.Errorf("outage: the fallback admitted %d, more than its share %.1f", fallbackAdmitted, fbBound)
	}

	// Phase 3: recovery.
	marks = fleet.marks()
	var restarted, recovered, settled, readmitted time.Time
	var debtWait time.Duration
	after := runITLoad(fleet, workers, "hot", lim, period, 0, func(*itLoad) {
		if err := proc.Restart(); err != nil {
			t.Errorf("Restart: %v", err)
			return
		}
		restarted = time.Now()
	}, func(*itLoad) {
		if restarted.IsZero() {
			return
		}
		for i, in := range fleet {
			tr, ok := in.states.wait(breaker.Closed, marks[i], stateWait)
			if !ok {
				t.Errorf("recovery: instance %d: breaker not closed %v after the restart; transitions %v", i, stateWait, in.states.since(marks[i]))
				continue
			}
			if tr.at.After(recovered) {
				recovered = tr.at
			}
		}
		// Bounded poll: nothing signals a round, and the next one comes
		// within one SyncInterval of the breaker closing.
		rounds := make([]uint64, instances)
		for i, in := range fleet {
			rounds[i] = in.lim.Stats().Reconcile.Rounds
		}
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		deadline := time.Now().Add(roundWait)
		// until polls each instance in turn until ok says it is there, at
		// most until the deadline.
		until := func(what string, ok func(st hybrid.Stats, i int) bool) {
			for i := 0; i < instances; {
				if ok(fleet[i].lim.Stats(), i) {
					i++
					continue
				}
				if time.Now().After(deadline) {
					t.Errorf("recovery: instance %d: %s %v after the breakers closed", i, what, roundWait)
					return
				}
				<-tick.C
			}
		}
		// A round, or nothing left for one: an instance whose fetches
		// charged what its fallback admitted, and that holds no lease
		// (the bucket in debt), has no settlement to send, and its rounds
		// send nothing (Rounds counts those that do: 2 runs of 69 under
		// -race waited for one in vain).
		until("no settlement round, and dues left", func(st hybrid.Stats, i int) bool {
			rs := st.Reconcile
			return rs.Rounds > rounds[i] || rs.Unsettled == 0 && rs.Orphans == 0 && rs.InFlight == 0
		})
		// The fallback keeps deciding for two rounds after a breaker
		// closes, while the fleet settles up (reconcile's settleUp).
		until("still degraded", func(st hybrid.Stats, _ int) bool { return !st.Degraded })
		settled = time.Now()
	}, func(l *itLoad) {
		if settled.IsZero() {
			return
		}
		// The outage's charges sink the bucket: by what the fallback
		// admitted beyond its claims of the refill, and by the writes the
		// restart lost, charged again down to -B at most. They land at the
		// rounds after the breakers close, in an order of their own, so the
		// fleet admits again once the refill has paid what they owe: within
		// (B + what the fallback admitted)/R of the fleet settling up. A
		// decision made before the fleet settled up may be admitted before
		// the charges land, and says nothing of that: the wait is for one
		// that started after (1 run of 20 under -race had one admitted 91
		// ms after settling up, then the bucket 400 tokens in debt for the
		// rest of the phase).
		var fallback uint64 // over the whole run: the outage and this phase
		for _, in := range fleet {
			fallback += in.lim.Stats().FallbackAllowed
		}
		debtWait = time.Duration(float64(burst+fallback)/rate*float64(time.Second)) + margin
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		since := func() bool { return l.admitted.Load() > settled.UnixNano() }
		for deadline := settled.Add(debtWait); !since() && time.Now().Before(deadline); {
			<-tick.C
		}
		if since() {
			readmitted = time.Now()
		}
		<-time.After(afterFor)
	})
	after.check(t, "recovery")
	if !restarted.IsZero() && !recovered.IsZero() {
		t.Logf("recovery: normal within %v of the restart (all breakers closed)", recovered.Sub(restarted).Round(time.Millisecond))
		for i, in := range fleet {
			t.Logf("recovery: instance %d: transitions %v", i, in.states.since(marks[i]))
		}
	}
	tokens, err := redistest.BucketTokens(ctx, clock, "hybrid:{hot}")
	if err != nil {
		t.Errorf("recovery: bucket hybrid:{hot}: %v; want the bucket back in Redis", err)
	} else if tokens >= burst*local.Micro {
		t.Errorf("recovery: bucket hybrid:{hot} holds %d micro-tokens, want below the burst %d: the outage's consumption was not charged", tokens, burst*local.Micro)
	} else {
		t.Logf("recovery: the bucket holds %.3f tokens", float64(tokens)/local.Micro)
	}
	// The outage's consumption sank the new bucket, so the first decisions
	// after recovery are denials; the refill then admits again, from the
	// allowance and Redis.
	if !settled.IsZero() {
		if readmitted.IsZero() {
			t.Errorf("recovery: the fleet admitted nothing from the allowance or Redis within %v of settling up, the most the outage's charges may owe", debtWait)
		} else {
			t.Logf("recovery: admitting again %v after settling up (the outage's charges owed at most %v)", readmitted.Sub(settled).Round(time.Millisecond), debtWait.Round(time.Millisecond))
		}
	}
	var late, lateFallback, lateAdmitted int
	for _, d := range after.all {
		if !settled.IsZero() && d.start.After(settled) {
			late++
			if d.src == hybrid.SourceFallback {
				lateFallback++
			} else if d.allowed {
				lateAdmitted++
			}
		}
	}
	t.Logf("recovery: %d decisions after the first round: %d admitted (local or redis), %d by the fallback; admitted over the phase by source %v",
		late, lateAdmitted, lateFallback, after.sources())
	if lateFallback > 0 {
		t.Errorf("recovery: %d of %d decisions after recovery came from the fallback, want none", lateFallback, late)
	}
	if lateAdmitted == 0 {
		t.Errorf("recovery: none of %d decisions after recovery admitted from the allowance or Redis", late)
	}
	for i, in := range fleet {
		st := in.lim.Stats()
		if st.Degraded {
			t.Errorf("recovery: instance %d: Stats().Degraded = true, want false", i)
		}
		t.Logf("recovery: instance %d: %+v", i, st)
	}

	// Close, twice, then no goroutine may be left.
	for i, in := range fleet {
		in.close(t, i)
	}
	if n := waitGoroutines(baseline, leakWait); n > baseline {
		var buf bytes.Buffer
		pprof.Lookup("goroutine").WriteTo(&buf, 1)
		t.Errorf("%d goroutines %v after Close, %d before the limiters were made:\n%s", n, leakWait, baseline, buf.Bytes())
	}
}

// TestIntegrationCluster runs 2 instances on a 3-master Redis Cluster, on 30
// keys spread over the three masters' slots, in lease mode at 4x each key's
// limit: no errors, every key within B+R*T, and both instances settle keys.
func TestIntegrationCluster(t *testing.T) {
	const (
		instances = 2
		keys      = 30
		rate      = 20
		burst     = 10
		d         = 1500 * time.Millisecond
	)
	lim := hybrid.Limit{Rate: rate, Burst: burst, Mode: hybrid.Lease}
	c := redistest.Cluster(t)
	admin := redistest.ClusterClient(t, c)
	ctx := t.Context()

	// 30 keys, a third in each third of the slots: one per master when the
	// cluster was made by redis-cli --cluster create.
	var names []string
	perThird := [3]int{}
	for i := 0; len(names) < keys; i++ {
		k := "tenant-" + strconv.Itoa(i)
		slot, err := admin.ClusterKeySlot(ctx, "hybrid:{"+k+"}").Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT: %v", err)
		}
		third := min(int(slot)*3/16384, 2)
		if perThird[third] < keys/3 {
			perThird[third]++
			names = append(names, k)
		}
	}

	lims := make([]*hybrid.Limiter, instances)
	for i := range lims {
		l, err := hybrid.New(redistest.ClusterClient(t, c), hybrid.Config{InstanceID: "cluster-" + strconv.Itoa(i)})
		if err != nil {
			t.Fatal(err)
		}
		lims[i] = l
		t.Cleanup(func() { l.Close(context.Background()) })
	}

	// Each instance runs 3 goroutines, each asking for 10 of the keys 40
	// times a second: 80 requests/s per key, 4x its rate.
	const goroutines = keys / 10
	period := time.Second * instances / (4 * rate)
	var (
		mu       sync.Mutex
		admitted = map[string]int{}
		asked    int
		errs     atomic.Int64
		firstErr atomic.Value
	)
	t1 := redisTime(t, admin)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for _, l := range lims {
		for g := range goroutines {
			wg.Go(func() {
				var mine []string
				for j, k := range names {
					if j%goroutines == g {
						mine = append(mine, k)
					}
				}
				tick := time.NewTicker(period)
				defer tick.Stop()
				got := map[string]int{}
				n := 0
				defer func() {
					mu.Lock()
					for k, v := range got {
						admitted[k] += v
					}
					asked += n
					mu.Unlock()
				}()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					for _, k := range mine {
						res, err := l.Allow(ctx, k, lim)
						n++
						if err != nil {
							errs.Add(1)
							firstErr.CompareAndSwap(nil, err)
						} else if res.Allowed {
							got[k]++
						}
					}
				}
			})
		}
	}
	<-time.After(d)
	close(stop)
	wg.Wait()
	t2 := redisTime(t, admin)

	if n := errs.Load(); n > 0 {
		t.Fatalf("%d decisions failed; the first: %v", n, firstErr.Load())
	}
	window := t2.Sub(t1)
	ideal := burst + rate*window.Seconds()
	total, worst, best := 0, ideal, 0.0
	for _, k := range names {
		got := float64(admitted[k])
		total += admitted[k]
		worst, best = min(worst, got), max(best, got)
		if got > ideal {
			t.Errorf("key %s: admitted %v, more than B+R*T = %.1f", k, got, ideal)
		}
	}
	t.Logf("%d keys over %v (Redis TIME): admitted %d of %d requests, %.2f%% of %d*(B+R*T) = %.1f; per key %v to %v",
		keys, window, total, asked, 100*float64(total)/(keys*ideal), keys, keys*ideal, worst, best)
	for i, l := range lims {
		st := l.Stats()
		t.Logf("instance %d: %+v", i, st)
		if st.Reconcile.KeysSettled == 0 {
			t.Errorf("instance %d: Stats().Reconcile.KeysSettled = 0, want some", i)
		}
		if st.FallbackAllowed+st.FallbackDenied > 0 || st.Degraded {
			t.Errorf("instance %d fell back with the cluster up: %+v", i, st)
		}
	}
	for i, l := range lims {
		for range 2 {
			if err := l.Close(ctx); err != nil {
				t.Errorf("instance %d: Close: %v", i, err)
			}
		}
	}
}

// The tests below guard against bugs found by earlier versions of them.

// TestIntegrationNoSpuriousDenial: 8 goroutines share one key whose bucket
// holds a billion tokens. No request may be denied.
//
// It guards against requests that share a fetch being denied while Redis
// holds plenty: the hot path may spend what the fetch brought before the
// waiters run; they must then fetch again, or take their cost alone.
func TestIntegrationNoSpuriousDenial(t *testing.T) {
	const goroutines, each = 8, 5000
	rdb := redistest.Client(t, redistest.Server(t))
	l, err := hybrid.New(rdb, hybrid.Config{LocalCapacity: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	lim := hybrid.Limit{Rate: 1e9, Burst: 1e9, Mode: hybrid.Lease}
	var denied atomic.Int64
	var example atomic.Value
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range each {
				res, err := l.Allow(t.Context(), "shared", lim)
				if err != nil {
					t.Error(err)
					return
				}
				if !res.Allowed {
					denied.Add(1)
					example.CompareAndSwap(nil, res)
				}
			}
		})
	}
	wg.Wait()
	if n := denied.Load(); n > 0 {
		t.Errorf("%d of %d requests denied with a bucket of 1e9 tokens; one: %+v; stats %+v", n, goroutines*each, example.Load(), l.Stats())
	}
}

// TestIntegrationLeaseKeepsUp: one goroutine asks for 1,000 keys uniformly,
// as fast as it can, under a limit it never reaches. The keys' leases must
// keep up with their demand: after a second, at most 1% of the decisions
// may wait for a fetch.
//
// It guards against leases collapsing to a token or so: a warm lease that
// runs dry must grow, early rounds must not treat keys untouched for a
// quarter interval as idle, and local.Store.Tick must not lose a key touched
// while it collects.
func TestIntegrationLeaseKeepsUp(t *testing.T) {
	const keys = 1000
	rdb := redistest.Client(t, redistest.Server(t))
	l, err := hybrid.New(rdb, hybrid.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	lim := hybrid.Limit{Rate: 1e9, Burst: 1e9, Mode: hybrid.Lease}
	names := make([]string, keys)
	for i := range names {
		names[i] = "user:" + strconv.Itoa(i)
	}
	seq := benchUniform(keys)
	var n, fetches0, n0 int
	start := time.Now()
	for time.Since(start) < 2*time.Second {
		if n0 == 0 && time.Since(start) >= time.Second {
			n0, fetches0 = n, int(l.Stats().Reconcile.Fetches)
		}
		for range 100 {
			res, err := l.Allow(t.Context(), names[seq[n&(len(seq)-1)]], lim)
			if err != nil || !res.Allowed {
				t.Fatalf("Allow = %+v, %v; want allowed", res, err)
			}
			n++
		}
	}
	fetches := int(l.Stats().Reconcile.Fetches) - fetches0
	perDecision := float64(fetches) / float64(n-n0)
	// The premise is keys asked for several times a round. On a machine so
	// loaded that each key is asked for less than that, they are light keys,
	// which rightly fetch on demand: the figure then says nothing. Under 8
	// a round, the fetches a second (2,500 to 2,800, about a quarter of the
	// keys a round) reach the bound below with no collapse at all: 0.058 at
	// 45,100 decisions a second was measured on a loaded machine.
	if perRound := float64(n-n0) / keys / 10; perRound < 8 { // 10 rounds a second by default

		t.Skipf("each key was asked for %.1f times a round (%d decisions in a second over %d keys): too few to test lease sizing on this machine now", perRound, n-n0, keys)
	}
	t.Logf("second 2: %d decisions (%v each), %d fetches (%.4f per decision); stats %+v",
		n-n0, time.Second/time.Duration(max(n-n0, 1)), fetches, perDecision, l.Stats())
	// Leases sized to use fetch about once per 100 decisions here (0.01 on
	// a quiet machine); collapsed leases fetch on nearly every decision.
	// The bound leaves room for a loaded machine's slow rounds: the fetches
	// a second stay about the same (4,000 to 5,600; 2,500 to 2,800 since
	// leases are not given back while they hold less than twice their
	// size) while the decisions a second fall (0.010 at 560,000 a second,
	// 0.026 to 0.029 at 140,000 to 180,000; 0.022 to 0.031 at 93,000 to
	// 113,000), well apart from a collapse either way.
	if perDecision > 0.05 {
		t.Errorf("%.4f fetches per decision in the second second, want at most 0.05", perDecision)
	}
}

// TestIntegrationWarmManyKeys: 32 goroutines ask once for each of 20,000 new
// keys, with the default Config and a client that honours the breaker's call
// timeout, then stop. Redis is up and fast: the settlement rounds must
// succeed, the breaker stay closed, and no decision come from the fallback.
//
// It guards against settlement rounds that outgrow the call timeout: a round
// of thousands of keys that timed out as one call would be held, larger,
// for the next round and fail forever; rounds are sent in calls of a bounded
// size instead.
func TestIntegrationWarmManyKeys(t *testing.T) {
	const keys, goroutines = 20_000, 32
	rdb := newITClient(redistest.Server(t).Addr())
	defer rdb.Close()
	l, err := hybrid.New(rdb, hybrid.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	lim := hybrid.Limit{Rate: 1e9, Burst: 1e9, Mode: hybrid.Lease}
	var next, fallback atomic.Int64
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for i := next.Add(1); i <= keys; i = next.Add(1) {
				res, err := l.Allow(t.Context(), "new:"+strconv.FormatInt(i, 10), lim)
				if err != nil {
					t.Error(err)
					return
				}
				if res.Source == hybrid.SourceFallback {
					fallback.Add(1)
				}
			}
		})
	}
	wg.Wait()
	// Bounded poll: three more rounds, with no load (nothing signals a
	// round).
	before := l.Stats().Reconcile
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(5 * time.Second); l.Stats().Reconcile.Rounds < before.Rounds+3 && time.Now().Before(deadline); {
		<-tick.C
	}
	st := l.Stats()
	idle, idleErrors := st.Reconcile.Rounds-before.Rounds, st.Reconcile.RoundErrors-before.RoundErrors
	t.Logf("after the load: %d rounds, %d failed; stats %+v", idle, idleErrors, st)
	// A cold key whose fetch took longer than ColdWait (a loaded machine)
	// is rightly answered by the fallback; anything else is not.
	if n := fallback.Load(); n > int64(st.Reconcile.FetchTimeouts) || st.Reconcile.Transitions > 0 {
		t.Errorf("%d of %d decisions from the fallback (%d fetches timed out), %d breaker transitions, with Redis up", n, keys, st.Reconcile.FetchTimeouts, st.Reconcile.Transitions)
	}
	// Rounds that outgrew the call timeout would fail on and on, after
	// the load too. A round or two that a loaded machine slowed past the
	// timeout during the load is not that.
	if idleErrors > 0 || st.Reconcile.RoundErrors*10 > st.Reconcile.Rounds {
		t.Errorf("%d of %d rounds failed with Redis up (%d of the %d after the load)", st.Reconcile.RoundErrors, st.Reconcile.Rounds, idleErrors, idle)
	}
}
