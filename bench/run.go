package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/internal/plural"
	"github.com/hybridlimit/hybrid/internal/redistest"
)

// Run simulates sc's fleet in mode (Lease, Optimistic, Exact, Local,
// RedisRate or RedisRateAP) against t, and reports what it measured. Each
// instance has its own Redis client and limiter, and the run keeps its
// Redis keys under a prefix of its own, so runs do not share buckets. Run
// returns after about sc.Duration (plus up to 3 s for the hybrid instances
// to count each other first), having closed every limiter and client it
// made; an error in closing is reported in Report.CloseError. progress, if
// not nil, is called once a second from one goroutine.
//
// A long tail (sc.Passes) returns when every ask is done. On a spawned
// redis-server it first empties the server (FLUSHALL, SCRIPT FLUSH); on a
// Redis given by address it deletes the run's keys at the end. Its figures
// of the server's own (LongTailReport.Redis) assume that nothing else uses
// the server meanwhile: run one long tail at a time on a Target.
//
// If ctx ends, the run stops early and Run returns what it measured with
// ctx's error.
func Run(ctx context.Context, t *Target, sc Scenario, mode string, progress func(Progress)) (Report, error) {
	sc, err := sc.withDefaults()
	if err != nil {
		return Report{}, err
	}
	if err := prepare(ctx, t, sc, mode); err != nil {
		return Report{}, err
	}
	r := newRun(t, sc, mode)
	r.redisEmpty(ctx)
	if err := r.start(ctx); err != nil {
		return Report{}, errors.Join(append([]error{err}, r.close()...)...)
	}
	rep, err := r.measure(ctx, progress)
	if errs := r.close(); len(errs) > 0 {
		rep.CloseError = fmt.Sprintf("%d of %s: %v", len(errs), plural.Count(len(r.insts), "limiter"), errs[0])
	}
	if sc.Passes > 0 {
		// After the limiters and clients closed: what the limiters settled
		// then is part of what the decisions cost.
		r.tailCommands(&rep, r.commands()-r.tail.cmdsBefore)
		tailCPU(&rep, r.cpuSince())
		r.tailRedis(context.WithoutCancel(ctx), &rep)
		if cerr := t.cleanTail(context.WithoutCancel(ctx), r.prefix); cerr != nil {
			rep.CloseError = strings.TrimPrefix(rep.CloseError+"; "+cerr.Error(), "; ")
		}
	}
	return rep, err
}

// run is one mode's run.
type run struct {
	t      *Target
	sc     Scenario
	mode   string
	prefix string
	lim    hybrid.Limit // the hybrid modes' limit

	lo int // the fleet index of insts[0]

	keys            []string       // the keys as passed to the limiter
	asked, admitted []atomic.Int64 // requests per key

	insts []*instance

	// The outage, in nanoseconds since the first arrival: when Redis was
	// taken down and when it answered again; -1 until then.
	downAt, backAt atomic.Int64
	// onOutage, if not nil, is told "down" and "up" with those moments.
	onOutage func(kind string, at int64)

	// tail is what a long tail keeps for its figures.
	tail tailState
}

// instance is one member of the fleet.
type instance struct {
	rdb     redis.UniversalClient // nil in local mode
	cmds    redistest.Counter
	names   nameCounter // the commands sent, by name: in a long tail only
	dec     decider
	sched   schedule
	workers []*worker
}

// worker is one goroutine of an instance. The counters are read by the
// progress reporter; the rest belongs to the worker until it returns.
type worker struct {
	decisions, admitted, errors, late atomic.Int64
	fallback, redis                   atomic.Int64

	hist     Histogram
	firstErr error

	// Per-key counts of this worker alone, when the keys are few enough
	// (perWorkerKeys): a hot key's shared counters would cost the
	// decisions a contended cache line each.
	keyAsked, keyAdmitted []int64
	// The worker's own key draws, in a closed loop.
	rng  *rand.Rand
	zipf *rand.Zipf
	// tail is the keys the worker asks, in order, in a long tail
	// (dealTail); nil otherwise.
	tail []int32

	// The decisions issued during the outage.
	outDecisions, outFallback, outErrors int64
	outHist                              Histogram
}

func newRun(t *Target, sc Scenario, mode string) *run {
	return newRunRange(t, sc, mode, t.prefix(mode), 0, sc.Instances)
}

