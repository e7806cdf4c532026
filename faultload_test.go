package hybrid_test

import (
	"bytes"
	"context"
	"fmt"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/internal/redistest"
	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

// The fault matrix's load, fleet and checks (see faults_real_test.go).

// Bounds of the fault tests.
const (
	faultSync      = reconcile.DefaultSyncInterval
	faultCall      = breaker.DefaultCallTimeout
	faultColdWait  = faultCall // Config.ColdWait 0 means the call timeout
	faultOpen      = breaker.DefaultOpenTimeout
	faultMargin    = 250 * time.Millisecond      // scheduling on 2 loaded cores with -race
	faultBound     = faultColdWait + faultMargin // a decision waits for Redis ColdWait in all
	faultStateWait = 5 * time.Second             // bound on waiting for a breaker transition
	faultLeakWait  = 3 * time.Second
	faultPeriod    = 4 * time.Millisecond // each load worker's pace
)

// faultKey is a kind of request of the fault load.
type faultKey struct {
	name  string
	lim   hybrid.Limit
	every int  // asked at every that many ticks of a worker (0: every tick)
	cold  bool // a new key each time (name:instance:worker:n): always a fetch
	// slot makes the cold keys name}:instance:worker:n, whose buckets all
	// share the Cluster hash slot of name (docs/design.md, Keys).
	slot bool
}

// faultDecision is one decision of the fault load.
type faultDecision struct {
	key, inst int
	start     time.Time
	lat       time.Duration
	allowed   bool
	src       hybrid.Source
}

// faultLoad makes workers goroutines per instance ask for its keys, each on
// a ticker, until stop, and keeps every decision. It also watches for
// stalls of the whole process: on a loaded machine (2 shared cores, -race)
// it can stop for longer than a call timeout, and a call then fails, or a
// decision takes long, for reasons that are not Redis's. The checks allow
// for the stalls they see, and say so.
type faultLoad struct {
	keys []faultKey
	stop chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex // protects the fields below
	all      []faultDecision
	errs     int
	firstErr error
	gaps     []gap
}

// gap is a stall of the process: a ticker read d after the one before, at
// end.
type gap struct {
	end time.Time
	d   time.Duration
}

// Stall watching: a ticker of stallTick, and a gap between two reads
// longer than stallMin is a stall.
const (
	stallTick = 2 * time.Millisecond
	stallMin  = 20 * time.Millisecond
)

// startFaultLoad starts the load on every instance of f, and the stall
// watch.
func startFaultLoad(f itFleet, workers int, keys []faultKey) *faultLoad {
	l := &faultLoad{keys: keys, stop: make(chan struct{})}
	for i, in := range f {
		for w := range workers {
			l.wg.Go(func() { l.work(in.lim, i, w) })
		}
	}
	l.wg.Go(l.watch)
	return l
}

// watch records the stalls of the process until stop.
func (l *faultLoad) watch() {
	tick := time.NewTicker(stallTick)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
			now := time.Now()
			if d := now.Sub(last); d > stallMin {
				l.mu.Lock()
				l.gaps = append(l.gaps, gap{end: now, d: d})
				l.mu.Unlock()
			}
			last = now
		}
	}
}

// stall returns the longest stall of the process that overlaps [from, to].
func (l *faultLoad) stall(from, to time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var worst time.Duration
	for _, g := range l.gaps {
		if !g.end.Before(from) && g.end.Add(-g.d).Before(to) {
			worst = max(worst, g.d)
		}
	}
	return worst
}

// work is one worker of instance inst.
func (l *faultLoad) work(lim *hybrid.Limiter, inst, w int) {
	var mine []faultDecision
	var errs int
	var first error
	defer func() {
		l.mu.Lock()
		l.all = append(l.all, mine...)
		l.errs += errs
		if l.firstErr == nil {
			l.firstErr = first
		}
		l.mu.Unlock()
	}()
	tick := time.NewTicker(faultPeriod)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-l.stop:
			return
		case <-tick.C:
		}
		for k, fk := range l.keys {
			if fk.every > 1 && n%fk.every != 0 {
				continue
			}
			key := fk.name
			if fk.cold {
				key = fk.name + ":" + strconv.Itoa(inst) + ":" + strconv.Itoa(w) + ":" + strconv.Itoa(n)
				if fk.slot {
					key = fk.name + "}" + key[len(fk.name):]
				}
			}
			t0 := time.Now()
			res, err := lim.Allow(context.Background(), key, fk.lim)
			lat := time.Since(t0)
			if err != nil {
				errs++
				if first == nil {
					first = fmt.Errorf("Allow(%s): %w", key, err)
				}
				continue
			}
			mine = append(mine, faultDecision{key: k, inst: inst, start: t0, lat: lat, allowed: res.Allowed, src: res.Source})
		}
	}
}

