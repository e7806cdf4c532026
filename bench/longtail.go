package bench

import (
	"fmt"
	"io"
	"math/rand/v2"
	"text/tabwriter"
	"time"
)

// The long tail (Scenario.Passes): many keys, each asked a few times, as
// with per-user limits. Every key is asked exactly Passes times over the
// run, in a closed loop, and the run ends when the last ask is answered.

// maxAsks bounds Keys * Passes: each ask takes 4 bytes in a worker's list.
const maxAsks = 100_000_000

// asks returns the asks of a long tail, Keys * Passes * Spread; 0 if sc
// is none.
func (sc Scenario) asks() int64 { return int64(sc.Keys) * int64(sc.Passes) * int64(sc.spread()) }

// spread returns how many instances ask each key in a pass of a long
// tail: Spread, at least 1.
func (sc Scenario) spread() int { return max(sc.Spread, 1) }

// dealTail returns the keys that worker j of instance i asks in sc's long
// tail, in the order it asks them: pass after pass, its share of the pass
// shuffled by rng.
//
// The fleet's W = Instances * Workers workers are numbered g = j*Instances
// + i, so that consecutive numbers are on different instances, and in pass
// p key k goes to worker (k + p) mod W. So each pass asks every key once;
// each worker's share of a pass is Keys/W, give or take one; and a key is
// asked by instance (k + p) mod Instances in pass p, another one in each
// pass as long as Passes <= Instances, as a load balancer would spread a
// user's requests.
func dealTail(sc Scenario, i, j int, rng *rand.Rand) []int32 {
	if sc.spread() > 1 {
		return dealSpread(sc, i, j)
	}
	w := sc.Instances * sc.Workers
	g := j*sc.Instances + i
	first := func(p int) int { return ((g-p)%w + w) % w }
	n := 0
	for p := range sc.Passes {
		if f := first(p); f < sc.Keys {
			n += (sc.Keys-1-f)/w + 1
		}
	}
	keys := make([]int32, 0, n)
	for p := range sc.Passes {
		from := len(keys)
		for k := first(p); k < sc.Keys; k += w {
			keys = append(keys, int32(k))
		}
		share := keys[from:]
		rng.Shuffle(len(share), func(a, b int) { share[a], share[b] = share[b], share[a] })
	}
	return keys
}

// dealSpread is dealTail with a Spread: in pass p, key k is asked by the
// Spread instances (k + p + s) mod Instances, s < Spread, and every
// instance follows one order of the pass's keys, shuffled from the seed and
// p, worker j of an instance taking every Workers-th key of its own from
// the j-th: so the instances that ask a key ask it at about the same time,
// as far as they keep pace.
func dealSpread(sc Scenario, i, j int) []int32 {
	order := make([]int32, sc.Keys)
	var keys []int32
	for p := range sc.Passes {
		for k := range order {
			order[k] = int32(k)
		}
		rng := rand.New(rand.NewPCG(sc.Seed, uint64(p)))
		rng.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
		mine := 0 // keys of this instance's seen in the pass
		for _, k := range order {
			if ((i-int(k)-p)%sc.Instances+sc.Instances)%sc.Instances >= sc.spread() {
				continue
			}
			if mine%sc.Workers == j {
				keys = append(keys, k)
			}
			mine++
		}
	}
	return keys
}

