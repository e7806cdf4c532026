package bench

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// ownCommands are the commands the bench itself sends to Redis (INFO to
// read commandstats, FLUSHALL between cells, PING to time the round trip);
// commandCalls leaves them out.
var ownCommands = []string{"info", "flushall", "ping"}

// commandCalls returns the calls of each command in the reply to INFO
// commandstats, the bench's own left out. A line reads
// "cmdstat_evalsha:calls=12,usec=340,...".
func commandCalls(info string) (map[string]int64, error) {
	calls := map[string]int64{}
	for line := range strings.Lines(info) {
		line = strings.TrimSpace(line)
		name, rest, ok := strings.Cut(line, ":")
		name, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd {
			continue
		}
		if slices.Contains(ownCommands, strings.ToLower(name)) {
			continue
		}
		found := false
		for field := range strings.SplitSeq(rest, ",") {
			v, ok := strings.CutPrefix(field, "calls=")
			if !ok {
				continue
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("bench: commandstats %q: %w", line, err)
			}
			calls[strings.ToLower(name)] += n
			found = true
		}
		if !found {
			return nil, fmt.Errorf("bench: commandstats %q: no calls", line)
		}
	}
	return calls, nil
}

// callsSince returns the calls of each command from before to after, and
// their sum; a command with no calls in between is left out.
func callsSince(before, after map[string]int64) (map[string]int64, int64) {
	delta := map[string]int64{}
	var total int64
	for name, n := range after {
		if d := n - before[name]; d != 0 {
			delta[name] = d
			total += d
		}
	}
	return delta, total
}

// scriptCommands are the commands that run a script. Redis counts the
// commands a script calls too, each on its own line of commandstats.
var scriptCommands = []string{"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"}

// scriptCalls returns the calls of scripts among calls.
func scriptCalls(calls map[string]int64) int64 {
	var n int64
	for _, name := range scriptCommands {
		n += calls[name]
	}
	return n
}

// cpuTime returns used_cpu_user plus used_cpu_sys from the reply to INFO
// cpu: the time redis-server has run.
func cpuTime(info string) (time.Duration, error) {
	var total time.Duration
	found := 0
	for line := range strings.Lines(info) {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "used_cpu_user" && name != "used_cpu_sys") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("bench: INFO cpu %q: %w", line, err)
		}
		total += time.Duration(f * float64(time.Second))
		found++
	}
	if found != 2 {
		return 0, fmt.Errorf("bench: INFO cpu: no used_cpu_user and used_cpu_sys")
	}
	return total, nil
}

// percentile returns the q-quantile (0 < q <= 1) of sorted by the
// nearest-rank method, 0 for none.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*q+0.999999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Result is what one service did in one cell: one workload, one round
// trip to Redis, one repeat.
type Result struct {
	Service  string        // "original", "hybrid-rls" or "grpc floor"
	Workload string        // "A hot" or "B tail"
	RTT      time.Duration // added round trip to Redis
	Repeat   int           // from 0
	Elapsed  time.Duration // from the first call to the last answer

	OK, OverLimit, Errors int64
	Latencies             []time.Duration // of the answered calls, sorted
	RedisCalls            int64           // commandstats' delta, the bench's own left out
	ScriptCalls           int64           // the calls of scripts among them
	RedisCPU              time.Duration   // redis-server's CPU time meanwhile
	ServiceCPU            time.Duration   // the service's process's, 0 where not measured
	LoadCPU               time.Duration   // the bench's own process's: the callers

	// Bound is B + R*T for the hot descriptor's bucket over Elapsed, 0
	// for a workload without one.
	Bound float64
}

// Decisions is how many calls were answered.
func (r Result) Decisions() int64 { return r.OK + r.OverLimit }

// Rate is the answered calls a second.
func (r Result) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Decisions()) / r.Elapsed.Seconds()
}

// PerDecision is Redis's commands per answered call.
func (r Result) PerDecision() float64 {
	if r.Decisions() == 0 {
		return 0
	}
	return float64(r.RedisCalls) / float64(r.Decisions())
}

// perDecision returns n per answered call.
func (r Result) perDecision(n float64) float64 {
	if r.Decisions() == 0 {
		return 0
	}
	return n / float64(r.Decisions())
}

// ms formats d in milliseconds.
func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64)
}

// rttName names an added round trip.
func rttName(d time.Duration) string {
	if d == 0 {
		return "loopback"
	}
	return "+" + d.String()
}