// end stops the load and waits for its workers. It fails t if a decision
// failed.
func (l *faultLoad) end(t *testing.T) {
	t.Helper()
	close(l.stop)
	l.wg.Wait()
	if l.errs > 0 {
		t.Errorf("%d decisions failed; the first: %v", l.errs, l.firstErr)
	}
}

// admitted returns the decisions allowed for key k, by every instance.
func (l *faultLoad) admitted(k int) int64 {
	var n int64
	for _, d := range l.all {
		if d.key == k && d.allowed {
			n++
		}
	}
	return n
}

// logDenials logs the decisions that denied key k: when (from the load's
// first decision), on which instance, by what, and how long they took.
func (l *faultLoad) logDenials(t *testing.T, k int) {
	t.Helper()
	var first time.Time
	for _, d := range l.all {
		if first.IsZero() || d.start.Before(first) {
			first = d.start
		}
	}
	for _, d := range l.all {
		if d.key == k && !d.allowed {
			t.Logf("%s denied at %v on instance %d by %v, in %v",
				l.keys[k].name, d.start.Sub(first).Round(time.Millisecond), d.inst, d.src, d.lat)
		}
	}
}

// span is a stretch of a fault test, from one event to another.
type span struct {
	name     string
	from, to time.Time
}

// check reports the decisions made in s and fails t if one took longer than
// faultBound, plus the longest stall of the process in s. It returns how
// many the fallback made.
func (l *faultLoad) check(t *testing.T, s span) (fallback int) {
	t.Helper()
	stall := l.stall(s.from, s.to)
	var lats []time.Duration
	byKey := map[string]int{}
	for _, d := range l.all {
		if d.start.Before(s.from) || !d.start.Before(s.to) {
			continue
		}
		lats = append(lats, d.lat)
		if d.src == hybrid.SourceFallback {
			fallback++
			byKey[l.keys[d.key].name]++
		}
	}
	slices.Sort(lats)
	t.Logf("%s (%v): %d decisions, latency p50 %v, p99 %v, max %v; %d by the fallback %v; the process stalled for %v at most",
		s.name, s.to.Sub(s.from).Round(time.Millisecond), len(lats), pct(lats, 0.5), pct(lats, 0.99), pct(lats, 1), fallback, byKey, stall.Round(time.Millisecond))
	if len(lats) == 0 {
		t.Errorf("%s: no decision", s.name)
	} else if m := pct(lats, 1); m > faultBound+stall {
		t.Errorf("%s: the slowest decision took %v, more than ColdWait %v + %v + the longest stall %v", s.name, m, faultColdWait, faultMargin, stall)
	}
	return fallback
}

// faultFleet starts n instances, with clients to addr as the README's Quick
// start configures them (newITClient), and the default Config.
func faultFleet(t *testing.T, addr string, n int, prefix string) itFleet {
	t.Helper()
	f := make(itFleet, n)
	for i := range f {
		f[i] = newITInstance(t, addr, hybrid.Config{}, breaker.Config{}, prefix+"-"+strconv.Itoa(i))
	}
	return f
}

// awaitOpen waits for every instance's breaker to open after its
// transitions marks, and returns how long after since the last one did.
func awaitOpen(t *testing.T, f itFleet, marks []int, since time.Time, what string) time.Duration {
	t.Helper()
	var last time.Duration
	for i, in := range f {
		tr, ok := in.states.wait(breaker.Open, marks[i], faultStateWait)
		if !ok {
			t.Errorf("%s: instance %d: breaker not open %v in; transitions %v", what, i, faultStateWait, in.states.since(marks[i]))
			continue
		}
		last = max(last, tr.at.Sub(since))
	}
	return last
}

// awaitNormal waits until every instance of f has its breaker closed, is
// not degraded, and has completed a settlement round that succeeded since,
// and returns how long after since the last one got there. The bound is one
// round, plus two open timeouts if a breaker opened after its transitions
// marks (the breaker probes one open timeout after it last opened, and a
// probe lost to a scheduling stall on a loaded machine costs one more), and
// one more with the stall itself if the process stalled meanwhile (see
// stalled); it fails t past the bound, and keeps waiting up to
// faultStateWait, to measure.
func awaitNormal(t *testing.T, f itFleet, load *faultLoad, marks []int, since time.Time, what string) time.Duration {
	t.Helper()
	took, ok := untilNormal(t, f, marks, since, what)
	if !ok {
		return faultStateWait
	}
	bound := faultSync + faultMargin
	for i, in := range f {
		if _, ok := in.states.wait(breaker.Open, marks[i], 0); ok {
			bound = 2*faultOpen + faultSync + faultMargin
			break
		}
	}
	if stall, ok := load.stalled(span{what, since, since.Add(took)}); ok {
		// A call may have failed for the stall alone: one more open
		// timeout, and the stall itself.
		bound += faultOpen + stall
	}
	if took > bound {
		t.Errorf("%s: normal again %v after, want within %v", what, took.Round(time.Millisecond), bound)
	}
	return took
}