// LongTailReport is what a long tail (Scenario.Passes) measured besides a
// Report's other figures.
type LongTailReport struct {
	// Passes is Scenario.Passes, Asks the asks planned: Keys * Passes
	// * Spread.
	Passes int   `json:"passes"`
	Asks   int64 `json:"asks"`
	// Issued counts the asks made, answered or failed; Complete reports
	// that they were all of them, false if Duration cut the run short.
	Issued   int64 `json:"issued"`
	Complete bool  `json:"complete"`
	// KeysExact counts the keys answered exactly Passes * Spread times: all of
	// them unless some asks failed or the run was cut short.
	KeysExact int `json:"keys_exact"`
	// Commands counts the Redis commands the fleet sent, each command of
	// a pipeline included, from the first ask until its limiters had
	// closed (Report.Commands stops at the last answer; what the limiters
	// settle at Close counts here, as in Redis's figures);
	// CommandsPerDecision is them per decision.
	Commands            int64   `json:"commands"`
	CommandsPerDecision float64 `json:"commands_per_decision"`
	// ProcessCPUPerDecision is the CPU time, user and system, in
	// microseconds, that the processes running the fleet used over the
	// same span, per decision: the client's side of what a decision costs
	// (the bench's own workers included), as Redis.CPUPerDecision is the
	// server's. 0 if not measured.
	ProcessCPUPerDecision float64 `json:"process_cpu_usec_per_decision,omitempty"`

	// Redis is what the run cost Redis, as the server counts it; nil if
	// not measured: on miniredis or a Redis Cluster, or if reading the
	// server's figures failed (RedisError).
	Redis      *RedisReport `json:"redis,omitempty"`
	RedisError string       `json:"redis_error,omitempty"`

	// Base is the mode that the ratios compare with (see Compare), ""
	// if none. DecisionsVsBase is DecisionsPerSec over the base's;
	// ScriptUsecVsBase and CPUVsBase are Redis.ScriptUsecPerDecision and
	// Redis.CPUPerDecision over the base's, ProcessCPUVsBase is
	// ProcessCPUPerDecision over the base's (0: not measured).
	Base             string  `json:"base,omitempty"`
	DecisionsVsBase  float64 `json:"decisions_per_s_vs_base,omitempty"`
	ScriptUsecVsBase float64 `json:"script_usec_per_decision_vs_base,omitempty"`
	CPUVsBase        float64 `json:"cpu_usec_per_decision_vs_base,omitempty"`
	ProcessCPUVsBase float64 `json:"process_cpu_usec_per_decision_vs_base,omitempty"`
}

// longTail sets rep.LongTail, in a long tail, from what the instances
// counted; tailRedis adds Redis's figures once the limiters have closed.
func (r *run) longTail(rep *Report, t tally) {
	if r.sc.Passes == 0 {
		return
	}
	lt := &LongTailReport{Passes: r.sc.Passes, Asks: r.sc.asks(), Issued: t.Decisions + t.Errors}
	lt.Complete = lt.Issued == lt.Asks
	for _, n := range t.Asked {
		if n == int64(r.sc.Passes*r.sc.spread()) {
			lt.KeysExact++
		}
	}
	rep.LongTail = lt
	r.tail.sent = t.Sent
}

// tailCommands sets the commands the fleet sent until its limiters had
// closed, in a long tail.
func (r *run) tailCommands(rep *Report, cmds int64) {
	if lt := rep.LongTail; lt != nil {
		lt.Commands = cmds
		if rep.Decisions > 0 {
			lt.CommandsPerDecision = float64(cmds) / float64(rep.Decisions)
		}
	}
}

// tailCPU sets the CPU time a decision of the processes running the
// fleet, in a long tail: cpu is what they used from the first ask until
// their limiters had closed.
func tailCPU(rep *Report, cpu time.Duration) {
	if lt := rep.LongTail; lt != nil && cpu > 0 && rep.Decisions > 0 {
		lt.ProcessCPUPerDecision = float64(cpu.Nanoseconds()) / 1e3 / float64(rep.Decisions)
	}
}

// tailRatios is a long-tail report's figures over the base's: a ratio is
// 0 where either figure is missing.
type tailRatios struct {
	dec    float64 // decisions per second
	script float64 // Redis's script time per decision
	cpu    float64 // redis-server's CPU time per decision
	proc   float64 // the fleet's processes' CPU time per decision
}

// ratio returns a / b, or 0 if either is missing (0).
func ratio(a, b float64) float64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	return a / b
}

// ratios returns r's figures over base's.
func ratios(r, base Report) tailRatios {
	q := tailRatios{dec: ratio(r.DecisionsPerSec, base.DecisionsPerSec)}
	if r.LongTail == nil || base.LongTail == nil {
		return q
	}
	q.proc = ratio(r.LongTail.ProcessCPUPerDecision, base.LongTail.ProcessCPUPerDecision)
	a, b := r.LongTail.Redis, base.LongTail.Redis
	if a == nil || b == nil {
		return q
	}
	q.script = ratio(a.ScriptUsecPerDecision, b.ScriptUsecPerDecision)
	q.cpu = ratio(a.CPUPerDecision, b.CPUPerDecision)
	return q
}

// findMode returns the first report of mode among reports.
func findMode(reports []Report, mode string) (Report, bool) {
	for _, r := range reports {
		if r.Mode == mode {
			return r, true
		}
	}
	return Report{}, false
}

// Compare sets, in each long-tail report of reports, the ratios of its
// figures to those of the report of mode base (such as RedisRate):
// LongTailReport.Base, DecisionsVsBase, ScriptUsecVsBase, CPUVsBase and
// ProcessCPUVsBase. It
// does nothing if no report is of mode base.
func Compare(reports []Report, base string) {
	b, ok := findMode(reports, base)
	if !ok {
		return
	}
	for _, r := range reports {
		if lt := r.LongTail; lt != nil {
			q := ratios(r, b)
			lt.Base = base
			lt.DecisionsVsBase, lt.ScriptUsecVsBase, lt.CPUVsBase, lt.ProcessCPUVsBase = q.dec, q.script, q.cpu, q.proc
		}
	}
}

