package hybrid_test

import (
	"cmp"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"text/tabwriter"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/internal/redistest"
	"github.com/hybridlimit/hybrid/lua"
	"github.com/hybridlimit/hybrid/reconcile"
)

// The fleet simulation runs the real Limiter code, N instances of it, each
// with its own client and reconciler, on one miniredis inside a
// testing/synctest bubble: time is fake, so a fleet of thousands runs in one
// process, and the bubble's clock is Redis TIME. The workload is the one the
// bench's hybridbench measures on a real server with -keys 1 -demand 2: one
// hot key, every instance asking for it at its share of twice the limit.
//
// miniredis is served over net.Pipe (Miniredis.Dial), not TCP: its
// goroutines then live in the bubble, blocked durably on the pipes while no
// command is under way, and its clock (time.Now, as TIME and the scripts
// read it) is the bubble's. A Redis call takes no fake time, unless a
// round trip is simulated (simLatency), and an instance's client needs no
// file descriptor: 4,096 of them fit however low the process's limit is.

// TestFleetSim simulates fleets of the sizes listed in HYBRID_FLEET_SIM and
// logs a table of what one hot key cost Redis and what it admitted:
//
//	HYBRID_FLEET_SIM=8,64,256,1024,4096 go test -run 'TestFleetSim$' -v -timeout 0 .
//
// One key at R=20,000/s B=20,000, asked for at twice its rate by N
// instances (Poisson arrivals, 2R/N a second each, one goroutine per
// instance), for a simulated T once every instance counts the fleet through
// its heartbeats. Optional settings:
//
//   - HYBRID_FLEET_SIM_DURATION: T, 5s if unset;
//   - HYBRID_FLEET_SIM_MODES: lease,optimistic if unset (exact too);
//   - HYBRID_FLEET_SIM_RTT: a list of simulated network round trips per
//     Redis call (0,200us,1ms,5ms), 0 if unset;
//   - HYBRID_FLEET_SIM_COUNT: a list of fleet counts every instance is
//     given (Config.Instances) whatever the fleet's size, 0 for the count
//     the heartbeats make (the default): a count that lags or that the
//     fleet outgrew, for what a wrong count costs (docs/tuning.md).
//
// Columns: live, the fleet count the instances held at the start (the
// least and the most, one number if all agree); key calls/s, the settle
// script's calls naming the key a second; floor, N*R/B; calls/floor; hb/s,
// the heartbeat script's calls a second; cmd/dec, every command over the
// decisions (hybridbench's cmd/dec); adm/ideal, admitted over B + R*T;
// overshoot, admitted beyond B + R*T (bench's definition, with T the
// window); fallback, fetch t/o, unans, redis err, from hybrid.Stats (all 0
// on a healthy Redis); wall, the real time the row took; heap, the largest
// heap seen during the row; per inst, each instance's live heap and
// goroutines.
func TestFleetSim(t *testing.T) {
	env := os.Getenv("HYBRID_FLEET_SIM")
	if env == "" {
		t.Skip("set HYBRID_FLEET_SIM to a list of fleet sizes (8,64,256,1024,4096) to run the simulation")
	}
	sizes, err := parseList(env, strconv.Atoi)
	if err != nil {
		t.Fatalf("HYBRID_FLEET_SIM: %v", err)
	}
	d := 5 * time.Second
	if s := os.Getenv("HYBRID_FLEET_SIM_DURATION"); s != "" {
		if d, err = time.ParseDuration(s); err != nil || d <= 0 {
			t.Fatalf("HYBRID_FLEET_SIM_DURATION %q: want a positive duration", s)
		}
	}
	modes := []hybrid.Mode{hybrid.Lease, hybrid.Optimistic}
	if s := os.Getenv("HYBRID_FLEET_SIM_MODES"); s != "" {
		if modes, err = parseList(s, parseMode); err != nil {
			t.Fatalf("HYBRID_FLEET_SIM_MODES: %v", err)
		}
	}
	rtts := []time.Duration{0}
	if s := os.Getenv("HYBRID_FLEET_SIM_RTT"); s != "" {
		if rtts, err = parseList(s, time.ParseDuration); err != nil {
			t.Fatalf("HYBRID_FLEET_SIM_RTT: %v", err)
		}
	}
	counts := []int{0}
	if s := os.Getenv("HYBRID_FLEET_SIM_COUNT"); s != "" {
		if counts, err = parseList(s, strconv.Atoi); err != nil || slices.Min(counts) < 0 {
			t.Fatalf("HYBRID_FLEET_SIM_COUNT %q: want a list of counts, 0 or more (%v)", s, err)
		}
	}
	var rows []simResult
	for _, rtt := range rtts {
		for _, count := range counts {
			for _, n := range sizes {
				for _, mode := range modes {
					sp := simSpec{n: n, mode: mode, rate: simRate, burst: simBurst, d: d, rtt: rtt, count: count}
					res := simulate(t, sp)
					t.Logf("%v: %s", sp, res.summary())
					res.check(t)
					rows = append(rows, res)
				}
			}
		}
	}
	t.Logf("one key, R=%d/s B=%d, demand 2x, T=%v simulated\n%s", simRate, simBurst, d, simTable(rows))
}

