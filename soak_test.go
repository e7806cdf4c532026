package hybrid_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/internal/redistest"
)

// The load tests run Limiters at full speed against a real redis-server
// (internal/redistest) and measure memory and goroutines with the runtime's
// own counters, after runtime.GC. Load is paced by nothing: the workers run
// as fast as they can until told to stop. The waits for the limiter to catch
// up are bounded polls on Stats, since nothing signals a settled round.

// heap is the heap after garbage collection.
type heap struct {
	inuse uint64 // runtime.MemStats.HeapInuse: spans in use, with their free slots
	live  uint64 // runtime.MemStats.HeapAlloc: the bytes of live objects
}

func (h heap) String() string {
	return fmt.Sprintf("%.1f MiB in use (%.1f live)", mib(h.inuse), mib(h.live))
}

// heapNow returns the heap after two garbage collections (the second frees
// what the first's finalizers released).
func heapNow() heap {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return heap{inuse: ms.HeapInuse, live: ms.HeapAlloc}
}

// heapInuse returns heapNow().inuse.
func heapInuse() uint64 { return heapNow().inuse }

// grew reports whether the heap grew from h to h2 by more than a quarter
// of its live bytes plus 2 MiB, or a quarter of its spans plus 4 MiB (spans
// in use are noisier: a few live objects keep a whole span). The margin
// holds state that fills up to a ceiling of its own, such as the maps of a
// store that keeps churning and connections reopened after a crash (about
// 1 MiB in a soak of three Limiters, whether it lasts a minute or five); a
// leak of a byte per decision would be 30 MiB in five minutes.
func (h heap) grew(h2 heap) bool {
	return h2.live > h.live+h.live/4+2<<20 || h2.inuse > h.inuse+h.inuse/4+4<<20
}

// pollUntil calls cond every period until it reports true or timeout
// passes, and reports whether it did.
func pollUntil(timeout, period time.Duration, cond func() bool) bool {
	tick := time.NewTicker(period)
	defer tick.Stop()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}

// loadClient returns a client of addr for the load tests: nothing is sent
// twice, the breaker's call deadlines hold, and its commands fail at once
// while cut is set (a link cut), as a refused connection would.
func loadClient(addr string, timeout time.Duration, cut *atomic.Bool) *redis.Client {
	rdb := redis.NewClient(&redis.Options{
		Addr:                     addr,
		Dialer:                   redistest.LoopbackDialer(timeout),
		MaxRetries:               -1,
		DialTimeout:              timeout,
		ReadTimeout:              timeout,
		WriteTimeout:             timeout,
		ContextTimeoutEnabled:    true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	if cut != nil {
		rdb.AddHook(cutHook{cut})
	}
	return rdb
}

// cutHook fails every dial and command while down is set.
type cutHook struct{ down *atomic.Bool }

func (h cutHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if h.down.Load() {
			return nil, errLinkDown
		}
		return next(ctx, network, addr)
	}
}

func (h cutHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.down.Load() {
			cmd.SetErr(errLinkDown)
			return errLinkDown
		}
		return next(ctx, cmd)
	}
}

func (h cutHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.down.Load() {
			for _, c := range cmds {
				c.SetErr(errLinkDown)
			}
			return errLinkDown
		}
		return next(ctx, cmds)
	}
}

