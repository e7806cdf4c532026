// Package bench simulates a fleet of service instances that share rate
// limits, and measures what each way of limiting admits and what it costs:
// the hybrid Limiter in its three modes, one golang.org/x/time/rate limiter
// per instance (the baseline that multiplies a limit by the fleet size), and
// go-redis/redis_rate (one script call per decision) on a real Redis.
//
// Run drives one mode through one Scenario against a Target and returns a
// Report; WriteTable prints reports side by side. The command
// bench/cmd/hybridbench is a thin shell around them. The package is for
// fleet behaviour (admitted against the ideal, Redis load, latency under an
// open-loop load); the benchmarks in the other packages are the place for
// nanoseconds per operation.
//
// # Load
//
// The fleet asks for Demand times the sum of the keys' limits: the arrival
// rate of requests is Demand * Rate * Keys / Cost per second, split evenly
// over the instances. With one key (Keys == 1) that key is asked Demand
// times its limit; with uniform keys every key is; with Zipf keys the mean
// key is, the head far more and the tail less. Each instance's arrivals are
// a Poisson process (exponential gaps, seeded from Scenario.Seed), and each
// request's key is drawn at arrival. The load is open-loop: arrivals are
// scheduled in advance, and an instance's workers take them in order, wait
// for each one's time and issue it; a worker that is behind issues at once
// and the decision counts as late (Report.Late). Report.Offered and
// Report.DecisionsPerSec show whether the generator kept up.
//
// # What is ideal
//
// The window T is measured on the Redis clock (TIME, or time.Now for
// miniredis, whose scripts read it) just before the first arrival and just
// after the last decision. A key may admit at most B + R*T tokens in it.
// Keys asked for at least that much are saturated: admitted tokens over
// them are compared with the ideal (under-admission), and the largest
// excess of any key over B + R*T is the overshoot.
//
// # Outages
//
// A Scenario with an Outage takes the Target's Redis away during the run
// (Target.Owned: the embedded miniredis or a spawned redis-server) and
// brings it back empty; Report.Outage says what the fleet did meanwhile
// and how soon the hybrid instances left their fallback. The accuracy
// figures are computed as ever, but B + R*T no longer bounds the hybrid
// modes then: their fallback admits while Redis is down, and what it
// admitted is charged to a bucket that came back empty.
package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
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
	"github.com/hybridlimit/hybrid/internal/redistest"
)

// The modes a run can measure.
const (
	// Lease is hybrid.Lease: local decisions on leases reserved in Redis.
	Lease = "lease"
	// Optimistic is hybrid.Optimistic: local budgets charged afterwards.
	Optimistic = "optimistic"
	// Exact is hybrid.Exact through the Limiter: one script call per
	// decision.
	Exact = "exact"
	// Local is one golang.org/x/time/rate limiter per instance and key,
	// with the full limit each: what a fleet without coordination admits.
	Local = "local"
	// RedisRate is github.com/go-redis/redis_rate/v10 (GCRA, one script
	// call per decision), on a real Redis only.
	RedisRate = "redis_rate"
)

// Modes returns the modes compared by default on t: lease, optimistic,
// exact and local, and redis_rate if t is a real Redis.
func Modes(t *Target) []string {
	m := []string{Lease, Optimistic, Exact, Local}
	if t.Real() {
		m = append(m, RedisRate)
	}
	return m
}

// Errors.
var (
	// ErrMode is returned by Run for a mode it does not know.
	ErrMode = errors.New("bench: unknown mode")
	// ErrNeedsRedis is returned by Run for redis_rate on miniredis.
	ErrNeedsRedis = errors.New("bench: redis_rate needs a real Redis")
	// ErrScenario is returned by Run for a scenario out of range.
	ErrScenario = errors.New("bench: invalid scenario")
	// ErrNotOwned is returned by Run for a Scenario with an Outage on a
	// Target that did not start its Redis (Dial, DialCluster): only the
	// embedded miniredis and a spawned redis-server can be taken down.
	ErrNotOwned = errors.New("bench: an outage needs a Redis started here (embedded miniredis or spawned redis-server), not one given by address")
)

// The key distributions.
const (
	Uniform = "uniform"
	Zipf    = "zipf"
)

// LateAfter is how far behind its scheduled time a request may be issued
// before it counts as late: the generator fell behind. Go's timers
// themselves wake up to about 2 ms late on a busy Linux machine, which is
// not counted.
const LateAfter = 5 * time.Millisecond

// memMinKeys is the fewest tracked keys for which memory per key is
// reported: below it the fixed costs of the clients and limiters drown the
// figure.
const memMinKeys = 1000