// TestFleetSimSmall runs the simulation at 8 and 64 instances, in lease and
// optimistic mode, for a simulated second of a smaller limit than
// TestFleetSim's (R=2,000/s B=1,000: asked for 4,000 tokens, the key
// admits at most 3,000), so that it takes a few seconds under the race
// detector, and checks what holds whatever the algorithm's costs
// (simResult.check). It asserts nothing on the calls to Redis.
func TestFleetSimSmall(t *testing.T) {
	for _, n := range []int{8, 64} {
		for _, mode := range []hybrid.Mode{hybrid.Lease, hybrid.Optimistic} {
			sp := simSpec{n: n, mode: mode, rate: simRate / 10, burst: simBurst / 20, d: time.Second}
			t.Run(fmt.Sprintf("%d/%v", n, mode), func(t *testing.T) {
				res := simulate(t, sp)
				t.Log(res.summary())
				res.check(t)
				if res.decisions == 0 || res.settle == 0 {
					t.Errorf("%d decisions, %d settle calls: the simulation simulated nothing", res.decisions, res.settle)
				}
			})
		}
	}
}

// TestFleetSim's limit, and the key.
const (
	simRate  = 20000
	simBurst = 20000
	simKey   = "hot"
)

// simWarmup is how long the fleet runs, with no requests, before the
// measurement starts: its heartbeats count the fleet (each instance's first
// three beats come a sync interval apart, then one a second), so the
// measurement sees the fleet's steady heartbeats.
const simWarmup = 2 * time.Second

// simSpec is one row of the simulation: N instances asking for one key
// limited to rate and burst, in mode, at twice its rate, for a simulated d,
// each Redis call taking rtt of fake time; count, if not 0, is the fleet
// count every instance is given (Config.Instances) instead of the one its
// heartbeats make.
type simSpec struct {
	n     int
	mode  hybrid.Mode
	rate  float64
	burst int64
	d     time.Duration
	rtt   time.Duration
	count int
}

func (sp simSpec) String() string {
	s := fmt.Sprintf("N=%d %v R=%v B=%d T=%v", sp.n, sp.mode, sp.rate, sp.burst, sp.d)
	if sp.rtt > 0 {
		s += fmt.Sprintf(" rtt=%v", sp.rtt)
	}
	if sp.count > 0 {
		s += fmt.Sprintf(" count=%d", sp.count)
	}
	return s
}