// soakDuration returns how long TestSoak runs: HYBRID_SOAK (a duration such
// as "3m"), or 10s.
func soakDuration(t *testing.T) time.Duration {
	s := os.Getenv("HYBRID_SOAK")
	if s == "" {
		return 10 * time.Second
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 5*time.Second {
		t.Fatalf("HYBRID_SOAK=%q: want a duration of at least 5s (%v)", s, err)
	}
	return d
}

// soakInstance is one Limiter of the soak with its client and link.
type soakInstance struct {
	lim *hybrid.Limiter
	rdb *redis.Client
	cut atomic.Bool
}

// soakStats counts the decisions of the soak.
type soakStats struct {
	decisions, allowed, fallback atomic.Int64
	slowest                      atomic.Int64 // nanoseconds, decisions that do not wait
	mu                           sync.Mutex
	errs                         map[string]int // unexpected errors by message
}

func (s *soakStats) fail(err error) {
	s.mu.Lock()
	if s.errs == nil {
		s.errs = map[string]int{}
	}
	s.errs[err.Error()]++
	s.mu.Unlock()
}

// TestSoak runs three Limiters on a real redis-server at full speed, with
// many goroutines on hot and cold keys in every mode (Allow, Reserve and
// Cancel, AllowAll, Wait), while Redis is killed with SIGKILL and restarted
// empty and links are cut, for HYBRID_SOAK (10s by default). It checks that
// no decision fails (but Wait's when its deadline is too short) or hangs,
// that the limiters recover after the faults, and that neither goroutines
// nor the heap grow: both are measured after a first stretch of load and
// faults, and again after the rest, with the faults cleared, the rounds
// settled and runtime.GC; and after Close the goroutines are back to what
// they were before the limiters were made.
func TestSoak(t *testing.T) {
	const (
		instances = 3
		workers   = 6 // per instance
		hotKeys   = 8
		coldKeys  = 50_000
		maxKeys   = 2_000 // cold keys churn through the store
		// An outage pins the journal of what each instance told Redis (to
		// charge it again should Redis lose it) until two spans of three
		// heartbeats (of the default second) after it; the heap is read
		// once that is over (see run).
		pinned = 6*time.Second + 500*time.Millisecond
	)
	d := soakDuration(t)
	warm := min(max(d/5, 3*time.Second), 30*time.Second)
	proc := redistest.Server(t)
	if !proc.Owned() {
		t.Skip("REDIS_ADDR names a server this test cannot kill")
	}
	// Sampled finely enough to name what grew, should the heap grow.
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 64 << 10
	goroutines0, heap0 := runtime.NumGoroutine(), heapNow()

	fleet := make([]*soakInstance, instances)
	for i := range fleet {
		in := &soakInstance{}
		in.rdb = loadClient(proc.Addr(), itNetTimeout, &in.cut)
		l, err := hybrid.New(in.rdb, hybrid.Config{MaxKeys: maxKeys, InstanceID: "soak-" + strconv.Itoa(i)})
		if err != nil {
			t.Fatal(err)
		}
		in.lim = l
		fleet[i] = in
	}
	closed := false
	closeAll := func() {
		if closed {
			return
		}
		closed = true
		for i, in := range fleet {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := in.lim.Close(ctx); err != nil {
				t.Errorf("instance %d: Close: %v", i, err)
			}
			cancel()
			in.rdb.Close()
		}
		fleet = nil // what is left of the limiters is garbage now
	}
	defer closeAll()

	hot := []hybrid.Limit{
		{Rate: 5000, Burst: 1000, Mode: hybrid.Lease},
		{Rate: 5000, Burst: 1000, Mode: hybrid.Optimistic},
		{Rate: 50, Burst: 20, Mode: hybrid.Exact},
	}
	cold := []hybrid.Limit{
		{Rate: 10, Burst: 20, Mode: hybrid.Lease},
		{Rate: 10, Burst: 20, Mode: hybrid.Optimistic},
	}
	var stats soakStats
	// run drives the fleet and injects faults for d, then clears them.
	run := func(phase string, d time.Duration, seed uint64) {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for i, in := range fleet {
			for w := range workers {
				r := rand.New(rand.NewPCG(seed, uint64(i*workers+w)))
				wg.Go(func() { soakWorker(in.lim, r, hot, cold, hotKeys, coldKeys, stop, &stats) })
			}
		}
		faults := 0
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, 1<<32))
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Duration(500+r.IntN(1500)) * time.Millisecond):
				}
				down := time.Duration(300+r.IntN(1200)) * time.Millisecond
				faults++
				// The warm-up's first fault is a kill, which every instance
				// sees: what the fallback makes once and keeps (its ledger of
				// evicted keys' buckets, a table of about 1 MiB) is made
				// before the heap is read, not during the soak (a soak whose
				// first fleet-wide fault came after the warm-up's heap read
				// grew by that table: 16.5 MiB in use against a bound of
				// 16.5, CI).
				if r.IntN(2) == 0 || phase == "warm-up" && faults == 1 {
					if err := proc.Kill(); err != nil {
						t.Errorf("Kill: %v", err)
					}
					select {
					case <-stop:
					case <-time.After(down):
					}
					if err := proc.Restart(); err != nil {
						t.Errorf("Restart: %v", err)
						return
					}
					continue
				}
				cut := fleet[r.IntN(len(fleet))]
				if r.IntN(3) == 0 {
					cut = nil // every link
				}
				for _, in := range fleet {
					if cut == nil || cut == in {
						in.cut.Store(true)
					}
				}
				select {
				case <-stop:
				case <-time.After(down):
				}
				for _, in := range fleet {
					in.cut.Store(false)
				}
			}
		})
		time.Sleep(d) // the load's length, not a synchronisation
		close(stop)
		wg.Wait()
		// Clear the faults: Redis up, links back, every breaker closed,
		// nothing left to settle.
		cleared := time.Now()
		if err := pingRedis(proc); err != nil {
			t.Fatalf("%s: Redis after the faults: %v", phase, err)
		}
		for _, in := range fleet {
			in.cut.Store(false)
		}
		// Then no key settled for ten intervals: the rounds are idle.
		settled := make([]uint64, len(fleet))
		var quiet time.Time
		if !pollUntil(20*time.Second, 10*time.Millisecond, func() bool {
			idle := true
			for i, in := range fleet {
				st := in.lim.Stats()
				if st.Degraded || st.Reconcile.Breaker != breaker.Closed || st.Reconcile.Orphans > 0 || st.Reconcile.KeysSettled != settled[i] {
					settled[i] = st.Reconcile.KeysSettled
					idle = false
				}
			}
			if !idle {
				quiet = time.Now()
			}
			return idle && time.Since(quiet) >= 10*interval
		}) {
			for i, in := range fleet {
				t.Errorf("%s: instance %d not recovered 20s after the faults: %+v", phase, i, in.lim.Stats())
			}
			t.FailNow()
		}
		t.Logf("%s: %v, %d faults, recovered in %v; %d decisions so far, %d allowed, %d by the fallback; slowest decision %v",
			phase, d, faults, time.Since(cleared).Round(time.Millisecond), stats.decisions.Load(), stats.allowed.Load(), stats.fallback.Load(), time.Duration(stats.slowest.Load()))
		// The journals are pinned for two spans (of three heartbeats)
		// after the last outage and trimmed as settlements are journaled:
		// wait that out and journal one exact decision on each instance,
		// so that the heap is read with every journal at rest (full
		// during one phase and not the other, they differ by up to 3 MiB,
		// bounded: 16,384 entries).
		time.Sleep(pinned) // the pin's end, not a synchronisation
		for i, in := range fleet {
			lim := hybrid.Limit{Rate: 10, Burst: 20, Mode: hybrid.Exact}
			if _, err := in.lim.Allow(context.Background(), phase+"-trim", lim); err != nil {
				t.Fatalf("%s: instance %d: a decision after the faults: %v", phase, i, err)
			}
		}
	}

	run("warm-up", warm, 1)
	goroutines1, heap1 := runtime.NumGoroutine(), heapNow()
	sites1 := heapSites()
	run("soak", d-warm, 2)
	goroutines2, heap2 := runtime.NumGoroutine(), heapNow()
	sites2 := heapSites()
	t.Logf("goroutines: %d before, %d after the warm-up, %d after the soak; heap: %v before, %v after the warm-up, %v after the soak",
		goroutines0, goroutines1, goroutines2, heap0, heap1, heap2)

	stats.mu.Lock()
	for msg, n := range stats.errs {
		t.Errorf("%d decisions failed with: %s", n, msg)
	}
	stats.mu.Unlock()
	if slowest := time.Duration(stats.slowest.Load()); slowest > 5*time.Second {
		t.Errorf("a decision took %v, want every one answered within seconds even on a loaded machine", slowest)
	}
	if stats.fallback.Load() == 0 {
		t.Errorf("no decision came from the fallback: the faults did not bite")
	}
	// The soak's steady state is the warm-up's: no more goroutines, and
	// no more heap (within heap.grew's noise).
	if goroutines2 > goroutines1 {
		var buf []byte
		buf = make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Errorf("%d goroutines after the soak, %d after the warm-up:\n%s", goroutines2, goroutines1, buf)
	}
	grown := grownSites(sites1, sites2, 10)
	if heap1.grew(heap2) {
		t.Errorf("heap grew from %v after the warm-up to %v after the soak; the sites that grew most:%s", heap1, heap2, grown)
	} else {
		t.Logf("the sites that grew most after the warm-up:%s", grown)
	}

	closeAll()
	if n := waitGoroutines(goroutines0, 5*time.Second); n > goroutines0 {
		var buf []byte
		buf = make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Errorf("%d goroutines after Close, %d before the limiters were made:\n%s", n, goroutines0, buf)
	}
	heap3 := heapNow()
	t.Logf("after Close: heap %v (%v before)", heap3, heap0)
	if heap0.grew(heap3) {
		t.Errorf("heap %v after Close, %v before the limiters were made", heap3, heap0)
	}
}