// Scenario is a simulated fleet and its load. A zero field means its
// documented default, so the zero Scenario is one hot key asked for at 4x
// its limit of 1000/s by 8 instances for 10 s.
type Scenario struct {
	// Instances is the fleet size. 0 means 8.
	Instances int
	// Duration is how long requests arrive. 0 means 10s.
	Duration time.Duration
	// Keys is how many keys are asked for. 0 means 1, a hot key.
	Keys int
	// Dist is how a request's key is drawn: Uniform or Zipf. "" means
	// Uniform.
	Dist string
	// ZipfS is the exponent s > 1 of Zipf: key i (from 0) is drawn with a
	// probability proportional to (1+i)^-s. 0 means 1.1.
	ZipfS float64
	// Demand is the load as a multiple of the sum of the keys' limits: the
	// fleet asks for Demand * Rate * Keys tokens per second. 0 means 4.
	Demand float64
	// Rate is every key's limit in tokens per second. 0 means 1000.
	Rate float64
	// Burst is every key's burst in tokens. 0 means 1000.
	Burst int64
	// Cost is the tokens each request takes, at most Burst. 0 means 1.
	Cost int64
	// Workers is how many goroutines of each instance issue its requests,
	// the requests it can have in flight. 0 means 4.
	Workers int
	// Seed seeds the arrival times and the keys drawn: runs of the same
	// Scenario, whatever their mode, are asked the same requests at the
	// same times.
	Seed uint64
	// Config configures the hybrid Limiters. Run sets Prefix (unique per
	// run) and InstanceID.
	Config hybrid.Config
	// Outage, if its For is not 0, takes the Target's Redis away during
	// each run, At after the first arrival, for For, and brings it back
	// empty. At + For must not exceed Duration.
	Outage Outage
	// Closed, if true, runs a closed loop instead of Poisson arrivals:
	// each worker issues its next request as soon as the last one is
	// answered, for Duration. Demand is ignored; the run measures the most
	// decisions per second the fleet can make, and every key asked for is
	// saturated. Latency is then measured on one decision in 16, so that
	// the bench's clock reads do not weigh on the throughput.
	Closed bool
}

// Outage is a Redis outage in a run: from At after the first arrival, for
// For. The zero Outage is none.
type Outage struct {
	At, For time.Duration
}

// ParseOutage parses "DUR@AT", such as "2s@5s": down for DUR from AT after
// the first arrival. "" is no outage.
func ParseOutage(s string) (Outage, error) {
	if s == "" {
		return Outage{}, nil
	}
	dur, at, ok := strings.Cut(s, "@")
	if !ok {
		return Outage{}, fmt.Errorf("%w: outage %q, want DUR@AT such as 2s@5s", ErrScenario, s)
	}
	f, err := time.ParseDuration(dur)
	if err != nil {
		return Outage{}, fmt.Errorf("%w: outage %q: %w", ErrScenario, s, err)
	}
	a, err := time.ParseDuration(at)
	if err != nil {
		return Outage{}, fmt.Errorf("%w: outage %q: %w", ErrScenario, s, err)
	}
	if f <= 0 || a < 0 {
		return Outage{}, fmt.Errorf("%w: outage %q, want a positive DUR and AT >= 0", ErrScenario, s)
	}
	return Outage{At: a, For: f}, nil
}

// String returns o as DUR@AT, or "" for none.
func (o Outage) String() string {
	if o.For == 0 {
		return ""
	}
	return o.For.String() + "@" + o.At.String()
}

// withDefaults returns sc with its zero fields set, or an error wrapping
// ErrScenario.
func (sc Scenario) withDefaults() (Scenario, error) {
	if sc.Instances == 0 {
		sc.Instances = 8
	}
	if sc.Duration == 0 {
		sc.Duration = 10 * time.Second
	}
	if sc.Keys == 0 {
		sc.Keys = 1
	}
	if sc.Dist == "" {
		sc.Dist = Uniform
	}
	if sc.ZipfS == 0 {
		sc.ZipfS = 1.1
	}
	if sc.Demand == 0 {
		sc.Demand = 4
	}
	if sc.Rate == 0 {
		sc.Rate = 1000
	}
	if sc.Burst == 0 {
		sc.Burst = 1000
	}
	if sc.Cost == 0 {
		sc.Cost = 1
	}
	if sc.Workers == 0 {
		sc.Workers = 4
	}
	switch {
	case sc.Instances < 0, sc.Duration < 0, sc.Keys < 0, sc.Workers < 0:
		return sc, fmt.Errorf("%w: negative count or duration", ErrScenario)
	case sc.Dist != Uniform && sc.Dist != Zipf:
		return sc, fmt.Errorf("%w: distribution %q, want %q or %q", ErrScenario, sc.Dist, Uniform, Zipf)
	case sc.Dist == Zipf && !(sc.ZipfS > 1):
		return sc, fmt.Errorf("%w: Zipf exponent %v, want > 1", ErrScenario, sc.ZipfS)
	case !(sc.Demand > 0) || math.IsInf(sc.Demand, 0):
		return sc, fmt.Errorf("%w: demand %v", ErrScenario, sc.Demand)
	case !(sc.Rate >= 1e-6 && sc.Rate <= 1e9):
		return sc, fmt.Errorf("%w: rate %v, want 1e-6 to 1e9", ErrScenario, sc.Rate)
	case sc.Burst < 1 || sc.Burst > 1e9:
		return sc, fmt.Errorf("%w: burst %d, want 1 to 1e9", ErrScenario, sc.Burst)
	case sc.Cost < 1 || sc.Cost > sc.Burst:
		return sc, fmt.Errorf("%w: cost %d, want 1 to the burst", ErrScenario, sc.Cost)
	case sc.Outage.For < 0 || sc.Outage.At < 0:
		return sc, fmt.Errorf("%w: negative outage %v@%v", ErrScenario, sc.Outage.For, sc.Outage.At)
	case sc.Outage.For > 0 && sc.Outage.At+sc.Outage.For > sc.Duration:
		return sc, fmt.Errorf("%w: outage %v@%v ends after the duration %v", ErrScenario, sc.Outage.For, sc.Outage.At, sc.Duration)
	}
	return sc, nil
}

