package hybrid_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
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

// The integration and fault tests' fleets on real Redis: instances with a
// client each, their breakers' transitions, and the load they run.

// itInstance is one instance of the fleet test: a Limiter with its own
// client, and its breaker's transitions.
type itInstance struct {
	lim    *hybrid.Limiter
	rdb    redis.UniversalClient // a *redis.Client, or a *redis.ClusterClient
	states *transitions
}

// newITInstance returns an instance on the server at addr, with a client of
// its own (newITClient).
func newITInstance(t *testing.T, addr string, cfg hybrid.Config, bc breaker.Config, id string) *itInstance {
	t.Helper()
	return newITInstanceOn(t, newITClient(addr), cfg, bc, id)
}

// newITInstanceOn is newITInstance on the client rdb, which it closes at
// cleanup.
func newITInstanceOn(t *testing.T, rdb *redis.Client, cfg hybrid.Config, bc breaker.Config, id string) *itInstance {
	t.Helper()
	in := &itInstance{rdb: rdb, states: newTransitions()}
	bc.OnStateChange = in.states.record
	cfg.Breaker = bc
	cfg.InstanceID = id
	l, err := hybrid.New(in.rdb, cfg)
	if err != nil {
		in.rdb.Close()
		t.Fatal(err)
	}
	in.lim = l
	t.Cleanup(func() {
		l.Close(context.Background())
		in.rdb.Close()
	})
	return in
}

// newITClient returns a client of the server at addr that sends nothing
// twice (a settlement must not be re-sent after a read timeout), gives up on
// a dead server fast, and honours the deadlines of the breaker's calls.
func newITClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:                     addr,
		Dialer:                   redistest.LoopbackDialer(itNetTimeout),
		MaxRetries:               -1,
		DialTimeout:              itNetTimeout,
		ReadTimeout:              itNetTimeout,
		WriteTimeout:             itNetTimeout,
		ContextTimeoutEnabled:    true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
}

// close closes the limiter twice (the second call must do nothing) and then
// the client.
func (in *itInstance) close(t *testing.T, i int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := in.lim.Close(ctx); err != nil {
		t.Errorf("instance %d: Close: %v", i, err)
	}
	if err := in.lim.Close(ctx); err != nil {
		t.Errorf("instance %d: second Close: %v", i, err)
	}
	if _, err := in.lim.Allow(ctx, "hot", hybrid.Limit{Rate: 1, Burst: 1}); !errors.Is(err, hybrid.ErrClosed) {
		t.Errorf("instance %d: Allow after Close = %v, want ErrClosed", i, err)
	}
	in.rdb.Close()
}

type itFleet []*itInstance

// marks returns each instance's count of transitions so far.
func (f itFleet) marks() []int {
	m := make([]int, len(f))
	for i, in := range f {
		m[i] = in.states.len()
	}
	return m
}

// transitions records a breaker's state changes and signals each one.
type transitions struct {
	signal chan struct{} // one pending signal at most

	mu  sync.Mutex // protects log
	log []transition
}

// transition is one state change and when it was delivered.
type transition struct {
	from, to breaker.State
	at       time.Time
}

func (tr transition) String() string {
	return fmt.Sprintf("%v->%v", tr.from, tr.to)
}

func newTransitions() *transitions { return &transitions{signal: make(chan struct{}, 1)} }

// record is the breaker's OnStateChange.
func (s *transitions) record(from, to breaker.State) {
	s.mu.Lock()
	s.log = append(s.log, transition{from: from, to: to, at: time.Now()})
	s.mu.Unlock()
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

func (s *transitions) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.log)
}

// since returns the transitions from index i on.
func (s *transitions) since(i int) []transition {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.log[i:])
}

// wait waits at most timeout for a transition to the state to, from index i
// on, and returns the first such.
func (s *transitions) wait(to breaker.State, i int, timeout time.Duration) (transition, bool) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		for _, tr := range s.since(i) {
			if tr.to == to {
				return tr, true
			}
		}
		select {
		case <-s.signal:
		case <-timer.C:
			return transition{}, false
		}
	}
}

// itDecision is one decision of the load.
type itDecision struct {
	inst    int
	start   time.Time
	lat     time.Duration
	allowed bool
	src     hybrid.Source
}

// itLoad is what a load run decided.
type itLoad struct {
	all      []itDecision
	errors   int
	firstErr error
	// admitted is when the latest decision admitted from the allowance or
	// Redis (not the fallback) started, in Unix nanoseconds, as the load
	// runs: what a step may wait for.
	admitted atomic.Int64
}

// runITLoad makes workers goroutines per instance ask for key under lim every
// period, and meanwhile runs steps one after another on the calling
// goroutine, each given the load as it runs, then waits d, then stops the
// load. It returns every decision.
func runITLoad(f itFleet, workers int, key string, lim hybrid.Limit, period, d time.Duration, steps ...func(*itLoad)) *itLoad {
	start := time.Now()
	stop := make(chan struct{})
	var mu sync.Mutex
	out := &itLoad{}
	var wg sync.WaitGroup
	for i, in := range f {
		for range workers {
			wg.Go(func() {
				var mine []itDecision
				var errs int
				var first error
				tick := time.NewTicker(period)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						mu.Lock()
						out.all = append(out.all, mine...)
						out.errors += errs
						if out.firstErr == nil {
							out.firstErr = first
						}
						mu.Unlock()
						return
					case <-tick.C:
					}
					t0 := time.Now()
					res, err := in.lim.Allow(context.Background(), key, lim)
					lat := time.Since(t0)
					if err != nil {
						errs++
						if first == nil {
							first = err
						}
						continue
					}
					mine = append(mine, itDecision{inst: i, start: t0, lat: lat, allowed: res.Allowed, src: res.Source})
					if res.Allowed && res.Source != hybrid.SourceFallback {
						for at := t0.UnixNano(); ; {
							if last := out.admitted.Load(); last >= at || out.admitted.CompareAndSwap(last, at) {
								break
							}
						}
					}
				}
			})
		}
	}
	for _, step := range steps {
		step(out)
	}
	if rest := d - time.Since(start); rest > 0 {
		<-time.After(rest)
	}
	close(stop)
	wg.Wait()
	return out
}

func (l *itLoad) check(t *testing.T, phase string) {
	t.Helper()
	if l.errors > 0 {
		t.Errorf("%s: %d decisions failed; the first: %v", phase, l.errors, l.firstErr)
	}
	if len(l.all) == 0 {
		t.Errorf("%s: no decision", phase)
	}
}

func (l *itLoad) allowed() int {
	n := 0
	for _, d := range l.all {
		if d.allowed {
			n++
		}
	}
	return n
}

// sources counts the admitted decisions by source.
func (l *itLoad) sources() map[string]int {
	m := map[string]int{}
	for _, d := range l.all {
		if d.allowed {
			m[d.src.String()]++
		}
	}
	return m
}

// pct returns the p-quantile of sorted (nearest rank), 0 if it is empty.
func pct(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// redisTime returns Redis TIME.
func redisTime(t *testing.T, rdb redis.UniversalClient) time.Time {
	t.Helper()
	now, err := rdb.Time(t.Context()).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return now
}

// waitGoroutines waits at most timeout for the goroutine count to come down
// to n, polling it (nothing signals a goroutine's end), and returns the last
// count.
func waitGoroutines(n int, timeout time.Duration) int {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(timeout)
	for {
		got := runtime.NumGoroutine()
		if got <= n || time.Now().After(deadline) {
			return got
		}
		<-tick.C
	}
}
