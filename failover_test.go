package hybrid_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The failover cases: a Sentinel set (a master, two replicas, three
// sentinels on loopback) under a fleet of 8 Limiters, each on a failover
// client of its own, asking for one hot key at 4x its limit while the
// master is killed (SIGKILL) or handed over (SENTINEL FAILOVER).

// foLoad is the fleet and the load of a failover run.
type foLoad struct {
	instances, workers int           // Limiters, goroutines each
	gap                time.Duration // between one goroutine's requests
	before             time.Duration // of running before the fault
	after              time.Duration // of normal running after every breaker closed again
	span               time.Duration // if not 0, the run's length instead, from its start
	fallback           hybrid.Fallback
}

// foDefault is the load of TestFailoverSentinel and TestFailoverCluster:
// 8 Limiters of 2 goroutines, 4000 requests a second in all.
var foDefault = foLoad{instances: 8, workers: 2, gap: 4 * time.Millisecond, before: 1500 * time.Millisecond, after: 1500 * time.Millisecond}

// foLimit is the hot key's limit: the fleet asks for 4x its rate.
var foLimit = hybrid.Limit{Rate: 1000, Burst: 1000}

// foDecision is one decision of a failover run.
type foDecision struct {
	at      time.Time
	lat     time.Duration
	allowed bool
	source  hybrid.Source
	err     error
}

// foResult is what a failover run measured.
type foResult struct {
	decisions         []foDecision
	start, end        time.Time
	fault, promoted   time.Time       // the kill or handover; the new master serving
	degraded, normal  time.Time       // the first breaker leaving closed; every breaker closed again
	opened            []time.Duration // each instance's first breaker opening after the fault, from it (-1: none)
	losses, recharged uint64          // the fleet's Stats.Reconcile.Losses and Recharged (micro-tokens)
	tails             uint64          // the fleet's Stats.Reconcile.Tails
	forgiven          uint64          // the fleet's Stats.Reconcile.Forgiven (micro-tokens)
	credited          uint64          // the fleet's Stats.Reconcile.Credited (micro-tokens)
	owed              float64         // tokens the bucket owes at the end: its debt, not repaid yet
	overshoot         float64         // Limiter.Overshoot of the limit, for the fleet
}

// The faults of TestFailoverSentinel.
const (
	foKill     = "kill"     // SIGKILL of the master
	foHandover = "handover" // SENTINEL FAILOVER
	foLagging  = "lagging"  // both replicas frozen and cut off for 1.5 s, then the master killed: the promoted one lacks those writes
	foTwice    = "twice"    // a kill, and 1 s after the promotion a lagging kill of the new master (Sentinel failing over twice)
	foKill2    = "kill2"    // a kill, and 1 s after the promotion a kill of the new master, its replica in step
)

// foTopology is a Redis with replicas that a failover case runs against.
type foTopology interface {
	// client returns a client of the instance's own.
	client(t *testing.T) redis.UniversalClient
	// master returns the master that holds the hot key's bucket now.
	master(t *testing.T) *redistest.Proc
	// replicas returns the replicas of m.
	replicas(t *testing.T, m *redistest.Proc) []*redistest.Proc
	// handover hands m's place to a replica without losing a write, and
	// returns once the replica serves it.
	handover(t *testing.T, m *redistest.Proc)
	// promoted waits until a replica serves in the place of m, killed.
	promoted(t *testing.T, m *redistest.Proc)
}

// sentinelTopology is a Sentinel set: a master, two replicas.
type sentinelTopology struct{ s *redistest.SentinelProc }

func (st sentinelTopology) client(t *testing.T) redis.UniversalClient {
	return redistest.FailoverClient(t, st.s)
}

func (st sentinelTopology) master(t *testing.T) *redistest.Proc {
	m, err := st.s.Master()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func (st sentinelTopology) replicas(t *testing.T, m *redistest.Proc) []*redistest.Proc {
	var replicas []*redistest.Proc
	for _, p := range st.s.Nodes() {
		if p != m {
			replicas = append(replicas, p)
		}
	}
	return replicas
}

func (st sentinelTopology) handover(t *testing.T, m *redistest.Proc) {
	if err := st.s.Failover(); err != nil {
		t.Fatal(err)
	}
	st.promoted(t, m)
}

func (st sentinelTopology) promoted(t *testing.T, m *redistest.Proc) {
	if _, err := st.s.WaitFailover(m.Addr(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestFailoverSentinel: the master of a Sentinel set killed with SIGKILL,
// in lease, optimistic and exact modes; handed over by SENTINEL FAILOVER,
// and killed after its replicas missed 1.5 s of its writes, in lease mode.
// No caller sees an error; decisions keep their bound while the fleet has
// no master; lease mode admits at most B + R*T over the run (counted by
// the callers): the fallback's shares start from what each instance last
// saw, and the writes the new master lacks are charged again; every
// instance is normal again soon after the promotion.
//
// Then, in lease mode, two masters killed a second apart, the second once
// its replica missed 1.5 s of its writes: the second outage's shares start
// from the instances' views, not where the first outage's left off.
func TestFailoverSentinel(t *testing.T) {
	failoverCases(t, func(t *testing.T) foTopology { return sentinelTopology{redistest.Sentinel(t)} })
	t.Run("lease/"+foTwice, func(t *testing.T) {
		lim := foLimit
		lim.Mode = hybrid.Lease
		res := failover(t, sentinelTopology{redistest.Sentinel(t)}, lim, foTwice, foDefault)
		checkFailover(t, lim, foTwice, res)
	})
}

// failoverCases runs the failover cases, each on a topology of its own:
// a kill in every mode, a handover and a lagging replica in lease mode (the
// mode whose promise is exact), and in every mode with HYBRID_FAILOVER=full
// (about 70 s more for each topology, which CI leaves out).
func failoverCases(t *testing.T, topology func(t *testing.T) foTopology) {
	type foCase struct {
		mode  hybrid.Mode
		fault string
	}
	cases := []foCase{
		{hybrid.Lease, foKill},
		{hybrid.Optimistic, foKill},
		{hybrid.Exact, foKill},
		{hybrid.Lease, foHandover},
		{hybrid.Lease, foLagging},
	}
	if os.Getenv("HYBRID_FAILOVER") == "full" {
		cases = append(cases,
			foCase{hybrid.Optimistic, foHandover}, foCase{hybrid.Exact, foHandover},
			foCase{hybrid.Optimistic, foLagging}, foCase{hybrid.Exact, foLagging})
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%v/%s", c.mode, c.fault), func(t *testing.T) {
			lim := foLimit
			lim.Mode = c.mode
			res := failover(t, topology(t), lim, c.fault, foDefault)
			checkFailover(t, lim, c.fault, res)
		})
	}
}

// failover runs one failover case on topo and returns what it measured.
func failover(t *testing.T, topo foTopology, lim hybrid.Limit, fault string, ld foLoad) foResult {
	var (
		lims   []*hybrid.Limiter
		states []*transitions
	)
	for i := range ld.instances {
		tr := newTransitions()
		l, err := hybrid.New(topo.client(t), hybrid.Config{
			InstanceID: "fo-" + strconv.Itoa(i),
			Breaker:    breaker.Config{OnStateChange: tr.record},
			Fallback:   ld.fallback,
			Logger:     foLogger(t, i),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close(context.Background()) })
		lims, states = append(lims, l), append(states, tr)
	}
	if !waitFleet(lims, int64(ld.instances), 3*time.Second) {
		t.Fatalf("the instances do not count %d of them", ld.instances)
	}

	var (
		mu   sync.Mutex
		res  foResult
		stop = make(chan struct{})
		wg   sync.WaitGroup
	)
	ctx := context.Background()
	res.start = time.Now()
	for _, l := range lims {
		for range ld.workers {
			wg.Go(func() {
				tick := time.NewTicker(ld.gap)
				defer tick.Stop()
				var mine []foDecision
				for {
					select {
					case <-stop:
						mu.Lock()
						res.decisions = append(res.decisions, mine...)
						mu.Unlock()
						return
					case <-tick.C:
					}
					at := time.Now()
					r, err := l.Allow(ctx, "hot", lim)
					mine = append(mine, foDecision{at: at, lat: time.Since(at), allowed: r.Allowed, source: r.Source, err: err})
				}
			})
		}
	}
	time.Sleep(ld.before) // load, not synchronisation: the fleet runs at 4x the limit
	marks := make([]int, len(states))
	for i, tr := range states {
		marks[i] = tr.len()
	}
	m := topo.master(t)
	if fault == foLagging {
		lag(t, topo, m)
	}
	res.fault = time.Now()
	switch fault {
	case foHandover:
		topo.handover(t, m)
	case foKill:
		if err := m.Kill(); err != nil {
			t.Fatal(err)
		}
		topo.promoted(t, m)
	case foLagging:
		topo.promoted(t, m)
	case foTwice, foKill2:
		if err := m.Kill(); err != nil {
			t.Fatal(err)
		}
		topo.promoted(t, m)
		time.Sleep(time.Second) // load, not synchronisation: the new master takes writes
		second := topo.master(t)
		if fault == foTwice {
			lag(t, topo, second)
		} else if err := second.Kill(); err != nil {
			t.Fatal(err)
		}
		topo.promoted(t, second)
	}
	res.promoted = time.Now()
	// Every breaker closed again (if one opened), and a round settled.
	deadline := time.Now().Add(10 * time.Second)
	for {
		open := false
		for _, l := range lims {
			open = open || l.Stats().Degraded
		}
		if !open || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // polling the instances' state
	}
	res.normal = time.Now()
	res.opened = make([]time.Duration, len(states))
	for i, tr := range states {
		res.opened[i] = -1
		for _, x := range tr.since(marks[i]) {
			if res.degraded.IsZero() || x.at.Before(res.degraded) {
				res.degraded = x.at
			}
			if x.to == breaker.Open && res.opened[i] < 0 && !x.at.Before(res.fault) {
				res.opened[i] = x.at.Sub(res.fault)
			}
		}
	}
	if ld.span > 0 {
		time.Sleep(time.Until(res.start.Add(ld.span))) // the run's length
	} else {
		time.Sleep(ld.after)
	}
	close(stop)
	wg.Wait()
	res.end = time.Now()
	for _, l := range lims {
		st := l.Stats().Reconcile
		res.losses += st.Losses
		res.tails += st.Tails
		res.recharged += st.Recharged
		res.forgiven += st.Forgiven
		res.credited += st.Credited
	}
	res.overshoot = float64(lims[0].Overshoot(lim))
	res.owed = owed(t, topo, lim, res.end)
	slices.SortFunc(res.decisions, func(a, b foDecision) int { return a.at.Compare(b.at) })
	return res
}

// lag has m's replicas miss 1.5 s of its writes, then kills m: the replica
// promoted in its place lacks them. The replicas are frozen and their links
// cut (a frozen replica cannot dial again; it still receives into its
// socket what m sent before), then thawed once m is dead. A replica not
// running (a master killed before) is left alone.
func lag(t *testing.T, topo foTopology, m *redistest.Proc) {
	var frozen []*redistest.Proc
	for _, p := range topo.replicas(t, m) {
		err := p.Freeze()
		if errors.Is(err, redistest.ErrStopped) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		frozen = append(frozen, p)
	}
	if err := redistest.Client(t, m).ClientKillByFilter(context.Background(), "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // the master takes writes its replicas miss
	err := m.Kill()
	for _, p := range frozen {
		if terr := p.Thaw(); terr != nil {
			t.Fatal(terr)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
}

// owed returns what the hot key's bucket owes at the end of a run, in
// tokens (0 if it is not in debt): what the fleet admitted beyond B + R*T
// and has not repaid yet. A window that ends once it is repaid admits at
// most B + R*T.
func owed(t *testing.T, topo foTopology, lim hybrid.Limit, end time.Time) float64 {
	ctx := context.Background()
	rdb := redistest.Client(t, topo.master(t))
	tokens, ts, ok, err := redistest.Bucket(ctx, rdb, "hybrid:{hot}")
	if err != nil {
		t.Fatal(err)
	}
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return 0
	}
	at := now.Add(-time.Since(end)) // Redis's time at the end
	left := float64(tokens)/1e6 + lim.Rate*float64(at.UnixMicro()-ts)/1e6
	return max(-left, 0)
}

// waitFleet waits at most d for every limiter to count n instances.
func waitFleet(lims []*hybrid.Limiter, n int64, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		all := true
		for _, l := range lims {
			all = all && l.Stats().Reconcile.Instances == n
		}
		if all {
			return true
		}
		time.Sleep(10 * time.Millisecond) // polling the heartbeats' count
	}
	return false
}

// checkFailover checks and logs what a failover run measured.
func checkFailover(t *testing.T, lim hybrid.Limit, fault string, res foResult) {
	t.Helper()
	var admitted, fallback, errs int
	var during []time.Duration
	var worst time.Duration
	var slow []foDecision // past ColdWait and 5 ms of slack
	var phases [3]int     // admitted before the fault, until normal again, after
	for _, d := range res.decisions {
		if d.allowed {
			switch {
			case d.at.Before(res.fault):
				phases[0]++
			case d.at.Before(res.normal):
				phases[1]++
			default:
				phases[2]++
			}
		}
		if d.lat > breaker.DefaultCallTimeout+5*time.Millisecond {
			slow = append(slow, d)
		}
		if d.err != nil {
			errs++
			if errs == 1 {
				t.Errorf("a caller got an error: %v", d.err)
			}
		}
		if d.allowed {
			admitted++
			if d.source == hybrid.SourceFallback {
				fallback++
			}
		}
		if !d.at.Before(res.fault) && d.at.Before(res.normal) {
			during = append(during, d.lat)
			worst = max(worst, d.lat)
		}
	}
	slices.Sort(during)
	var p99 time.Duration
	if len(during) > 0 {
		p99 = during[len(during)*99/100]
	}
	span := res.end.Sub(res.start)
	bound := float64(lim.Burst) + lim.Rate*span.Seconds()
	var degradedFor time.Duration
	if !res.degraded.IsZero() {
		degradedFor = res.normal.Sub(res.degraded)
	}
	t.Logf("%d decisions over %v, %d caller errors; promoted %v after the fault; degraded for %v, normal %v after the promotion; during the failover p99 %v, max %v; admitted %d (%d by the fallback) of B + R*T %.0f (%+.1f%%), %.0f owed at the end; %d heartbeats found writes lost, %d outages' tails charged, %.0f tokens charged again, %.0f forgiven, %.0f credited out of outages' pools",
		len(res.decisions), span.Round(time.Millisecond), errs, res.promoted.Sub(res.fault).Round(time.Millisecond),
		degradedFor.Round(time.Millisecond), res.normal.Sub(res.promoted).Round(time.Millisecond),
		p99.Round(time.Microsecond), worst.Round(time.Microsecond), admitted, fallback, bound, 100*(float64(admitted)/bound-1), res.owed,
		res.losses, res.tails, float64(res.recharged)/1e6, float64(res.forgiven)/1e6, float64(res.credited)/1e6)
	opened := make([]string, len(res.opened))
	for i, d := range res.opened {
		opened[i] = "-"
		if d >= 0 {
			opened[i] = d.Round(time.Millisecond).String()
		}
	}
	t.Logf("breakers opened after the fault: %v; admitted %d before the fault (%v), %d until normal again (%v), %d after (%v); %d decisions took more than ColdWait + 5 ms",
		opened, phases[0], res.fault.Sub(res.start).Round(time.Millisecond), phases[1], res.normal.Sub(res.fault).Round(time.Millisecond),
		phases[2], res.end.Sub(res.normal).Round(time.Millisecond), len(slow))
	for i, d := range slow {
		if i == 5 {
			break
		}
		t.Logf("slow decision %v after the fault: %v, allowed %v, source %v, err %v", d.at.Sub(res.fault).Round(time.Millisecond), d.lat.Round(time.Millisecond), d.allowed, d.source, d.err)
	}
	// Lease: B + R*T over a window that ends once the debt is repaid, so
	// B + R*T and what the bucket still owes at the end (a lease granted
	// before every instance's charge lands is repaid after), and what the
	// charges forgave at the debt's bound (none within Config.MaxDebt).
	// Measured on a Sentinel set: see docs/failure.md.
	forgiven := float64(res.forgiven) / 1e6
	switch {
	case lim.Mode == hybrid.Lease && float64(admitted) > bound+forgiven+res.owed+1:
		t.Errorf("lease admitted %d over %v, above B + R*T %.0f, the %.0f tokens owed at the end and the %.0f forgiven", admitted, span, bound, res.owed, forgiven)
	case lim.Mode == hybrid.Optimistic && float64(admitted) > bound+res.overshoot:
		t.Errorf("optimistic admitted %d over %v, above B + R*T %.0f + its bound %.0f", admitted, span, bound, res.overshoot)
	}
	// At least 80%, 70% after a lagging replica's promotion: the writes it
	// lacks are charged again in full, though the bucket it holds, idle
	// while frozen, refilled no further than B, and the outage's claims,
	// from the instances' views of the old master, account for them
	// already (docs/failure.md; measured on a Cluster: -16.8% to -23.9%).
	// 70% after a handover too: both masters take writes for a while
	// (go-redis moves its connections when Sentinel announces the new
	// one, and a dial may reach it before), an instance's beats may reach
	// one while its settlements reach the other, and the heartbeat that
	// finds its beats lost charges again what the instance took since its
	// last beat the answering master holds: up to two seconds of writes,
	// some of them kept (under -race on two loaded cores: -4.6% to -24.9%
	// in 30 runs, 3 below 80%; CI failed on one, -20.2%).
	floor := 0.8
	if fault == foLagging || fault == foTwice || fault == foHandover {
		floor = 0.7
	}
	if float64(admitted) < floor*bound {
		t.Errorf("admitted %d over %v, under %.0f%% of B + R*T %.0f", admitted, span, 100*floor, bound)
	}
}

// TestFailoverMeasure measures a Sentinel failover as a service would see
// it, HYBRID_FAILOVER_RUNS times (skipped without): 4 Limiters of 4
// goroutines ask for one hot key in lease mode at 4x its limit (R=1000/s,
// B=1000) for 12 s, the master killed (SIGKILL) 4 s in. Every run admits
// at most B + R*T (and what the bucket owes at the end, and what was
// forgiven) and at least 93% of it; every breaker opens within 50 ms of
// the kill; no decision takes more than ColdWait + 5 ms.
// HYBRID_FAILOVER_POLICY=closed runs it with FailClosed (the floor then
// does not apply: the fleet admits nothing while Redis is down).
// HYBRID_FAILOVER_FAULT=twice kills the promoted replica too, 1 s after
// its promotion, once the other replica missed 1.5 s of its writes:
// Sentinel failing over twice, the second time to a replica that lacks
// what the first took; kill2 kills it with its replica in step.
//
//	HYBRID_FAILOVER_RUNS=20 HYBRID_REQUIRE_REDIS=1 go test -run 'TestFailoverMeasure$' -v .
func TestFailoverMeasure(t *testing.T) {
	runs, _ := strconv.Atoi(os.Getenv("HYBRID_FAILOVER_RUNS"))
	if runs <= 0 {
		t.Skip("HYBRID_FAILOVER_RUNS not set: a measurement of about 20 s a run")
	}
	ld := foLoad{instances: 4, workers: 4, gap: 4 * time.Millisecond, before: 4 * time.Second, span: 12 * time.Second, fallback: hybrid.LocalShare}
	closed := os.Getenv("HYBRID_FAILOVER_POLICY") == "closed"
	fault := foKill
	if f := os.Getenv("HYBRID_FAILOVER_FAULT"); f == foTwice || f == foKill2 {
		fault = f
	}
	if closed {
		ld.fallback = hybrid.FailClosed
	}
	lim := foLimit
	lim.Mode = hybrid.Lease
	var ratios []float64
	var slowest, lastOpen time.Duration
	for i := range runs {
		// A subtest a run: each stops its Sentinel set before the next.
		t.Run(fmt.Sprint("run ", i+1), func(t *testing.T) {
			res := failover(t, sentinelTopology{redistest.Sentinel(t)}, lim, fault, ld)
			admitted := 0
			var worst time.Duration
			for _, d := range res.decisions {
				if d.allowed {
					admitted++
				}
				worst = max(worst, d.lat)
			}
			bound := float64(lim.Burst) + lim.Rate*res.end.Sub(res.start).Seconds()
			ratio := float64(admitted) / bound
			ratios = append(ratios, ratio)
			slowest = max(slowest, worst)
			var open time.Duration
			for _, d := range res.opened {
				open = max(open, d)
			}
			lastOpen = max(lastOpen, open)
			t.Logf("run %d: admitted %d of B + R*T %.0f (%.1f%%), %.0f owed at the end, %.0f forgiven, %d heartbeats found writes lost, %d tails, %.0f tokens charged again, %.0f credited; breakers opened %v after the kill; slowest decision %v; promoted %v after the kill, normal %v after that",
				i+1, admitted, bound, 100*ratio, res.owed, float64(res.forgiven)/1e6, res.losses, res.tails, float64(res.recharged)/1e6, float64(res.credited)/1e6, res.opened, worst.Round(time.Millisecond/10),
				res.promoted.Sub(res.fault).Round(time.Millisecond), res.normal.Sub(res.promoted).Round(time.Millisecond))
			if float64(admitted) > bound+res.owed+float64(res.forgiven)/1e6+1 {
				t.Errorf("run %d: admitted %d, above B + R*T %.0f and the %.0f owed at the end; admitted (by the fallback) each 500 ms from the start, the kill at %v: %s",
					i+1, admitted, bound, res.owed, res.fault.Sub(res.start).Round(time.Millisecond), res.windows(500*time.Millisecond))
			}
			if !closed && ratio < 0.93 {
				t.Errorf("run %d: admitted %.1f%% of B + R*T, want at least 93%%", i+1, 100*ratio)
			}
			if open > 50*time.Millisecond || slices.Contains(res.opened, -1) {
				t.Errorf("run %d: breakers opened %v after the kill, want all within 50 ms", i+1, res.opened)
			}
			if worst > breaker.DefaultCallTimeout+5*time.Millisecond {
				t.Errorf("run %d: a decision took %v, want at most ColdWait + 5 ms", i+1, worst)
			}
		})
	}
	if len(ratios) == 0 {
		return
	}
	slices.Sort(ratios)
	t.Logf("%d runs: admitted %.1f%% to %.1f%% of B + R*T (median %.1f%%); the last breaker opened at most %v after the kill; the slowest decision %v",
		runs, 100*ratios[0], 100*ratios[len(ratios)-1], 100*ratios[len(ratios)/2], lastOpen, slowest.Round(time.Millisecond/10))
}

// foLogger returns the Logger of instance i of a failover run: its
// warnings (breakers opening, writes found lost) in the test's log with
// HYBRID_FAILOVER_LOG set, else nil (slog's default, which tests keep
// quiet).
func foLogger(t *testing.T, i int) *slog.Logger {
	if os.Getenv("HYBRID_FAILOVER_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(tlog{t}, &slog.HandlerOptions{Level: slog.LevelWarn})).With("instance", i)
}

// tlog writes to a test's log.
type tlog struct{ t *testing.T }

func (w tlog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// windows returns, for each step of the run from its start, what the
// fleet admitted and, in parentheses, how much of it the fallback did: a
// run over its bound shows when it admitted the excess.
func (res *foResult) windows(step time.Duration) string {
	n := int(res.end.Sub(res.start)/step) + 1
	all, fb := make([]int, n), make([]int, n)
	for _, d := range res.decisions {
		if i := int(d.at.Sub(res.start) / step); d.allowed && i >= 0 && i < n {
			all[i]++
			if d.source == hybrid.SourceFallback {
				fb[i]++
			}
		}
	}
	var b strings.Builder
	for i := range all {
		fmt.Fprintf(&b, " %d(%d)", all[i], fb[i])
	}
	return b.String()
}