// longTailHeader names WriteLongTail's columns.
const longTailHeader = "mode\tdec/s\tasks\tp50\tp99\tp99.9\tadmitted\tcmd/dec\tscript/dec\tredis cmd/dec\tscript µs/dec\tcmd µs/dec\tcpu µs/dec\tproc µs/dec\tredis keys\tmem/key\tdec/s vs rr\tscript µs vs rr\tcpu vs rr\tproc vs rr\tfallback\terrors"

// WriteLongTail writes long-tail reports (Scenario.Passes) as a table, one
// aligned row per report under a header line:
//
//   - dec/s: decisions over the time the asks took; asks: the asks made
//     ("made/planned" if the run was cut short);
//   - p50, p99, p99.9: decision latency (in a long tail, nearly every
//     decision is a cold key's); admitted: the share of decisions
//     allowed;
//   - cmd/dec: Redis commands sent per decision, counted by the clients
//     until the limiters had closed (LongTailReport.CommandsPerDecision);
//   - script/dec, redis cmd/dec: script calls and all the commands Redis
//     ran (those that scripts called included) per decision, as Redis
//     counts them;
//   - script µs/dec, cmd µs/dec: Redis's time in the script commands, and
//     in all the commands sent, per decision (a script's time includes the
//     commands it called); cpu µs/dec: the CPU time of the redis-server
//     process per decision, reading requests and writing replies included;
//   - proc µs/dec: the CPU time of the processes running the fleet per
//     decision (LongTailReport.ProcessCPUPerDecision): on one machine,
//     what bounds the decisions a second is this and cpu µs/dec together;
//   - redis keys: the keys the run left in Redis; mem/key: the growth of
//     Redis's used_memory per such key;
//   - dec/s vs rr, script µs vs rr, cpu vs rr, proc vs rr: dec/s, script
//     µs/dec, cpu µs/dec and proc µs/dec as ratios to those of the
//     redis_rate report, if there is one;
//   - fallback: decisions made by the fallback policy; errors: failed
//     decisions.
//
// A "-" marks a figure not measured: Redis's own figures are read from a
// single real Redis only.
func WriteLongTail(w io.Writer, reports []Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, longTailHeader+"\t")
	base, haveBase := findMode(reports, RedisRate)
	for _, r := range reports {
		asks, cmds, proc, red := "-", "-", "-", (*RedisReport)(nil)
		if lt := r.LongTail; lt != nil {
			if lt.ProcessCPUPerDecision > 0 {
				proc = fmt.Sprintf("%.2f", lt.ProcessCPUPerDecision)
			}
			asks = fmt.Sprint(lt.Issued)
			if !lt.Complete {
				asks += fmt.Sprintf("/%d", lt.Asks)
			}
			cmds, red = fmtPerDecision(lt.CommandsPerDecision), lt.Redis
		}
		admitted := "-"
		if r.Decisions > 0 {
			admitted = fmt.Sprintf("%.1f%%", 100*float64(r.Admitted)/float64(r.Decisions))
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t",
			r.Mode, r.DecisionsPerSec, asks, fmtDuration(r.P50), fmtDuration(r.P99), fmtDuration(r.P999), admitted, cmds)
		if red != nil {
			mem := "-"
			if red.Keys > 0 {
				mem = fmt.Sprintf("%.0f B", red.MemPerKey)
			}
			fmt.Fprintf(tw, "%s\t%s\t%.2f\t%.2f\t%.2f\t%s\t%d\t%s\t",
				fmtPerDecision(red.ScriptsPerDecision), fmtPerDecision(red.CallsPerDecision),
				red.ScriptUsecPerDecision, red.SentUsecPerDecision, red.CPUPerDecision, proc, red.Keys, mem)
		} else {
			fmt.Fprintf(tw, "-\t-\t-\t-\t-\t%s\t-\t-\t", proc)
		}
		var q tailRatios
		if haveBase {
			q = ratios(r, base)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t\n",
			fmtRatio(q.dec), fmtRatio(q.script), fmtRatio(q.cpu), fmtRatio(q.proc), r.Fallback, r.Errors)
	}
	return tw.Flush()
}

// fmtRatio formats a ratio as "0.42x", or "-" for none (0).
func fmtRatio(v float64) string {
	if v <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", v)
}