// untilNormal waits up to faultStateWait after since until every instance
// of f has every breaker closed, is not degraded, and has completed a
// settlement round that succeeded since, and returns how long after since
// the last one got there; ok is false, and t failed, if one did not.
func untilNormal(t *testing.T, f itFleet, marks []int, since time.Time, what string) (took time.Duration, ok bool) {
	t.Helper()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	deadline := since.Add(faultStateWait)
	for i, in := range f {
		var rounds, roundErrors uint64
		based := false
		for {
			st := in.lim.Stats()
			if st.Reconcile.Breaker != breaker.Closed || st.Degraded {
				based = false
			} else if !based {
				rounds, roundErrors, based = st.Reconcile.Rounds, st.Reconcile.RoundErrors, true
			} else if st.Reconcile.Rounds-rounds > st.Reconcile.RoundErrors-roundErrors {
				took = max(took, time.Since(since))
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s: instance %d not back to normal %v after; stats %+v; transitions %v", what, i, faultStateWait, st, in.states.since(marks[i]))
				return faultStateWait, false
			}
			<-tick.C
		}
	}
	return took, true
}

// stalled returns the longest stall of the process in s or in the call
// timeout before it, and whether it may have made a call time out on its
// own: a stall the watch sees (stallMin) tells that the process was short
// of CPU, and its other goroutines may have waited longer.
func (l *faultLoad) stalled(s span) (time.Duration, bool) {
	stall := l.stall(s.from.Add(-faultCall), s.to)
	return stall, stall > stallMin
}

// wantNoFallback fails t if a decision of s, a stretch with Redis up, came
// from the fallback without first waiting ColdWait for a fetch: with Redis
// up, only a fetch slower than ColdWait (a loaded machine, or the next
// fault beginning) may send a request to the fallback. It lets a stalled
// stretch pass, and says so.
func (l *faultLoad) wantNoFallback(t *testing.T, s span) {
	t.Helper()
	l.wantFallbackAtMost(t, s, 0)
}

// wantFallbackAtMost is wantNoFallback that lets up to most decisions come
// from the fallback at once, and says so.
func (l *faultLoad) wantFallbackAtMost(t *testing.T, s span, most int) {
	t.Helper()
	var fast, slow int
	for _, d := range l.all {
		if d.start.Before(s.from) || !d.start.Before(s.to) || d.src != hybrid.SourceFallback {
			continue
		}
		if d.lat < faultColdWait {
			fast++
		} else {
			slow++
		}
	}
	if fast == 0 {
		return
	}
	if fast <= most {
		t.Logf("%s: %d decisions by the fallback without waiting for a fetch (%d after it), at most %d let", s.name, fast, slow, most)
		return
	}
	if stall, ok := l.stalled(s); ok {
		t.Logf("%s: %d decisions by the fallback without waiting for a fetch (%d after it); not checked: the process stalled for %v", s.name, fast, slow, stall)
		return
	}
	t.Errorf("%s: %d decisions by the fallback without waiting for a fetch (%d after it), want none with Redis up", s.name, fast, slow)
}

// wantSteady fails t if a breaker of f changed state in s, a stretch with
// Redis up, unless the process stalled in it (see stalled).
func (l *faultLoad) wantSteady(t *testing.T, f itFleet, s span) {
	t.Helper()
	stall, stalled := l.stalled(s)
	for i, in := range f {
		for _, tr := range in.states.since(0) {
			if tr.at.Before(s.from) || !tr.at.Before(s.to) {
				continue
			}
			if stalled {
				t.Logf("%s: instance %d: breaker %v; not checked: the process stalled for %v", s.name, i, tr, stall)
			} else {
				t.Errorf("%s: instance %d: breaker %v, want it closed throughout", s.name, i, tr)
			}
		}
	}
}

// closeFleet closes every instance (twice, then checks ErrClosed) and
// fails t unless the goroutine count comes back to baseline.
func closeFleet(t *testing.T, f itFleet, baseline int) {
	t.Helper()
	for i, in := range f {
		in.close(t, i)
	}
	if n := waitGoroutines(baseline, faultLeakWait); n > baseline {
		var buf bytes.Buffer
		pprof.Lookup("goroutine").WriteTo(&buf, 1)
		t.Errorf("%d goroutines %v after Close, %d before the limiters were made:\n%s", n, faultLeakWait, baseline, buf.Bytes())
	}
}

