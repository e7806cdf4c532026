package bench

import (
	"math"
	"time"
)

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
	Asks      int64         // a long tail's asks in all (Keys * Passes); 0 if none
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
	// Latency is the round trip added between the fleet and Redis
	// (Target.AddLatency); 0 means none.
	Latency time.Duration `json:"latency_ns,omitempty"`

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
	// Health details RedisErrors and Breaker, for the hybrid modes; nil
	// for the others.
	Health *Health `json:"health,omitempty"`
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

	// LongTail is what a long tail (Scenario.Passes) measured besides, nil
	// if the Scenario was none. Every key is then asked a few times only:
	// no key is saturated unless Passes * Cost reaches B + R*T.
	LongTail *LongTailReport `json:"long_tail,omitempty"`
}

// build makes the report of a run from what its instances counted, the
// window T on the Redis clock, the time the workers took and the timeline.
func (r *run) build(t tally, window, elapsed time.Duration, timeline []Sample) Report {
	sc := r.sc
	rep := Report{
		Mode:          r.mode,
		Target:        r.t.String(),
		Latency:       r.t.latency,
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
	if t.Hybrid {
		h := t.Health
		rep.Health = &h
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

// accuracy fills in the figures that compare admitted with ideal.
func (r *run) accuracy(rep *Report, asked, admitted []int64) {
	cost := r.sc.Cost
	ideal := float64(r.sc.Burst) + r.sc.Rate*rep.Window.Seconds()
	rep.IdealPerKey = ideal
	over := math.Inf(-1)
	for i := range r.keys {
		asked, got := asked[i]*cost, admitted[i]*cost
		over = max(over, float64(got)-ideal)
		// Saturated: asked for at least what a perfect limiter admits. In
		// a closed loop that is every key of a few, but only the hot ones
		// of a Zipf mix over many: a key asked for a few tokens has them
		// all, and counting it against B + R*T would read as
		// under-admission.
		if float64(asked) >= ideal {
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