// newRunRange returns the run of instances [lo, hi) of sc's fleet, with
// their keys under prefix.
func newRunRange(t *Target, sc Scenario, mode, prefix string, lo, hi int) *run {
	r := &run{
		t:        t,
		sc:       sc,
		mode:     mode,
		prefix:   prefix,
		lo:       lo,
		keys:     make([]string, sc.Keys),
		asked:    make([]atomic.Int64, sc.Keys),
		admitted: make([]atomic.Int64, sc.Keys),
	}
	r.downAt.Store(-1)
	r.backAt.Store(-1)
	for i := range r.keys {
		r.keys[i] = "k" + strconv.Itoa(i)
		if needsRedis(mode) { // redis_rate has no prefix of its own
			r.keys[i] = r.prefix + ":" + r.keys[i]
		}
	}
	switch mode {
	case Lease:
		r.lim = hybrid.Limit{Rate: sc.Rate, Burst: sc.Burst, Mode: hybrid.Lease}
	case Optimistic:
		r.lim = hybrid.Limit{Rate: sc.Rate, Burst: sc.Burst, Mode: hybrid.Optimistic}
	case Exact:
		r.lim = hybrid.Limit{Rate: sc.Rate, Burst: sc.Burst, Mode: hybrid.Exact}
	}
	// The fleet's arrivals, split evenly over the instances.
	gap := float64(time.Second) * float64(sc.Instances) / sc.Offered()
	for i := lo; i < hi; i++ {
		rng := rand.New(rand.NewPCG(sc.Seed, uint64(i)))
		in := &instance{sched: schedule{rng: rng, gap: gap, keys: sc.Keys}}
		if sc.Dist == Zipf && sc.Keys > 1 {
			in.sched.zipf = rand.NewZipf(rng, sc.ZipfS, 1, uint64(sc.Keys-1))
		}
		for j := range sc.Workers {
			w := &worker{}
			if sc.Keys <= perWorkerKeys {
				w.keyAsked, w.keyAdmitted = make([]int64, sc.Keys), make([]int64, sc.Keys)
			}
			if sc.Closed {
				w.rng = rand.New(rand.NewPCG(sc.Seed, uint64(i)<<32|uint64(j)))
				switch {
				case sc.Passes > 0:
					w.tail = dealTail(sc, i, j, w.rng)
				case sc.Dist == Zipf && sc.Keys > 1:
					w.zipf = rand.NewZipf(w.rng, sc.ZipfS, 1, uint64(sc.Keys-1))
				}
			}
			in.workers = append(in.workers, w)
		}
		r.insts = append(r.insts, in)
	}
	return r
}

// hybridMode reports whether r runs the hybrid Limiter.
func (r *run) hybridMode() bool {
	return r.mode == Lease || r.mode == Optimistic || r.mode == Exact
}

// start makes every instance's client and limiter, and waits until they are
// ready: connected, and (hybrid) counting the whole fleet.
func (r *run) start(ctx context.Context) error {
	for i, in := range r.insts {
		if r.mode == Local {
			in.dec = &localDecider{lim: rate.Limit(r.sc.Rate), burst: int(r.sc.Burst)}
			continue
		}
		in.rdb = r.t.client(&in.cmds)
		if r.sc.Passes > 0 {
			in.rdb.AddHook(&in.names)
		}
		if err := in.rdb.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("bench: instance %d: PING: %w", i, err)
		}
		switch r.mode {
		case RedisRate:
			in.dec = &redisRateDecider{l: redis_rate.NewLimiter(in.rdb), lim: gcraLimit(r.sc.Rate, r.sc.Burst)}
			continue
		case RedisRateAP:
			// The blocking face: each call returns when its reply is in,
			// as on the plain client, and the calls made meanwhile by the
			// instance's other workers go out with it in one pipeline.
			ap, err := in.rdb.AutoPipeline()
			if err != nil {
				return fmt.Errorf("bench: instance %d: %w", i, err)
			}
			in.dec = &redisRateDecider{l: redis_rate.NewLimiter(ap), lim: gcraLimit(r.sc.Rate, r.sc.Burst), ap: ap}
			continue
		}
		cfg := r.sc.Config
		cfg.Prefix = r.prefix
		cfg.InstanceID = r.mode + "-" + strconv.Itoa(r.lo+i)
		l, err := hybrid.New(in.rdb, cfg)
		if err != nil {
			return fmt.Errorf("bench: instance %d: %w", i, err)
		}
		in.dec = &hybridDecider{l: l, lim: r.lim}
		if r.sc.Warm {
			if err := l.Warm(ctx); err != nil {
				return fmt.Errorf("bench: instance %d: %w", i, err)
			}
		}
	}
	if r.hybridMode() {
		return r.waitFleet(ctx)
	}
	return nil
}