// Offered returns the requests per second the fleet asks for:
// Demand * Rate * Keys / Cost, with sc's defaults applied.
func (sc Scenario) Offered() float64 {
	sc, _ = sc.withDefaults()
	return sc.Demand * sc.Rate * float64(sc.Keys) / float64(sc.Cost)
}

// String describes sc in one line, with its defaults applied.
func (sc Scenario) String() string {
	sc, _ = sc.withDefaults()
	keys := "1 hot key"
	if sc.Keys > 1 {
		keys = strconv.Itoa(sc.Keys) + " keys " + sc.Dist
		if sc.Dist == Zipf {
			keys += "(" + strconv.FormatFloat(sc.ZipfS, 'g', -1, 64) + ")"
		}
	}
	load := fmt.Sprintf("demand %gx (%.0f req/s)", sc.Demand, sc.Offered())
	if sc.Closed {
		load = "closed loop (as fast as answered)"
	}
	s := fmt.Sprintf("%d instances x %d workers, %s, %s, R=%g/s B=%d cost %d, %v",
		sc.Instances, sc.Workers, keys, load, sc.Rate, sc.Burst, sc.Cost, sc.Duration)
	if sc.Outage.For > 0 {
		s += fmt.Sprintf(", Redis down for %v at %v", sc.Outage.For, sc.Outage.At)
	}
	return s
}

// Progress is a snapshot of a run in progress, given to Run's progress
// function once a second.
type Progress struct {
	Mode      string
	Elapsed   time.Duration // since the first arrival
	Duration  time.Duration // the Scenario's
	Decisions int64         // so far
	Admitted  int64         // decisions allowed so far
	Errors    int64         // decisions that failed so far
	Rate      float64       // decisions per second over the last second
}

// Sample is one second of a run (the last one may be shorter).
type Sample struct {
	At        float64 `json:"t_s"`                // seconds since the first arrival, at the sample's end
	Decisions int64   `json:"decisions"`          // decisions in the sample
	Admitted  int64   `json:"admitted"`           // decisions allowed in the sample
	Fallback  int64   `json:"fallback"`           // decisions made by the fallback policy in the sample
	Degraded  bool    `json:"degraded,omitempty"` // some hybrid instance's fallback policy was deciding at the sample's end
}

// OutageReport is what a run measured while its Redis was down: the
// decisions issued from the moment it was taken away (From) to the moment
// it answered again, empty (To).
type OutageReport struct {
	// From and To are in seconds since the first arrival.
	From float64 `json:"from_s"`
	To   float64 `json:"to_s"`
	// Decisions counts the decisions issued in the outage and answered;
	// DecisionsPerSec is them over To - From; Errors counts those that
	// failed.
	Decisions       int64   `json:"decisions"`
	DecisionsPerSec float64 `json:"decisions_per_s"`
	Errors          int64   `json:"errors"`
	// The latency of the decisions issued in the outage.
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	// Fallback counts those made by the fallback policy, FallbackPct as a
	// percentage of Decisions.
	Fallback    int64   `json:"fallback"`
	FallbackPct float64 `json:"fallback_pct"`
	// Recovery is, for the hybrid modes, the time from To to the first
	// once-a-second sample at which no instance's Stats().Degraded is true
	// any more; Recovered is false if that did not happen within the run,
	// or the mode has no hybrid Limiter. The sampler looks once a second,
	// so Recovery overstates the breakers' actual recovery by up to a
	// second.
	Recovery  time.Duration `json:"recovery_ns"`
	Recovered bool          `json:"recovered"`
}