// heapSites returns the bytes in use by allocation site, as of the last
// garbage collection (call it after heapNow), sampled at
// runtime.MemProfileRate. A site is the first frame in this module outside
// the tests, or the first outside the runtime, or the first frame.
func heapSites() map[string]int64 {
	var recs []runtime.MemProfileRecord
	n, _ := runtime.MemProfile(nil, true)
	for {
		recs = make([]runtime.MemProfileRecord, n+50)
		var ok bool
		if n, ok = runtime.MemProfile(recs, true); ok {
			recs = recs[:n]
			break
		}
	}
	sites := map[string]int64{}
	for _, rec := range recs {
		frames := runtime.CallersFrames(rec.Stack())
		site := ""
		for {
			f, more := frames.Next()
			if site == "" || strings.HasPrefix(site, "runtime.") && !strings.HasPrefix(f.Function, "runtime.") {
				site = fmt.Sprintf("%s:%d", f.Function, f.Line)
			}
			if strings.HasPrefix(f.Function, "github.com/hybridlimit/hybrid") && !strings.Contains(f.File, "_test.go") {
				site = fmt.Sprintf("%s:%d", f.Function, f.Line)
				break
			}
			if !more {
				break
			}
		}
		sites[site] += rec.InUseBytes()
	}
	return sites
}