// simResult is what a row measured.
type simResult struct {
	simSpec
	// live and liveEnd are the least and most of the instances' live
	// counts (Stats.Reconcile.Live) at the start and at the end of the
	// measurement; counted is the fake time after New at which every
	// instance counted N, 0 if they did not within simWarmup.
	live, liveEnd [2]int64
	counted       time.Duration

	window              time.Duration // the measurement, in fake time
	decisions, admitted int64
	errors              int64
	firstErr            error
	bound               int64 // Limiter.Overshoot at the end

	// The commands of the measurement: the settle script's calls that name
	// the key, the heartbeat script's calls, and every command.
	settle, heartbeat, commands int64

	fallback, fetchTimeouts, unanswered, redisErrors, transitions uint64

	// What made the settle calls, from hybrid.Stats (since New: the
	// warm-up settles nothing): rounds and top-ups with something to
	// settle, fetches on a request's behalf, and the requests that waited
	// for one.
	rounds, fetches, fetched uint64

	wall       time.Duration // real time
	peakHeap   uint64        // the largest heap sampled, bytes
	heapPer    float64       // live heap per instance after the warm-up, bytes
	goroutines float64       // goroutines per instance after the warm-up
}

// ideal is B + R*T over the window.
func (r simResult) ideal() float64 { return float64(r.burst) + r.rate*r.window.Seconds() }

// overshoot is what the fleet admitted beyond B + R*T, 0 if not more.
func (r simResult) overshoot() float64 { return max(float64(r.admitted)-r.ideal(), 0) }

// perSec returns n a second of the window.
func (r simResult) perSec(n int64) float64 { return float64(n) / r.window.Seconds() }

// floor is lease's least settle calls a second for the key: N*R/B.
func (r simResult) floor() float64 { return float64(r.n) * r.rate / float64(r.burst) }

func (r simResult) liveString(v [2]int64) string {
	if v[0] == v[1] {
		return strconv.FormatInt(v[0], 10)
	}
	return fmt.Sprintf("%d-%d", v[0], v[1])
}

func (r simResult) summary() string {
	return fmt.Sprintf("live %s (all counted %v after New), %s at the end; %d decisions, admitted %d of B+R*T %.0f (%.2f%%, overshoot %.0f, bound %d); settle calls for the key %.0f/s (floor %.0f/s), heartbeats %.0f/s, commands %.0f/s (%.4f a decision); rounds %.0f/s, fetches %.0f/s for %d requests; fallback %d, fetch timeouts %d, unanswered %d, Redis errors %d, breaker transitions %d; %v wall, peak heap %.0f MiB, %.0f KiB and %.1f goroutines an instance",
		r.liveString(r.live), r.counted, r.liveString(r.liveEnd), r.decisions, r.admitted, r.ideal(), 100*float64(r.admitted)/r.ideal(), r.overshoot(), r.bound,
		r.perSec(r.settle), r.floor(), r.perSec(r.heartbeat), r.perSec(r.commands), float64(r.commands)/float64(max(r.decisions, 1)),
		r.perSec(int64(r.rounds)), r.perSec(int64(r.fetches)), r.fetched,
		r.fallback, r.fetchTimeouts, r.unanswered, r.redisErrors, r.transitions,
		r.wall.Round(time.Millisecond), float64(r.peakHeap)/(1<<20), r.heapPer/1024, r.goroutines)
}

// check fails t unless r's fleet did what it must on a healthy Redis,
// whatever its costs: every instance counted the whole fleet, at the start
// and at the end; no decision failed; nothing fell back, timed out or failed
// in Redis; and the fleet admitted at most B + R*T, plus Limiter.Overshoot
// (0 but in optimistic mode). Given a count, the instances hold it instead
// of the fleet's.
func (r simResult) check(t *testing.T) {
	t.Helper()
	n := int64(r.n)
	if r.count > 0 {
		n = int64(r.count)
	}
	if r.live != [2]int64{n, n} || r.liveEnd != [2]int64{n, n} {
		t.Errorf("%v: live count %s at the start, %s at the end, want %d", r.simSpec, r.liveString(r.live), r.liveString(r.liveEnd), n)
	}
	if r.errors > 0 {
		t.Errorf("%v: %d decisions failed; the first: %v", r.simSpec, r.errors, r.firstErr)
	}
	if r.fallback+r.fetchTimeouts+r.unanswered+r.redisErrors+r.transitions > 0 {
		t.Errorf("%v: fallback %d, fetch timeouts %d, unanswered %d, Redis errors %d, breaker transitions %d; want all 0 on a healthy Redis",
			r.simSpec, r.fallback, r.fetchTimeouts, r.unanswered, r.redisErrors, r.transitions)
	}
	if over := r.overshoot(); over > float64(r.bound) {
		t.Errorf("%v: admitted %d, %.0f beyond B + R*T = %.0f; want at most %d", r.simSpec, r.admitted, over, r.ideal(), r.bound)
	}
}