// Report is what a run measured, for one mode. Token figures are in tokens
// (decisions times Scenario.Cost).
type Report struct {
	Mode   string `json:"mode"`
	Target string `json:"target"`

	// The scenario, with defaults applied. SyncInterval and LocalCapacity
	// are as configured (0: the Limiter's default).
	Instances     int           `json:"instances"`
	Workers       int           `json:"workers"`
	Keys          int           `json:"keys"`
	Dist          string        `json:"dist"`
	ZipfS         float64       `json:"zipf_s,omitempty"`
	Demand        float64       `json:"demand"`
	Rate          float64       `json:"rate"`
	Burst         int64         `json:"burst"`
	Cost          int64         `json:"cost"`
	Seed          uint64        `json:"seed"`
	SyncInterval  time.Duration `json:"sync_interval_ns"`
	LocalCapacity int64         `json:"local_capacity"`

	// Closed reports a closed loop (Scenario.Closed): Offered is 0 then.
	Closed bool `json:"closed,omitempty"`
	// Procs is the number of processes the instances ran in (RunProcs);
	// 0 means this one.
	Procs int `json:"procs,omitempty"`

	// Window is T, on the Redis clock.
	Window time.Duration `json:"window_ns"`
	// Offered is the scheduled requests per second; DecisionsPerSec what
	// was achieved (decisions over the wall-clock window).
	Offered         float64 `json:"offered_per_s"`
	DecisionsPerSec float64 `json:"decisions_per_s"`
	// Decisions counts answered requests (allowed or denied); Late those
	// issued more than LateAfter behind schedule.
	Decisions int64 `json:"decisions"`
	Late      int64 `json:"late"`
	// Decision latency, the time Allow took.
	P50  time.Duration `json:"p50_ns"`
	P99  time.Duration `json:"p99_ns"`
	P999 time.Duration `json:"p999_ns"`
	Max  time.Duration `json:"max_ns"`
	// Commands counts the Redis commands the fleet sent in the window,
	// each command of a pipeline included.
	Commands            int64   `json:"commands"`
	CommandsPerDecision float64 `json:"commands_per_decision"`

	// Admitted counts allowed decisions; AdmittedTokens their tokens.
	Admitted       int64 `json:"admitted"`
	AdmittedTokens int64 `json:"admitted_tokens"`
	// IdealPerKey is B + R*T.
	IdealPerKey float64 `json:"ideal_per_key"`
	// SaturatedKeys counts the keys asked for at least IdealPerKey tokens;
	// IdealSaturated is IdealPerKey times their number, AdmittedSaturated
	// the tokens they were admitted, AdmittedPct the second as a
	// percentage of the first.
	SaturatedKeys     int     `json:"saturated_keys"`
	IdealSaturated    float64 `json:"ideal_saturated"`
	AdmittedSaturated int64   `json:"admitted_saturated"`
	AdmittedPct       float64 `json:"admitted_pct"`
	// Overshoot is the largest excess of any key over IdealPerKey, in
	// tokens (0 if none went over) and as a percentage of IdealPerKey.
	// OvershootBound is Limiter.Overshoot, the documented bound, for
	// optimistic mode.
	Overshoot      float64 `json:"overshoot"`
	OvershootPct   float64 `json:"overshoot_pct"`
	OvershootBound int64   `json:"overshoot_bound,omitempty"`
	// UnderPct is how far AdmittedPct falls short of 100, or 0.
	UnderPct float64 `json:"under_pct"`

	// TrackedKeys is the keys held in memory at the end, summed over the
	// instances (hybrid: Stats().Reconcile.Keys; local: limiters made).
	// MemPerKey approximates the heap each costs: the growth of HeapAlloc,
	// after a GC, from before the first arrival to after the last
	// decision, over TrackedKeys. Anything else allocated meanwhile (new
	// connections, buffers) counts too, so it is 0 (not measured) under
	// 1000 tracked keys.
	TrackedKeys int     `json:"tracked_keys"`
	MemPerKey   float64 `json:"mem_per_key_bytes"`

	// Fallback counts decisions made by the fallback policy, RedisSourced
	// those that waited for a round trip (hybrid.SourceRedis; every
	// decision of exact and redis_rate).
	Fallback     int64 `json:"fallback"`
	RedisSourced int64 `json:"redis_sourced"`
	// Errors counts decisions that failed; FirstError is the first.
	Errors     int64  `json:"errors"`
	FirstError string `json:"first_error,omitempty"`
	// RedisErrors counts the hybrid Limiters' failed calls to Redis, summed
	// over the instances: rounds, key settlements, fetches (failed or not
	// answered within ColdWait), heartbeats and Exact calls. Breaker counts
	// their breakers' state changes. Neither is an error of a decision: the
	// fallback policy answers meanwhile.
	RedisErrors uint64 `json:"redis_errors"`
	Breaker     uint64 `json:"breaker_transitions"`
	// CloseError reports the limiters that failed to close at the end (such
	// as a last settlement that timed out), with the first error: it does
	// not change the figures.
	CloseError string `json:"close_error,omitempty"`

	// Timeline is the run second by second.
	Timeline []Sample `json:"timeline"`

	// Outage is what was measured while Redis was down, nil if the
	// Scenario had no Outage. Accuracy figures still compare with
	// B + R*T, which no longer bounds the hybrid modes: their fallback
	// decides alone meanwhile, and what it admits is charged afterwards.
	Outage *OutageReport `json:"outage,omitempty"`
}