// grownSites lists the n sites of after that hold the most bytes more than
// in before.
func grownSites(before, after map[string]int64, n int) string {
	type site struct {
		name  string
		bytes int64
	}
	var grown []site
	for name, b := range after {
		if d := b - before[name]; d > 0 {
			grown = append(grown, site{name, d})
		}
	}
	slices.SortFunc(grown, func(a, b site) int { return cmp.Compare(b.bytes, a.bytes) })
	var sb strings.Builder
	for _, g := range grown[:min(n, len(grown))] {
		fmt.Fprintf(&sb, "\n\t%+.1f KiB %s", float64(g.bytes)/1024, g.name)
	}
	return sb.String()
}

// mib returns n bytes in MiB.
func mib(n uint64) float64 { return float64(n) / (1 << 20) }

// pingRedis waits up to 5s for the server of proc to answer PING.
func pingRedis(proc *redistest.Proc) error {
	rdb := loadClient(proc.Addr(), time.Second, nil)
	defer rdb.Close()
	var err error
	pollUntil(5*time.Second, 10*time.Millisecond, func() bool {
		err = rdb.Ping(context.Background()).Err()
		return err == nil
	})
	return err
}

// soakWorker makes decisions on l as fast as it can until stop is closed:
// mostly hot keys, some cold ones, under the limits given, through every
// entry point.
func soakWorker(l *hybrid.Limiter, r *rand.Rand, hot, cold []hybrid.Limit, hotKeys, coldKeys int, stop <-chan struct{}, stats *soakStats) {
	ctx := context.Background()
	for n := 0; ; n++ {
		if n%64 == 0 {
			select {
			case <-stop:
				return
			default:
			}
		}
		// Each key keeps one limit, so that workers do not fight over it (a
		// changed limit takes effect at once, which is another test's).
		var key string
		var lim hybrid.Limit
		if r.IntN(4) > 0 {
			k := r.IntN(hotKeys)
			key, lim = "hot:"+strconv.Itoa(k), hot[k%len(hot)]
		} else {
			k := r.IntN(coldKeys)
			key, lim = "cold:"+strconv.Itoa(k), cold[k%len(cold)]
		}
		start := time.Now()
		var res hybrid.Result
		var err error
		wait := false
		switch op := r.IntN(20); {
		case op == 0:
			var rv *hybrid.Reservation
			if rv, err = l.Reserve(ctx, key, lim, 1); err == nil {
				res = rv.Result()
				if r.IntN(2) == 0 {
					rv.Cancel()
				}
			}
		case op == 1:
			var dec hybrid.Decision
			dec, err = l.AllowAll(ctx,
				hybrid.Check{Tier: "key", Key: key, Limit: lim},
				hybrid.Check{Tier: "tenant", Key: "tenant:" + strconv.Itoa(r.IntN(4)), Limit: cold[0]})
			res = dec.Result()
		case op == 2:
			wait = true
			wctx, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
			err = l.Wait(wctx, key, lim)
			cancel()
			if errors.Is(err, hybrid.ErrWouldWait) || errors.Is(err, context.DeadlineExceeded) {
				err = nil
			}
		default:
			res, err = l.AllowN(ctx, key, lim, 1+r.Int64N(3))
		}
		if !wait {
			el := int64(time.Since(start))
			for s := stats.slowest.Load(); el > s && !stats.slowest.CompareAndSwap(s, el); s = stats.slowest.Load() {
			}
		}
		stats.decisions.Add(1)
		if err != nil {
			stats.fail(err)
			continue
		}
		if res.Allowed {
			stats.allowed.Add(1)
		}
		if res.Source == hybrid.SourceFallback {
			stats.fallback.Add(1)
		}
	}
}
