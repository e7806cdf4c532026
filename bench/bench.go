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
//
// # Long tail
//
// A Scenario with Passes is a long tail, as of per-user limits: many keys,
// each asked a few times. Every key is asked exactly Passes times, in a
// closed loop over all the fleet's workers, a key by another instance in
// each pass, and the run ends when the last ask is answered. On a single
// real Redis the report then says what the decisions cost the server
// itself (LongTailReport.Redis: script calls, commands, Redis time and CPU
// time per decision, memory per key), and WriteLongTail prints the modes
// side by side, as ratios to redis_rate's where it ran.
package bench

import (
	"errors"
	"fmt"
	"time"
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
	// RedisRateAP is redis_rate on go-redis's automatic pipelining
	// (Client.AutoPipeline): the script calls that an instance's workers
	// make at the same time go to Redis as one pipeline. On a real Redis
	// only.
	RedisRateAP = "redis_rate_ap"
)

// needsRedis reports whether mode runs on a real Redis only.
func needsRedis(mode string) bool { return mode == RedisRate || mode == RedisRateAP }

// checkMode returns an error wrapping ErrMode for a mode Run does not know,
// or ErrNeedsRedis for one that t cannot run.
func checkMode(t *Target, mode string) error {
	switch mode {
	case Lease, Optimistic, Exact, Local, RedisRate, RedisRateAP:
	default:
		return fmt.Errorf("%w %q", ErrMode, mode)
	}
	if needsRedis(mode) && !t.Real() {
		return ErrNeedsRedis
	}
	return nil
}

// Modes returns the modes compared by default on t: lease, optimistic,
// exact and local, and redis_rate if t is a real Redis. RedisRateAP runs
// only when asked for.
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
	// ErrNeedsRedis is returned by Run for redis_rate or redis_rate_ap on
	// miniredis.
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