// simTable formats rows as a markdown table.
func simTable(rows []simResult) string {
	var sb strings.Builder
	tw := tabwriter.NewWriter(&sb, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "| N\t| mode\t| rtt\t| live\t| key calls/s\t| floor\t| calls/floor\t| hb/s\t| cmd/dec\t| adm/ideal\t| overshoot\t| fallback\t| fetch t/o\t| unans\t| redis err\t| wall\t| heap\t| per inst\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|")
	for _, r := range rows {
		over := "0"
		if o := r.overshoot(); o > 0 {
			over = fmt.Sprintf("+%.0f", o)
		}
		if r.bound > 0 {
			over += fmt.Sprintf(" of %d", r.bound)
		}
		fmt.Fprintf(tw, "| %d\t| %v\t| %v\t| %s\t| %.0f\t| %.0f\t| %.2f\t| %.0f\t| %.4f\t| %.2f%%\t| %s\t| %d\t| %d\t| %d\t| %d\t| %v\t| %.0f MiB\t| %.0f KiB, %.1f gor\t|\n",
			r.n, r.mode, r.rtt, r.liveString(r.live), r.perSec(r.settle), r.floor(), r.perSec(r.settle)/r.floor(), r.perSec(r.heartbeat),
			float64(r.commands)/float64(max(r.decisions, 1)), 100*float64(r.admitted)/r.ideal(), over,
			r.fallback, r.fetchTimeouts, r.unanswered, r.redisErrors, r.wall.Round(100*time.Millisecond),
			float64(r.peakHeap)/(1<<20), r.heapPer/1024, r.goroutines)
	}
	tw.Flush()
	return sb.String()
}

// simulate runs one row in a bubble of its own.
func simulate(t *testing.T, sp simSpec) simResult {
	t.Helper()
	res := simResult{simSpec: sp}
	start := time.Now()
	synctest.Test(t, func(t *testing.T) { simRun(t, sp, &res) })
	res.wall = time.Since(start)
	return res
}