// conserveKeys are two keys whose burst the load cannot spend in a test, so
// that every request is admitted, by Redis or by the fallback, and at a rate
// so low that their buckets refill by less than a token: after Close each
// bucket must hold B minus what the fleet admitted, or less.
var conserveKeys = []faultKey{
	{name: "conserve-lease", lim: hybrid.Limit{Rate: 1e-3, Burst: 1e6, Mode: hybrid.Lease}},
	{name: "conserve-optimistic", lim: hybrid.Limit{Rate: 1e-3, Burst: 1e6, Mode: hybrid.Optimistic}},
}

// checkConserved checks the Redis buckets of the conserve keys, the first
// len(conserveKeys) of load's keys, after the fleet closed: nothing admitted
// may be missing from them.
func checkConserved(t *testing.T, admin *redis.Client, load *faultLoad, f itFleet) {
	t.Helper()
	var uncertain, unanswered uint64
	for _, in := range f {
		st := in.lim.Stats()
		uncertain += st.Reconcile.Uncertain
		unanswered += st.Unanswered
	}
	var late uint64 // conserve keys' denials that waited for Redis, or denied by it
	for k, fk := range conserveKeys {
		admitted := load.admitted(k)
		var asked, slow int64
		for _, d := range load.all {
			if d.key != k {
				continue
			}
			asked++
			// A request that joined a fetch under way waited for its
			// remainder only: denied from Redis all the same.
			if !d.allowed && (d.lat >= faultCall || d.src == hybrid.SourceRedis) {
				slow++
			}
		}
		late += uint64(slow)
		// Their buckets never run dry: a request is denied only when Redis
		// did not answer its fetch in time while its breaker was still
		// closed (a slow Redis is no outage: Stats.Unanswered), as at the
		// onset of the latency fault and of the black hole, until Redis has
		// answered nothing for MaxCallTimeout. Those denials are at most
		// the fleet's unanswered ones (below).
		if early := asked - admitted - slow; early > 0 {
			t.Errorf("%s: %d of %d admitted, %d denied without waiting for Redis: the test relies on every request with an answer being admitted",
				fk.name, admitted, asked, early)
			load.logDenials(t, k)
		} else if admitted != asked {
			t.Logf("%s: %d of %d admitted; the others denied as Redis did not answer in time", fk.name, admitted, asked)
			load.logDenials(t, k)
		}
		got, err := redistest.BucketTokens(t.Context(), admin, "hybrid:{"+fk.name+"}")
		if err != nil {
			t.Errorf("%s: bucket: %v", fk.name, err)
			continue
		}
		want := (fk.lim.Burst - admitted) * local.Micro
		// The refill over a minute at most, at 1e-3 tokens/s.
		slack := int64(fk.lim.Rate * local.Micro * 60)
		t.Logf("%s: admitted %d; Redis bucket %.3f tokens, B - admitted = %d: %.3f tokens charged beyond what was admitted (%d settlements of the fleet had an unknown outcome)",
			fk.name, admitted, float64(got)/local.Micro, fk.lim.Burst-admitted, float64(want-got)/local.Micro, uncertain)
		if got > want+slack {
			t.Errorf("%s: Redis bucket holds %d micro-tokens, more than B - admitted = %d (+%d of refill): %.3f admitted tokens were never charged",
				fk.name, got, want, slack, float64(got-want-slack)/local.Micro)
		}
		if late > unanswered {
			t.Errorf("%d requests for the conserve keys denied after a call's deadline, %d denied as unanswered by the fleet: denied for lack of tokens",
				late, unanswered)
		}
		// Consumption is charged by rounds alone, whose settlements are
		// sent again, not charged twice, when a reply is lost: an
		// optimistic key is charged exactly. (A lease key may end lower:
		// a fetch whose reply is lost loses its grant.)
		if fk.lim.Mode == hybrid.Optimistic && got < want-local.Micro/2 {
			t.Errorf("%s: Redis bucket holds %d micro-tokens, less than B - admitted = %d: %.3f tokens charged twice",
				fk.name, got, want, float64(want-got)/local.Micro)
		}
	}
}

// faultServer starts a redis-server for a fault test (one this process
// owns: the test flushes or kills its clients) and returns it with an admin
// client connected straight to it.
func faultServer(t *testing.T) (*redistest.Proc, *redis.Client) {
	t.Helper()
	srv := redistest.Server(t)
	if !srv.Owned() {
		t.Skip("REDIS_ADDR names a shared server this test would disturb")
	}
	admin := redistest.Client(t, srv)
	if err := admin.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	return srv, admin
}