// Run simulates sc's fleet in mode (Lease, Optimistic, Exact, Local or
// RedisRate) against t, and reports what it measured. Each instance has its
// own Redis client and limiter, and the run keeps its Redis keys under a
// prefix of its own, so runs do not share buckets. Run returns after about
// sc.Duration (plus up to 3 s for the hybrid instances to count each other
// first), having closed every limiter and client it made; an error in
// closing is reported in Report.CloseError. progress, if not nil, is called
// once a second from one goroutine.
//
// If ctx ends, the run stops early and Run returns what it measured with
// ctx's error.
func Run(ctx context.Context, t *Target, sc Scenario, mode string, progress func(Progress)) (Report, error) {
	sc, err := sc.withDefaults()
	if err != nil {
		return Report{}, err
	}
	switch mode {
	case Lease, Optimistic, Exact, Local:
	case RedisRate:
		if !t.Real() {
			return Report{}, ErrNeedsRedis
		}
	default:
		return Report{}, fmt.Errorf("%w %q", ErrMode, mode)
	}
	if sc.Outage.For > 0 && !t.Owned() {
		return Report{}, fmt.Errorf("%w: %s", ErrNotOwned, t)
	}
	r := newRun(t, sc, mode)
	if err := r.start(ctx); err != nil {
		return Report{}, errors.Join(append([]error{err}, r.close()...)...)
	}
	rep, err := r.measure(ctx, progress)
	if errs := r.close(); len(errs) > 0 {
		rep.CloseError = fmt.Sprintf("%d of %d limiters: %v", len(errs), len(r.insts), errs[0])
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
}

// instance is one member of the fleet.
type instance struct {
	rdb     redis.UniversalClient // nil in local mode
	cmds    redistest.Counter
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
		if mode == RedisRate { // redis_rate has no prefix of its own
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
				if sc.Dist == Zipf && sc.Keys > 1 {
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
		if err := in.rdb.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("bench: instance %d: PING: %w", i, err)
		}
		if r.mode == RedisRate {
			in.dec = &redisRateDecider{l: redis_rate.NewLimiter(in.rdb), lim: gcraLimit(r.sc.Rate, r.sc.Burst)}
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
	cmdsBefore := r.commands()
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
	tl := r.tally(heapBefore, cmdsBefore)
	rep := r.build(tl, t1.Sub(t0), elapsed, timeline)
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

// tally is what a run's instances counted, in a form that the instances
// of several processes can add up (see RunProcs).
type tally struct {
	Hist, OutHist Histogram

	Decisions, Admitted, Late, Fallback, Redis, Errors int64
	OutDecisions, OutFallback, OutErrors               int64
	FirstError                                         string

	// Per key: requests asked and admitted.
	Asked, KeyAdmitted []int64

	Tracked              int
	RedisErrors, Breaker uint64
	Commands             int64
	// HeapGrowth is the growth of the live heap over the run, in bytes.
	HeapGrowth int64
	// OvershootBound is Limiter.Overshoot, for optimistic mode.
	OvershootBound int64
}

// add adds o to t.
func (t *tally) add(o *tally) {
	t.Hist.Merge(&o.Hist)
	t.OutHist.Merge(&o.OutHist)
	t.Decisions += o.Decisions
	t.Admitted += o.Admitted
	t.Late += o.Late
	t.Fallback += o.Fallback
	t.Redis += o.Redis
	t.Errors += o.Errors
	t.OutDecisions += o.OutDecisions
	t.OutFallback += o.OutFallback
	t.OutErrors += o.OutErrors
	if t.FirstError == "" {
		t.FirstError = o.FirstError
	}
	if t.Asked == nil {
		t.Asked, t.KeyAdmitted = make([]int64, len(o.Asked)), make([]int64, len(o.KeyAdmitted))
	}
	for i := range min(len(t.Asked), len(o.Asked)) {
		t.Asked[i] += o.Asked[i]
		t.KeyAdmitted[i] += o.KeyAdmitted[i]
	}
	t.Tracked += o.Tracked
	t.RedisErrors += o.RedisErrors
	t.Breaker += o.Breaker
	t.Commands += o.Commands
	t.HeapGrowth += o.HeapGrowth
	t.OvershootBound = max(t.OvershootBound, o.OvershootBound)
}

// tally adds up what r's workers and instances counted. Call it once the
// workers have returned, before the limiters are closed. heapBefore and
// cmdsBefore are the live heap and the commands sent before the run.
func (r *run) tally(heapBefore uint64, cmdsBefore int64) tally {
	var t tally
	t.Commands = r.commands() - cmdsBefore
	for _, in := range r.insts {
		for _, w := range in.workers {
			t.Hist.Merge(&w.hist)
			t.OutHist.Merge(&w.outHist)
			t.OutDecisions += w.outDecisions
			t.OutFallback += w.outFallback
			t.OutErrors += w.outErrors
			t.Decisions += w.decisions.Load()
			t.Admitted += w.admitted.Load()
			t.Late += w.late.Load()
			t.Fallback += w.fallback.Load()
			t.Redis += w.redis.Load()
			t.Errors += w.errors.Load()
			if w.firstErr != nil && t.FirstError == "" {
				t.FirstError = w.firstErr.Error()
			}
		}
	}
	t.Asked, t.KeyAdmitted = r.perKey()
	for _, in := range r.insts {
		t.Tracked += in.dec.tracked()
		if d, ok := in.dec.(*hybridDecider); ok {
			st := d.l.Stats()
			rc := st.Reconcile
			t.RedisErrors += rc.RoundErrors + rc.KeyErrors + rc.FetchErrors + rc.FetchTimeouts + rc.HeartbeatErrors + st.ExactErrors
			t.Breaker += rc.Transitions
		}
	}
	t.HeapGrowth = int64(heapAlloc()) - int64(heapBefore)
	if r.mode == Optimistic && len(r.insts) > 0 {
		t.OvershootBound = r.insts[0].dec.(*hybridDecider).l.Overshoot(r.lim)
	}
	return t
}

// build makes the report of a run from what its instances counted, the
// window T on the Redis clock, the time the workers took and the timeline.
func (r *run) build(t tally, window, elapsed time.Duration, timeline []Sample) Report {
	sc := r.sc
	rep := Report{
		Mode:          r.mode,
		Target:        r.t.String(),
		Instances:     sc.Instances,
		Workers:       sc.Workers,
		Keys:          sc.Keys,
		Dist:          sc.Dist,
		Demand:        sc.Demand,
		Rate:          sc.Rate,
		Burst:         sc.Burst,
		Cost:          sc.Cost,
		Seed:          sc.Seed,
		SyncInterval:  sc.Config.SyncInterval,
		LocalCapacity: sc.Config.LocalCapacity,
		Window:        window,
		Offered:       sc.Offered(),
		Closed:        sc.Closed,
		Commands:      t.Commands,
		Timeline:      timeline,

		Decisions:      t.Decisions,
		Admitted:       t.Admitted,
		AdmittedTokens: t.Admitted * sc.Cost,
		Late:           t.Late,
		Fallback:       t.Fallback,
		RedisSourced:   t.Redis,
		Errors:         t.Errors,
		FirstError:     t.FirstError,
		TrackedKeys:    t.Tracked,
		RedisErrors:    t.RedisErrors,
		Breaker:        t.Breaker,
		OvershootBound: t.OvershootBound,
	}
	if sc.Dist == Zipf {
		rep.ZipfS = sc.ZipfS
	}
	if sc.Closed {
		rep.Offered = 0
	}
	if elapsed > 0 {
		rep.DecisionsPerSec = float64(rep.Decisions) / elapsed.Seconds()
	}
	rep.P50, rep.P99, rep.P999, rep.Max = t.Hist.Quantile(0.5), t.Hist.Quantile(0.99), t.Hist.Quantile(0.999), t.Hist.Max()
	if rep.Decisions > 0 {
		rep.CommandsPerDecision = float64(t.Commands) / float64(rep.Decisions)
	}
	r.accuracy(&rep, t.Asked, t.KeyAdmitted)
	if rep.TrackedKeys >= memMinKeys && t.HeapGrowth > 0 {
		rep.MemPerKey = float64(t.HeapGrowth) / float64(rep.TrackedKeys)
	}
	if sc.Outage.For > 0 {
		if down, back := r.downAt.Load(), r.backAt.Load(); down >= 0 && back >= down {
			out := OutageReport{
				From:      time.Duration(down).Seconds(),
				To:        time.Duration(back).Seconds(),
				Decisions: t.OutDecisions,
				Errors:    t.OutErrors,
				Fallback:  t.OutFallback,
				P50:       t.OutHist.Quantile(0.5),
				P99:       t.OutHist.Quantile(0.99),
			}
			if back > down {
				out.DecisionsPerSec = float64(out.Decisions) / time.Duration(back-down).Seconds()
			}
			if out.Decisions > 0 {
				out.FallbackPct = 100 * float64(out.Fallback) / float64(out.Decisions)
			}
			if r.hybridMode() {
				rec := recovery(timeline, time.Duration(back))
				out.Recovery, out.Recovered = max(rec, 0), rec >= 0
			}
			rep.Outage = &out
		}
	}
	return rep
}

// outage takes the Target's Redis down at sc.Outage.At after start and
// brings it back, empty, sc.Outage.For later, recording both moments. If
// ctx ends first, it does not take Redis down, or brings it back at once.
func (r *run) outage(ctx context.Context, start time.Time) error {
	o := r.sc.Outage
	timer := time.NewTimer(time.Until(start.Add(o.At)))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return nil
	case <-timer.C:
	}
	down := int64(time.Since(start))
	r.downAt.Store(down)
	if r.onOutage != nil {
		r.onOutage("down", down)
	}
	err := r.t.down()
	timer.Reset(time.Until(start.Add(o.At + o.For)))
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
	if uerr := r.t.up(context.WithoutCancel(ctx)); uerr != nil {
		return errors.Join(err, uerr)
	}
	back := int64(time.Since(start))
	r.backAt.Store(back)
	if r.onOutage != nil {
		r.onOutage("up", back)
	}
	return err
}

// inOutage reports whether a decision issued at since (from the first
// arrival) was issued while Redis was down.
func (r *run) inOutage(since time.Duration) bool {
	down := r.downAt.Load()
	if down < 0 || int64(since) < down {
		return false
	}
	back := r.backAt.Load()
	return back < 0 || int64(since) < back
}

// degraded reports whether any hybrid instance's fallback policy is
// deciding now.
func (r *run) degraded() bool {
	for _, in := range r.insts {
		if d, ok := in.dec.(*hybridDecider); ok && d.l.Stats().Degraded {
			return true
		}
	}
	return false
}

// accuracy fills in the figures that compare admitted with ideal.
func (r *run) accuracy(rep *Report, asked, admitted []int64) {
	cost := r.sc.Cost
	ideal := float64(r.sc.Burst) + r.sc.Rate*rep.Window.Seconds()
	rep.IdealPerKey = ideal
	over := math.Inf(-1)
	for i := range r.keys {
		asked, got := asked[i]*cost, admitted[i]*cost
		over = max(over, float64(got)-ideal)
		if float64(asked) >= ideal || r.sc.Closed && asked > 0 {
			rep.SaturatedKeys++
			rep.AdmittedSaturated += got
		}
	}
	rep.Overshoot = max(over, 0)
	rep.OvershootPct = 100 * rep.Overshoot / ideal
	rep.IdealSaturated = ideal * float64(rep.SaturatedKeys)
	if rep.SaturatedKeys > 0 {
		rep.AdmittedPct = 100 * float64(rep.AdmittedSaturated) / rep.IdealSaturated
		rep.UnderPct = max(100-rep.AdmittedPct, 0)
	}
}

// perWorkerKeys is the most keys for which each worker counts requests per
// key on its own.
const perWorkerKeys = 4096

// perKey returns the requests asked and admitted per key, summed over the
// workers. Call it once the workers have returned.
func (r *run) perKey() (asked, admitted []int64) {
	asked, admitted = make([]int64, len(r.keys)), make([]int64, len(r.keys))
	for i := range r.keys {
		asked[i], admitted[i] = r.asked[i].Load(), r.admitted[i].Load()
	}
	for _, in := range r.insts {
		for _, w := range in.workers {
			for i := range w.keyAsked {
				asked[i] += w.keyAsked[i]
				admitted[i] += w.keyAdmitted[i]
			}
		}
	}
	return asked, admitted
}

// commands returns the Redis commands the fleet has sent.
func (r *run) commands() int64 {
	var n int64
	for _, in := range r.insts {
		n += in.cmds.Load()
	}
	return n
}

// work is a worker's loop: take the instance's next arrival, wait for its
// time, decide. It returns when the arrivals or the duration run out, or
// ctx ends.
func (r *run) work(ctx context.Context, in *instance, w *worker, start time.Time) {
	if r.sc.Closed {
		r.workClosed(ctx, in, w, start)
		return
	}
	d := r.sc.Duration
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		at, k := in.sched.take()
		if at >= d {
			return
		}
		due := start.Add(at)
		if wait := time.Until(due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
		} else if ctx.Err() != nil {
			return
		}
		now := time.Now()
		if now.Sub(start) >= d {
			return // behind, and out of time
		}
		if now.Sub(due) > LateAfter {
			w.late.Add(1)
		}
		ok, src, err := in.dec.decide(ctx, r.keys[k], r.sc.Cost)
		took := time.Since(now)
		w.hist.Record(took)
		out := r.inOutage(now.Sub(start))
		if out {
			w.outHist.Record(took)
		}
		if err != nil {
			if ctx.Err() != nil {
				return // stopped, not broken
			}
			w.errors.Add(1)
			if out {
				w.outErrors++
			}
			if w.firstErr == nil {
				w.firstErr = err
			}
			continue
		}
		r.count(w, k, ok, src, out)
	}
}

// count records an answered decision of w on key k.
func (r *run) count(w *worker, k int, ok bool, src hybrid.Source, out bool) {
	if w.keyAsked != nil {
		w.keyAsked[k]++
	} else {
		r.asked[k].Add(1)
	}
	w.decisions.Add(1)
	if out {
		w.outDecisions++
	}
	switch src {
	case hybrid.SourceFallback:
		w.fallback.Add(1)
		if out {
			w.outFallback++
		}
	case hybrid.SourceRedis:
		w.redis.Add(1)
	}
	if ok {
		if w.keyAdmitted != nil {
			w.keyAdmitted[k]++
		} else {
			r.admitted[k].Add(1)
		}
		w.admitted.Add(1)
	}
}

// closedYield is how many decisions a closed-loop worker makes between two
// yields of its core; closedSample how many between two timed decisions.
const (
	closedYield  = 64
	closedSample = 16
)

// workClosed is a worker's closed loop: decide, and decide again as soon as
// answered, until the duration runs out or ctx ends. One decision in
// closedSample is timed (two clock reads would double the bench's own cost
// per decision), and the clock read then tells whether the run is over and
// whether Redis is down.
func (r *run) workClosed(ctx context.Context, in *instance, w *worker, start time.Time) {
	end := start.Add(r.sc.Duration)
	out := false
	// The worker's counters, added to its shared ones at each yield: an
	// atomic add per decision would cost more than a hot key's decision.
	var dec, adm, fb, red int64
	flush := func() {
		w.decisions.Add(dec)
		w.admitted.Add(adm)
		w.fallback.Add(fb)
		w.redis.Add(red)
		dec, adm, fb, red = 0, 0, 0, 0
	}
	defer flush()
	for i := 0; ; i++ {
		if i%closedYield == closedYield-1 {
			flush()
			// A request handler blocks on I/O now and then; a worker that
			// never does keeps the goroutines that Redis's replies woke
			// waiting for a core for many scheduler time slices, and the
			// limiter's calls time out for want of CPU, not of Redis.
			runtime.Gosched()
		}
		k := 0
		switch {
		case w.zipf != nil:
			k = int(w.zipf.Uint64())
		case r.sc.Keys > 1:
			k = w.rng.IntN(r.sc.Keys)
		}
		var t0 time.Time
		timed := i%closedSample == 0
		if timed {
			t0 = time.Now()
			if !t0.Before(end) || ctx.Err() != nil {
				return
			}
			out = r.inOutage(t0.Sub(start))
		}
		ok, src, err := in.dec.decide(ctx, r.keys[k], r.sc.Cost)
		if timed {
			took := time.Since(t0)
			w.hist.Record(took)
			if out {
				w.outHist.Record(took)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.errors.Add(1)
			if out {
				w.outErrors++
			}
			if w.firstErr == nil {
				w.firstErr = err
			}
			continue
		}
		dec++
		if w.keyAsked != nil {
			w.keyAsked[k]++
		} else {
			r.asked[k].Add(1)
		}
		if out {
			w.outDecisions++
		}
		switch src {
		case hybrid.SourceFallback:
			fb++
			if out {
				w.outFallback++
			}
		case hybrid.SourceRedis:
			red++
		}
		if ok {
			adm++
			if w.keyAdmitted != nil {
				w.keyAdmitted[k]++
			} else {
				r.admitted[k].Add(1)
			}
		}
	}
}

// report samples the workers' counters once a second until done is
// closed, calls progress with them, and returns the timeline.
func (r *run) report(start time.Time, done <-chan struct{}, progress func(Progress)) []Sample {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var timeline []Sample
	var lastDec, lastAdm, lastFb int64
	last := start
	for {
		stop := false
		select {
		case <-done:
			stop = true
		case <-tick.C:
		}
		now := time.Now()
		var p Progress
		var fb int64
		for _, in := range r.insts {
			for _, w := range in.workers {
				p.Decisions += w.decisions.Load()
				p.Admitted += w.admitted.Load()
				p.Errors += w.errors.Load()
				fb += w.fallback.Load()
			}
		}
		if p.Decisions > lastDec || !stop {
			timeline = append(timeline, Sample{
				At:        now.Sub(start).Seconds(),
				Decisions: p.Decisions - lastDec,
				Admitted:  p.Admitted - lastAdm,
				Fallback:  fb - lastFb,
				Degraded:  r.degraded(),
			})
		}
		if stop {
			return timeline
		}
		p.Mode, p.Elapsed, p.Duration = r.mode, now.Sub(start), r.sc.Duration
		p.Rate = float64(p.Decisions-lastDec) / now.Sub(last).Seconds()
		lastDec, lastAdm, lastFb, last = p.Decisions, p.Admitted, fb, now
		if progress != nil {
			progress(p)
		}
	}
}

// recovery returns the time from back (Redis answering again, since the
// first arrival) to the first sample of timeline at which no hybrid
// instance was degraded, or -1 if there was none.
func recovery(timeline []Sample, back time.Duration) time.Duration {
	for _, s := range timeline {
		at := time.Duration(s.At * float64(time.Second))
		if at >= back && !s.Degraded {
			return at - back
		}
	}
	return -1
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

// schedule is an instance's arrivals: a Poisson process, and a key drawn
// for each arrival. It is safe for concurrent use.
type schedule struct {
	mu   sync.Mutex // protects the fields below
	rng  *rand.Rand
	zipf *rand.Zipf // nil: uniform
	keys int
	gap  float64 // mean nanoseconds between arrivals
	next float64 // nanoseconds from the start to the last arrival taken
}

// take returns the time of the next arrival, from the start, and its key.
func (s *schedule) take() (time.Duration, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next += s.rng.ExpFloat64() * s.gap
	k := 0
	switch {
	case s.zipf != nil:
		k = int(s.zipf.Uint64())
	case s.keys > 1:
		k = s.rng.IntN(s.keys)
	}
	return time.Duration(s.next), k
}

// decider is one instance's limiter under test.
type decider interface {
	// decide asks for n tokens of key.
	decide(ctx context.Context, key string, n int64) (ok bool, src hybrid.Source, err error)
	// tracked returns the keys held in memory.
	tracked() int
	close(ctx context.Context) error
}

// hybridDecider is the hybrid Limiter, in the mode of lim.
type hybridDecider struct {
	l   *hybrid.Limiter
	lim hybrid.Limit
}

func (d *hybridDecider) decide(ctx context.Context, key string, n int64) (bool, hybrid.Source, error) {
	res, err := d.l.AllowN(ctx, key, d.lim, n)
	return res.Allowed, res.Source, err
}

func (d *hybridDecider) tracked() int { return d.l.Stats().Reconcile.Keys }

func (d *hybridDecider) close(ctx context.Context) error { return d.l.Close(ctx) }

// localDecider is a golang.org/x/time/rate limiter per key, in this
// instance alone.
type localDecider struct {
	lim   rate.Limit
	burst int
	m     sync.Map // key -> *rate.Limiter
	n     atomic.Int64
}

func (d *localDecider) decide(_ context.Context, key string, n int64) (bool, hybrid.Source, error) {
	v, ok := d.m.Load(key)
	if !ok {
		var loaded bool
		if v, loaded = d.m.LoadOrStore(key, rate.NewLimiter(d.lim, d.burst)); !loaded {
			d.n.Add(1)
		}
	}
	return v.(*rate.Limiter).AllowN(time.Now(), int(n)), hybrid.SourceLocal, nil
}

func (d *localDecider) tracked() int { return int(d.n.Load()) }

func (d *localDecider) close(context.Context) error { return nil }

// redisRateDecider is go-redis/redis_rate: GCRA in one script call.
type redisRateDecider struct {
	l   *redis_rate.Limiter
	lim redis_rate.Limit
}

func (d *redisRateDecider) decide(ctx context.Context, key string, n int64) (bool, hybrid.Source, error) {
	res, err := d.l.AllowN(ctx, key, d.lim, int(n))
	if err != nil {
		return false, hybrid.SourceRedis, err
	}
	return res.Allowed > 0, hybrid.SourceRedis, nil
}

func (d *redisRateDecider) tracked() int { return 0 }

func (d *redisRateDecider) close(context.Context) error { return nil }

// gcraLimit returns the redis_rate limit of rate tokens per second and
// burst: per second if the rate is whole, else per 10^6 seconds.
func gcraLimit(r float64, burst int64) redis_rate.Limit {
	if r == math.Trunc(r) {
		return redis_rate.Limit{Rate: int(r), Burst: int(burst), Period: time.Second}
	}
	return redis_rate.Limit{Rate: int(math.Round(r * 1e6)), Burst: int(burst), Period: 1e6 * time.Second}
}