// simRun is simulate's bubble.
func simRun(t *testing.T, sp simSpec, res *simResult) {
	m := miniredis.NewMiniRedis()
	defer m.Close()
	var count simCounts
	heap := newHeapPeak()
	heapBefore, goBefore := liveHeap(), runtime.NumGoroutine()

	lim := hybrid.Limit{Rate: sp.rate, Burst: sp.burst, Mode: sp.mode}
	var (
		lims    []*hybrid.Limiter
		clients []*redis.Client
	)
	defer func() {
		var wg sync.WaitGroup
		for i, l := range lims {
			wg.Go(func() {
				if err := l.Close(context.Background()); err != nil {
					t.Errorf("instance %d: Close: %v", i, err)
				}
			})
		}
		wg.Wait()
		for _, c := range clients {
			c.Close()
		}
	}()
	// Each instance's first round comes at a moment of its own within the
	// sync interval, as Config.FirstRound 0 draws it outside the tests
	// (TestMain fixes it to the interval): here from a seeded source.
	phase := rand.New(rand.NewPCG(1, uint64(sp.n)))
	for i := range sp.n {
		rdb := simClient(m, &count, sp.rtt)
		clients = append(clients, rdb)
		l, err := hybrid.New(rdb, hybrid.Config{
			InstanceID: "sim-" + strconv.Itoa(i),
			FirstRound: 1 + time.Duration(phase.Int64N(int64(reconcile.DefaultSyncInterval))),
			Instances:  sp.count,
		})
		if err != nil {
			t.Fatal(err)
		}
		lims = append(lims, l)
	}
	bucket := simBucketKey(t, clients[0])
	// Redis's clock is the bubble's, read on the server: between the call
	// and its reply when the round trip takes time.
	sent := time.Now().Truncate(time.Microsecond)
	if now, err := clients[0].Time(context.Background()).Result(); err != nil || now.Before(sent) || now.After(time.Now()) {
		t.Fatalf("Redis TIME = %v, %v; want the bubble's clock, from %v to %v", now, err, sent, time.Now())
	}

	// The warm-up: every instance counts the fleet.
	born := time.Now()
	for time.Since(born) < simWarmup {
		time.Sleep(100 * time.Millisecond)
		heap.sample()
		if res.counted == 0 && allLive(lims, sp.n, cmp.Or(sp.count, sp.n)) {
			res.counted = time.Since(born)
		}
	}
	res.live = liveRange(lims)
	synctest.Wait()
	res.heapPer = float64(int64(liveHeap())-int64(heapBefore)) / float64(sp.n)
	res.goroutines = float64(runtime.NumGoroutine()-goBefore) / float64(sp.n)

	// The measurement.
	before := count.snapshot(bucket)
	stop := make(chan struct{})
	var swg sync.WaitGroup
	swg.Go(func() { heap.every(100*time.Millisecond, stop) })
	t0 := time.Now()
	var (
		wg        sync.WaitGroup
		decisions atomic.Int64
		admitted  atomic.Int64
		errs      atomic.Int64
		errOnce   sync.Once
	)
	gap := float64(time.Second) * float64(sp.n) / (2 * sp.rate) // mean gap between an instance's arrivals
	for i, l := range lims {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(42, uint64(i)))
			var asked, got, failed int64
			at := time.Duration(0)
			for {
				at += time.Duration(rng.ExpFloat64() * gap)
				if at >= sp.d {
					break
				}
				if wait := time.Until(t0.Add(at)); wait > 0 {
					time.Sleep(wait)
				}
				r, err := l.Allow(context.Background(), simKey, lim)
				switch {
				case err != nil:
					failed++
					errOnce.Do(func() { res.firstErr = err })
				case r.Allowed:
					got++
				}
				asked++
			}
			decisions.Add(asked)
			admitted.Add(got)
			errs.Add(failed)
		})
	}
	wg.Wait()
	if rest := sp.d - time.Since(t0); rest > 0 {
		time.Sleep(rest) // the window is T at least, as the arrivals' span
	}
	synctest.Wait() // what the fleet does at this instant is in the window
	res.window = time.Since(t0)
	after := count.snapshot(bucket)
	close(stop)
	swg.Wait()
	heap.sample()

	res.decisions, res.admitted, res.errors = decisions.Load(), admitted.Load(), errs.Load()
	res.settle = after.settle - before.settle
	res.heartbeat = after.heartbeat - before.heartbeat
	res.commands = after.commands - before.commands
	res.liveEnd = liveRange(lims)
	res.bound = lims[0].Overshoot(lim)
	if sp.count > 0 && sp.count < sp.n {
		// A count below the fleet's size: each instance holds the share of
		// a smaller fleet, and the bound is that of N such shares, as one
		// instance that counts N but holds that share would tell it.
		res.bound = simBound(t, m, lim, sp)
	}
	for _, l := range lims {
		st := l.Stats()
		rc := st.Reconcile
		res.fallback += st.FallbackAllowed + st.FallbackDenied
		res.fetchTimeouts += rc.FetchTimeouts
		res.unanswered += st.Unanswered
		res.redisErrors += rc.RoundErrors + rc.KeyErrors + rc.FetchErrors + rc.HeartbeatErrors + st.ExactErrors
		res.transitions += rc.Transitions
		res.rounds += rc.Rounds
		res.fetches += rc.Fetches
		res.fetched += st.Fetched
	}
	res.peakHeap = heap.peak
}