// fleetWait bounds the wait for the hybrid instances to count each other:
// three heartbeat intervals.
const fleetWait = 3 * time.Second

// waitFleet waits until every hybrid instance counts the whole fleet (the
// first heartbeats of the earlier ones did not), as in a fleet that has been
// running, or fleetWait has passed. The optimistic budgets are shares of the
// fleet size.
func (r *run) waitFleet(ctx context.Context) error {
	if r.sc.Config.Instances != 0 {
		return nil // a fixed fleet size: nothing to learn
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(fleetWait)
	for time.Now().Before(deadline) {
		all := true
		for _, in := range r.insts {
			if in.dec.(*hybridDecider).l.Stats().Reconcile.Instances < int64(r.sc.Instances) {
				all = false
				break
			}
		}
		if all {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// measure runs the load and builds the report.
func (r *run) measure(ctx context.Context, progress func(Progress)) (Report, error) {
	heapBefore := heapAlloc()
	sentBefore := r.sent()
	r.redisBefore(ctx)
	cmdsBefore := r.commands()
	r.tail.cmdsBefore = cmdsBefore
	r.cpuStart()
	t0, err := r.t.now(ctx)
	if err != nil {
		return Report{}, err
	}
	start := time.Now()
	var (
		owg    sync.WaitGroup
		outErr error
	)
	if r.sc.Outage.For > 0 {
		owg.Go(func() { outErr = r.outage(ctx, start) })
	}
	timeline, elapsed := r.drive(ctx, start, progress)
	owg.Wait()
	t1, terr := r.t.now(context.WithoutCancel(ctx))
	r.redisLast(context.WithoutCancel(ctx))
	tl := r.tally(heapBefore, cmdsBefore, sentBefore)
	rep := r.build(tl, t1.Sub(t0), elapsed, timeline)
	r.longTail(&rep, tl)
	if err := errors.Join(outErr, terr); err != nil {
		return rep, err
	}
	return rep, ctx.Err()
}

// heapAlloc returns the live heap after a GC.
func heapAlloc() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// drive runs r's workers from start until they are done, sampling them
// once a second: it returns the timeline and the time the workers took.
// progress, if not nil, is called with each second's progress, from one
// goroutine.
func (r *run) drive(ctx context.Context, start time.Time, progress func(Progress)) ([]Sample, time.Duration) {
	var wg sync.WaitGroup
	for _, in := range r.insts {
		for _, w := range in.workers {
			wg.Go(func() { r.work(ctx, in, w, start) })
		}
	}
	done := make(chan struct{})
	var (
		timeline []Sample
		pwg      sync.WaitGroup
	)
	pwg.Go(func() { timeline = r.report(start, done, progress) })
	wg.Wait()
	elapsed := time.Since(start)
	close(done)
	pwg.Wait()
	return timeline, elapsed
}

// closeTimeout bounds the closing of one limiter: its last settlement.
const closeTimeout = 10 * time.Second

// close closes every limiter, all at once, then every client, and returns
// the limiters' errors.
func (r *run) close() []error {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	var (
		mu   sync.Mutex // protects errs
		errs []error
		wg   sync.WaitGroup
	)
	for i, in := range r.insts {
		if in.dec != nil {
			wg.Go(func() {
				if err := in.dec.close(ctx); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("bench: instance %d: %w", i, err))
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	for _, in := range r.insts {
		if in.rdb != nil {
			in.rdb.Close()
		}
	}
	return errs
}

// prepare checks that mode can run sc on t, and empties t for a long tail.
func prepare(ctx context.Context, t *Target, sc Scenario, mode string) error {
	if err := checkMode(t, mode); err != nil {
		return err
	}
	if sc.Outage.For > 0 && !t.Owned() {
		return fmt.Errorf("%w: %s", ErrNotOwned, t)
	}
	if sc.Passes > 0 {
		return t.emptyForTail(ctx)
	}
	return nil
}