// WriteTable writes one line per result, then a line per workload and
// round trip comparing the services' means: hybrid-rls's decisions a
// second against the original's and, where the gRPC floor ran, the
// floor's against the original's and hybrid-rls's against the floor's.
func WriteTable(w io.Writer, results []Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "redis\tworkload\tservice\trun\tdecisions/s\tp50 ms\tp99 ms\tp99.9 ms\tOK\tOVER_LIMIT\terrors\tcmds/decision\tscripts/decision\tredis cpu us/decision\tservice cpu us/decision\tload cpu us/decision\tadmitted/(B+R*T)\t")
	for _, r := range results {
		bound := "-"
		if r.Bound > 0 {
			bound = fmt.Sprintf("%d/%.0f = %.3f", r.OK, r.Bound, float64(r.OK)/r.Bound)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.0f\t%s\t%s\t%s\t%d\t%d\t%d\t%.4f\t%.4f\t%.2f\t%.2f\t%.2f\t%s\t\n",
			rttName(r.RTT), r.Workload, r.Service, r.Repeat+1, r.Rate(),
			ms(percentile(r.Latencies, 0.50)), ms(percentile(r.Latencies, 0.99)), ms(percentile(r.Latencies, 0.999)),
			r.OK, r.OverLimit, r.Errors, r.PerDecision(), r.perDecision(float64(r.ScriptCalls)),
			r.perDecision(float64(r.RedisCPU)/float64(time.Microsecond)),
			r.perDecision(float64(r.ServiceCPU)/float64(time.Microsecond)),
			r.perDecision(float64(r.LoadCPU)/float64(time.Microsecond)), bound)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	cs := compare(results)
	floor := slices.ContainsFunc(cs, func(c comparison) bool { return c.floor != nil })
	head := "redis\tworkload\thybrid-rls/original decisions/s\tp99 ms (original, hybrid-rls)\tredis cmds/decision (original, hybrid-rls)\t"
	if floor {
		head += "floor/original decisions/s\thybrid-rls/floor decisions/s\t"
	}
	fmt.Fprintln(tw, head)
	for _, c := range cs {
		fmt.Fprintf(tw, "%s\t%s\t%.2fx\t%s, %s\t%.4f, %.4f\t", rttName(c.rtt), c.workload,
			c.hybrid.rate/c.original.rate, ms(c.original.p99), ms(c.hybrid.p99), c.original.perDecision, c.hybrid.perDecision)
		switch {
		case c.floor != nil:
			fmt.Fprintf(tw, "%.2fx\t%.2fx\t", c.floor.rate/c.original.rate, c.hybrid.rate/c.floor.rate)
		case floor:
			fmt.Fprint(tw, "-\t-\t")
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// mean is a service's mean over the repeats of a cell.
type mean struct {
	rate, perDecision float64
	p99               time.Duration
	n                 int
}

// comparison is a cell's two services, and the gRPC floor's mean where
// it ran.
type comparison struct {
	rtt              time.Duration
	workload         string
	original, hybrid mean
	floor            *mean
}

// compare averages each service's repeats of each cell, in the order the
// cells first appear; a cell without both services is left out.
func compare(results []Result) []comparison {
	type cell struct {
		rtt      time.Duration
		workload string
	}
	var order []cell
	means := map[cell]map[string]*mean{}
	for _, r := range results {
		c := cell{r.RTT, r.Workload}
		if means[c] == nil {
			means[c] = map[string]*mean{}
			order = append(order, c)
		}
		m := means[c][r.Service]
		if m == nil {
			m = &mean{}
			means[c][r.Service] = m
		}
		m.n++
		m.rate += r.Rate()
		m.perDecision += r.PerDecision()
		m.p99 += percentile(r.Latencies, 0.99)
	}
	var out []comparison
	for _, c := range order {
		o, h := means[c][serviceOriginal], means[c][serviceHybrid]
		if o == nil || h == nil {
			continue
		}
		f := means[c][serviceFloor]
		for _, m := range []*mean{o, h, f} {
			if m == nil {
				continue
			}
			m.rate /= float64(m.n)
			m.perDecision /= float64(m.n)
			m.p99 /= time.Duration(m.n)
		}
		out = append(out, comparison{rtt: c.rtt, workload: c.workload, original: *o, hybrid: *h, floor: f})
	}
	return out
}

// The services' names in a Result.
const (
	serviceOriginal = "original"
	serviceHybrid   = "hybrid-rls"
	serviceFloor    = "grpc floor" // floor_test.go
)