// simBound returns optimistic's overshoot bound for sp.n instances that
// each hold the budget cap of a fleet of sp.count (Limiter.Overshoot is
// n times the cap, plus at most B and an interval's refill): a Limiter
// that counts sp.count tells the cap, scaled to sp.n.
func simBound(t *testing.T, m *miniredis.Miniredis, lim hybrid.Limit, sp simSpec) int64 {
	rdb := simClient(m, new(simCounts), 0)
	defer rdb.Close()
	l, err := hybrid.New(rdb, hybrid.Config{InstanceID: "sim-bound", Instances: sp.count})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	most := float64(lim.Burst) + lim.Rate*reconcile.DefaultSyncInterval.Seconds()
	capped := float64(l.Overshoot(lim)) - min(float64(l.Overshoot(lim))/2, most) // the count's n times the cap
	u := capped * float64(sp.n) / float64(sp.count)
	return int64(math.Ceil(u + min(u, most)))
}

// simClient returns an instance's client of m, served over a pipe made in
// the caller's bubble, with its commands counted in count and each taking
// rtt of fake time. One connection is enough: a command takes no fake time
// on it, so calls that queue for it are not delayed in fake time (the
// round trip, simLatency, is spent before the connection is taken), and
// small buffers keep 4,096 clients small.
func simClient(m *miniredis.Miniredis, count *simCounts, rtt time.Duration) *redis.Client {
	rdb := redis.NewClient(&redis.Options{
		Addr:                     "127.0.0.1:6379", // an address to name, never dialled: an IP, so that no option resolves it
		Dialer:                   func(context.Context, string, string) (net.Conn, error) { return m.Dial() },
		MaxRetries:               -1,
		PoolSize:                 1,
		ReadBufferSize:           4096,
		WriteBufferSize:          4096,
		ContextTimeoutEnabled:    true,
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	rdb.AddHook(redistest.Each(count.count))
	if rtt > 0 {
		rdb.AddHook(simLatency(rtt))
	}
	return rdb
}

// simBucketKey returns the Redis key of simKey's bucket under the default
// prefix.
func simBucketKey(t *testing.T, rdb redis.UniversalClient) string {
	g, err := global.New(rdb, global.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return g.Key(simKey)
}

// allLive reports whether every Limiter of lims counts n live instances,
// and shares limits out as a fleet of used.
func allLive(lims []*hybrid.Limiter, n, used int) bool {
	for _, l := range lims {
		if rc := l.Stats().Reconcile; rc.Live != int64(n) || rc.Instances != int64(used) {
			return false
		}
	}
	return true
}

// liveRange returns the least and the most fleet count that lims share
// limits out by (Stats.Reconcile.Instances: the live count, or
// Config.Instances).
func liveRange(lims []*hybrid.Limiter) [2]int64 {
	lo, hi := int64(-1), int64(0)
	for _, l := range lims {
		v := l.Stats().Reconcile.Instances
		if lo < 0 || v < lo {
			lo = v
		}
		hi = max(hi, v)
	}
	return [2]int64{lo, hi}
}

// simCounts counts the commands its hook sees (redistest.Each), each
// command of a pipeline apart: every command, the calls of the heartbeat
// script, and those of the settle script by the keys they name.
type simCounts struct {
	commands, heartbeat atomic.Int64

	mu      sync.Mutex // protects byKey
	byKey   map[string]int64
	scratch []string
}

// The SHA1s of the scripts, as EVALSHA names them.
var (
	simSettleHash    = scriptHash(lua.Settle)
	simHeartbeatHash = scriptHash(lua.Heartbeat)
)

func scriptHash(src string) string {
	h := sha1.Sum([]byte(src))
	return hex.EncodeToString(h[:])
}

func (c *simCounts) count(cmd redis.Cmder) {
	c.commands.Add(1)
	a := cmd.Args()
	if len(a) < 3 {
		return
	}
	name, _ := a[0].(string)
	body, _ := a[1].(string)
	switch {
	case isScript(name, body, simHeartbeatHash, lua.Heartbeat):
		c.heartbeat.Add(1)
	case isScript(name, body, simSettleHash, lua.Settle):
		n, err := strconv.Atoi(fmt.Sprint(a[2]))
		if err != nil || len(a) < 3+n {
			return
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.byKey == nil {
			c.byKey = make(map[string]int64)
		}
		c.scratch = c.scratch[:0]
		for _, k := range a[3 : 3+n] {
			if s, ok := k.(string); ok && !slices.Contains(c.scratch, s) {
				c.scratch = append(c.scratch, s)
				c.byKey[s]++
			}
		}
	}
}

// isScript reports whether a command named name with first argument body
// runs the script src: EVALSHA of its hash, or EVAL of its source.
func isScript(name, body, hash, src string) bool {
	return strings.EqualFold(name, "evalsha") && body == hash || strings.EqualFold(name, "eval") && body == src
}

// simSnapshot is simCounts at a moment, for one key.
type simSnapshot struct{ commands, heartbeat, settle int64 }

func (c *simCounts) snapshot(key string) simSnapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return simSnapshot{commands: c.commands.Load(), heartbeat: c.heartbeat.Load(), settle: c.byKey[key]}
}

// simLatency is a go-redis hook that makes each command, or pipeline, take
// a round trip of fake time: half before it is sent, half after its reply.
// A context that ends first fails the call, as a client's deadline would.
type simLatency time.Duration

func (d simLatency) half(ctx context.Context) error {
	tm := time.NewTimer(time.Duration(d) / 2)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// DialHook passes dials through.
func (d simLatency) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook delays a command.
func (d simLatency) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := d.half(ctx); err != nil {
			cmd.SetErr(err)
			return err
		}
		err := next(ctx, cmd)
		if herr := d.half(ctx); herr != nil && err == nil {
			cmd.SetErr(herr)
			return herr
		}
		return err
	}
}

// ProcessPipelineHook delays a pipeline.
func (d simLatency) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if err := d.half(ctx); err != nil {
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		err := next(ctx, cmds)
		if herr := d.half(ctx); herr != nil && err == nil {
			for _, c := range cmds {
				c.SetErr(herr)
			}
			return herr
		}
		return err
	}
}

// heapPeak keeps the largest heap it sampled.
type heapPeak struct {
	s    []metrics.Sample
	peak uint64
}

func newHeapPeak() *heapPeak {
	return &heapPeak{s: []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}}
}

func (h *heapPeak) sample() {
	metrics.Read(h.s)
	if h.s[0].Value.Kind() == metrics.KindUint64 {
		h.peak = max(h.peak, h.s[0].Value.Uint64())
	}
}

// every samples every d (of the bubble's time) until stop is closed.
func (h *heapPeak) every(d time.Duration, stop <-chan struct{}) {
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			h.sample()
		}
	}
}

// liveHeap returns the live heap after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// parseList parses a comma-separated list with parse.
func parseList[T any](s string, parse func(string) (T, error)) ([]T, error) {
	var out []T
	for f := range strings.SplitSeq(s, ",") {
		v, err := parse(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// parseMode parses a mode as Mode.String writes it.
func parseMode(s string) (hybrid.Mode, error) {
	for _, m := range []hybrid.Mode{hybrid.Lease, hybrid.Optimistic, hybrid.Exact} {
		if strings.EqualFold(s, m.String()) {
			return m, nil
		}
	}
	return 0, fmt.Errorf("mode %q: want lease, optimistic or exact", s)
}
