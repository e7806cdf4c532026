package bench

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid/internal/redistest"
)

// The run tests drive a small fleet in real time on miniredis: they check
// what the fleet admits, which real time does not change (the bounds hold
// for any timing), and that the engine counts what it should. They are not
// performance measurements.

// fleetScenario is the tests' fleet: 4 instances, one hot key, R=100/s
// B=100, asked for at 4x its limit for 2 s.
var fleetScenario = Scenario{
	Instances: 4,
	Duration:  2 * time.Second,
	Keys:      1,
	Demand:    4,
	Rate:      100,
	Burst:     100,
	Cost:      1,
	Seed:      7,
}

// miniTarget returns a miniredis Target, closed at cleanup.
func miniTarget(t *testing.T) *Target {
	t.Helper()
	target, err := Miniredis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := target.Close(); err != nil {
			t.Error(err)
		}
	})
	return target
}

// TestRunFleet: on a hot key at 4x its limit, lease and exact never admit
// more than B + R*T (T on the Redis clock, taken before the first request
// and after the last decision, so no slack is needed at the window's
// edges), while local, one x/time/rate limiter per instance, admits far
// more. Here each instance is asked exactly its own limit (4x over 4
// instances), so local admits what it is asked, 8/3 of the ideal; with a
// demand of N or more it would be N times.
func TestRunFleet(t *testing.T) {
	target := miniTarget(t)
	sc := fleetScenario
	// miniredis serves from this process: on a busy machine its answers
	// may outlast the default 50ms call timeout, and the fallback would
	// decide. That is right, but not what this test counts.
	sc.Config.Breaker.CallTimeout = 2 * time.Second
	sc.Config.ColdWait = 2 * time.Second
	n := float64(sc.Instances)
	baseline := runtime.NumGoroutine()
	defer func() {
		if got := waitGoroutines(baseline, 5*time.Second); got > baseline {
			buf := make([]byte, 1<<20)
			t.Errorf("%d goroutines after the runs, %d before:\n%s", got, baseline, buf[:runtime.Stack(buf, true)])
		}
	}()
	for _, mode := range []string{Lease, Exact, Local} {
		t.Run(mode, func(t *testing.T) {
			var ticks int
			rep, err := Run(t.Context(), target, sc, mode, func(p Progress) {
				ticks++
				if p.Mode != mode || p.Duration != sc.Duration {
					t.Errorf("progress %+v, want mode %s and duration %v", p, mode, sc.Duration)
				}
			})
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			ideal := rep.IdealPerKey
			got := float64(rep.AdmittedTokens)
			t.Logf("%s: T=%v, admitted %v of %d decisions, ideal %.1f (%.2f%%); %.0f decisions/s of %.0f offered, %d late; p50 %v p99 %v; %d commands (%.4f per decision)",
				mode, rep.Window, got, rep.Decisions, ideal, rep.AdmittedPct, rep.DecisionsPerSec, rep.Offered, rep.Late, rep.P50, rep.P99, rep.Commands, rep.CommandsPerDecision)

			// A call to miniredis that outlasts the breaker's 50 ms call
			// timeout (a loaded machine) is rightly answered by the
			// fallback; a few such are not a failure, many would be.
			if rep.Errors != 0 || rep.Fallback > rep.Decisions/50 {
				t.Errorf("errors %d (first %q), fallback %d of %d decisions; want no errors and under 2%% fallback", rep.Errors, rep.FirstError, rep.Fallback, rep.Decisions)
			}
			if rep.Window < sc.Duration/2 || rep.Window > 2*sc.Duration {
				t.Errorf("Window = %v, want about %v", rep.Window, sc.Duration)
			}
			if want := float64(sc.Burst) + sc.Rate*rep.Window.Seconds(); ideal != want {
				t.Errorf("IdealPerKey = %v, want B+R*T = %v", ideal, want)
			}
			if want := sc.Demand * sc.Rate * 2; float64(rep.Decisions) < 0.5*want {
				t.Errorf("Decisions = %d, want about %v", rep.Decisions, want)
			}
			if rep.SaturatedKeys != 1 {
				t.Errorf("SaturatedKeys = %d, want 1", rep.SaturatedKeys)
			}
			if rep.P50 <= 0 || rep.P50 > rep.P99 || rep.P99 > rep.P999 || rep.P999 > rep.Max {
				t.Errorf("latency p50 %v p99 %v p99.9 %v max %v: want 0 < p50 <= p99 <= p99.9 <= max", rep.P50, rep.P99, rep.P999, rep.Max)
			}
			if len(rep.Timeline) == 0 || ticks == 0 {
				t.Errorf("%d samples, %d progress calls; want some", len(rep.Timeline), ticks)
			}
			var sum int64
			for _, s := range rep.Timeline {
				sum += s.Decisions
			}
			if sum != rep.Decisions {
				t.Errorf("the timeline holds %d decisions, want %d", sum, rep.Decisions)
			}

			switch mode {
			case Lease, Exact:
				if got > ideal {
					t.Errorf("admitted %v, more than B+R*T = %.1f", got, ideal)
				}
				if rep.Overshoot != 0 {
					t.Errorf("Overshoot = %v, want 0", rep.Overshoot)
				}
				// Loose: this guards the counting, not the limiter's accuracy
				// (the package's own tests hold that).
				if got < 0.5*ideal {
					t.Errorf("admitted %v, less than half of B+R*T = %.1f", got, ideal)
				}
				if rep.Commands == 0 {
					t.Error("no Redis command counted")
				}
				// Each exact decision is a script call, but the calls an
				// instance needs at once go to Redis together: one batch
				// carries at most one call per worker.
				if low := 1 / float64(rep.Workers); mode == Exact && rep.CommandsPerDecision < low {
					t.Errorf("exact: %.3f commands per decision, want at least 1 per batch of at most %d workers' calls (%.3f)", rep.CommandsPerDecision, rep.Workers, low)
				}
			case Local:
				asked := float64(rep.Decisions)
				if got < 2*ideal {
					t.Errorf("local admitted %v, want more than twice B+R*T = %.1f", got, ideal)
				}
				if want := min(asked, n*ideal); got < 0.9*want {
					t.Errorf("local admitted %v, want about min(asked, N*(B+R*T)) = %v", got, want)
				}
				if got > n*ideal {
					t.Errorf("local admitted %v, more than N*(B+R*T) = %v", got, n*ideal)
				}
				if rep.Overshoot <= 0 {
					t.Errorf("local: Overshoot = %v, want > 0", rep.Overshoot)
				}
				if rep.Commands != 0 {
					t.Errorf("local: %d Redis commands, want 0", rep.Commands)
				}
			}
		})
	}
}

// waitGoroutines waits at most timeout for the goroutine count to come down
// to n, and returns the last count. It polls: nothing signals the end of
// the goroutines that serve a closed connection.
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

// TestRunRedisRate runs redis_rate, the peer baseline, on a real Redis for
// a second: it admits about B + R*T (GCRA may round one request up).
func TestRunRedisRate(t *testing.T) {
	p := redistest.Server(t)
	target, err := Dial(p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	sc := fleetScenario
	sc.Duration = time.Second
	rep, err := Run(t.Context(), target, sc, RedisRate, nil)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("redis_rate: admitted %d, ideal %.1f; %.4f commands per decision", rep.AdmittedTokens, rep.IdealPerKey, rep.CommandsPerDecision)
	if rep.Errors != 0 {
		t.Errorf("%d errors, the first %q", rep.Errors, rep.FirstError)
	}
	if got := float64(rep.AdmittedTokens); got > rep.IdealPerKey+1 || got < 0.5*rep.IdealPerKey {
		t.Errorf("admitted %v, want about B+R*T = %.1f", got, rep.IdealPerKey)
	}
	if rep.CommandsPerDecision < 1 {
		t.Errorf("%.3f commands per decision, want at least 1", rep.CommandsPerDecision)
	}
}

// TestRunRejects: what Run refuses, before it starts anything.
func TestRunRejects(t *testing.T) {
	target := miniTarget(t)
	tests := []struct {
		name string
		sc   Scenario
		mode string
		want error
	}{
		{"unknown mode", Scenario{}, "fast", ErrMode},
		{"redis_rate on miniredis", Scenario{}, RedisRate, ErrNeedsRedis},
		{"bad distribution", Scenario{Dist: "normal"}, Lease, ErrScenario},
		{"zipf exponent", Scenario{Dist: Zipf, ZipfS: 0.5}, Lease, ErrScenario},
		{"negative instances", Scenario{Instances: -1}, Lease, ErrScenario},
		{"negative demand", Scenario{Demand: -1}, Lease, ErrScenario},
		{"cost above burst", Scenario{Burst: 10, Cost: 11}, Lease, ErrScenario},
		{"rate too high", Scenario{Rate: 2e9}, Lease, ErrScenario},
		{"redis_rate_ap on miniredis", Scenario{}, RedisRateAP, ErrNeedsRedis},
		{"negative passes", Scenario{Passes: -1}, Lease, ErrScenario},
		{"outage in a long tail", Scenario{Passes: 2, Outage: Outage{At: time.Second, For: time.Second}}, Lease, ErrScenario},
		{"too many asks", Scenario{Keys: 1e6, Passes: 1000}, Lease, ErrScenario},
	}
	for _, tt := range tests {
		if _, err := Run(context.Background(), target, tt.sc, tt.mode, nil); !errors.Is(err, tt.want) {
			t.Errorf("%s: Run = %v, want %v", tt.name, err, tt.want)
		}
	}
}

// TestScenarioDefaults: the zero Scenario is 8 instances on one hot key at
// 4x a limit of 1000/s.
func TestScenarioDefaults(t *testing.T) {
	var sc Scenario
	if got, want := sc.Offered(), 4000.0; got != want {
		t.Errorf("Offered() = %v, want %v", got, want)
	}
	sc = Scenario{Keys: 100, Rate: 10, Demand: 2, Cost: 4}
	if got, want := sc.Offered(), 500.0; got != want {
		t.Errorf("Offered() of %+v = %v, want %v", sc, got, want)
	}
	if got, want := (Scenario{}).String(), "8 instances x 4 workers, 1 hot key, demand 4x (4000 req/s), R=1000/s B=1000 cost 1, 10s"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	// A long tail is a closed loop, bounded by 10 minutes unless told.
	tail := Scenario{Keys: 50000, Passes: 3, Instances: 4, Workers: 8, Rate: 0.1667, Burst: 20}
	if got, want := tail.String(), "4 instances x 8 workers, long tail: 50000 keys x 3 passes (150000 asks, closed loop), R=0.1667/s B=20 cost 1, at most 10m0s"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if sc, err := tail.withDefaults(); err != nil || !sc.Closed || sc.Duration != 10*time.Minute {
		t.Errorf("withDefaults() = Closed %v, Duration %v, %v; want a closed loop of at most 10m", sc.Closed, sc.Duration, err)
	}
}

// TestHistogramQuantiles: percentiles of known inputs. Below 32 ns every
// value has its own bucket; above, a quantile is at least the exact one and
// exceeds it by less than 1/16 of it.
func TestHistogramQuantiles(t *testing.T) {
	var small Histogram
	for v := 1; v <= 10; v++ {
		small.Record(time.Duration(v))
	}
	var large Histogram
	for v := 1; v <= 1000; v++ {
		large.Record(time.Duration(v) * time.Microsecond)
	}
	var empty Histogram
	tests := []struct {
		name  string
		h     *Histogram
		q     float64
		exact time.Duration
	}{
		{"small", &small, 0.1, 1},
		{"small", &small, 0.5, 5},
		{"small", &small, 0.9, 9},
		{"small", &small, 0.99, 10},
		{"small", &small, 1, 10},
		{"large", &large, 0.5, 500 * time.Microsecond},
		{"large", &large, 0.99, 990 * time.Microsecond},
		{"large", &large, 0.999, 999 * time.Microsecond},
		{"large", &large, 1, 1000 * time.Microsecond},
		{"empty", &empty, 0.5, 0},
	}
	for _, tt := range tests {
		got := tt.h.Quantile(tt.q)
		if got < tt.exact || got-tt.exact > tt.exact/16 {
			t.Errorf("%s: Quantile(%v) = %v, want %v or at most 1/16 above", tt.name, tt.q, got, tt.exact)
		}
		if tt.exact < 32 && got != tt.exact {
			t.Errorf("%s: Quantile(%v) = %v, want exactly %v", tt.name, tt.q, got, tt.exact)
		}
	}
	if got, want := large.Max(), 1000*time.Microsecond; got != want {
		t.Errorf("Max() = %v, want %v", got, want)
	}
	if got := large.Count(); got != 1000 {
		t.Errorf("Count() = %d, want 1000", got)
	}

	// Merging two halves gives the whole.
	var lo, hi Histogram
	for v := 1; v <= 1000; v++ {
		h := &lo
		if v > 500 {
			h = &hi
		}
		h.Record(time.Duration(v) * time.Microsecond)
	}
	lo.Merge(&hi)
	if lo != large {
		t.Error("Merge of the two halves differs from the whole")
	}
}

// TestHistogramBuckets: every value falls in a bucket whose bound is at
// least the value and less than 1/16 above it, and buckets grow with
// values.
func TestHistogramBuckets(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	check := func(v int64) {
		i := bucketOf(v)
		if i < 0 || i >= nBuckets {
			t.Fatalf("bucketOf(%d) = %d, outside [0, %d)", v, i, nBuckets)
		}
		if u := upper(i); u < v || u-v > v/16 {
			t.Errorf("upper(bucketOf(%d)) = %d, want %d or less than 1/16 above", v, u, v)
		}
		if i > 0 && upper(i-1) >= v {
			t.Errorf("bucket %d below bucketOf(%d) = %d ends at %d, want below %d", i-1, v, i, upper(i-1), v)
		}
	}
	for v := range int64(4096) {
		check(v)
	}
	for range 100000 {
		check(rng.Int64N(1<<62) >> rng.IntN(62))
	}
	check(1<<63 - 1)
}

// TestWriteTable: one header line and one aligned row per report, in order.
func TestWriteTable(t *testing.T) {
	reports := []Report{
		{Mode: Lease, Decisions: 40000, DecisionsPerSec: 3998, Offered: 4000, P50: 1200, P99: 4100, P999: 1250000,
			Commands: 2000, CommandsPerDecision: 0.05, AdmittedTokens: 10970, IdealPerKey: 11000,
			SaturatedKeys: 1, IdealSaturated: 11000, AdmittedSaturated: 10970, AdmittedPct: 99.73, UnderPct: 0.27},
		{Mode: Optimistic, SaturatedKeys: 1, Overshoot: 106, OvershootPct: 2.65, OvershootBound: 2200},
		{Mode: Local, MemPerKey: 212},
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, reports); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 1+len(reports) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), 1+len(reports), buf.String())
	}
	if !strings.Contains(lines[0], "dec/s") || !strings.Contains(lines[0], "overshoot") {
		t.Errorf("header %q lacks the column names", lines[0])
	}
	for i, r := range reports {
		line := lines[1+i]
		if f := strings.Fields(line); len(f) == 0 || f[0] != r.Mode {
			t.Errorf("row %d = %q, want it to start with %s", i, line, r.Mode)
		}
		if len(line) != len(lines[0]) && len([]rune(line)) != len([]rune(lines[0])) {
			t.Errorf("row %d is %d characters wide, the header %d: not aligned:\n%s", i, len([]rune(line)), len([]rune(lines[0])), buf.String())
		}
	}
	for _, want := range []string{"99.73%", "+106 (2.65%) of 2200", "212 B", "1.2µs", "1.25ms"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, buf.String())
		}
	}
	if strings.Contains(lines[0], "recovery") {
		t.Errorf("header %q has outage columns without an outage", lines[0])
	}

	reports[0].Outage = &OutageReport{DecisionsPerSec: 3990, P50: 900, P99: 51_000_000, FallbackPct: 81.5, Recovery: 998 * time.Millisecond, Recovered: true}
	reports[1].Outage = &OutageReport{}
	buf.Reset()
	if err := WriteTable(&buf, reports); err != nil {
		t.Fatal(err)
	}
	lines = strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	for i, line := range lines {
		if len([]rune(line)) != len([]rune(lines[0])) {
			t.Errorf("line %d is %d characters wide, the header %d: not aligned:\n%s", i, len([]rune(line)), len([]rune(lines[0])), buf.String())
		}
	}
	for _, want := range []string{"out dec/s", "recovery", "3990", "81.5%", "998.00ms", "51.00ms", "none"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, buf.String())
		}
	}
}

// TestRunOutage: Redis (the embedded miniredis) goes away for 1 s from 1 s
// into a 3 s run and comes back empty. Lease keeps deciding, through its
// fallback, at about the offered rate, and its breakers close again within
// 2 s of Redis answering; local does not notice. The chart shades the
// outage once.
func TestRunOutage(t *testing.T) {
	target := miniTarget(t)
	sc := fleetScenario
	sc.Duration = 3 * time.Second
	sc.Outage = Outage{At: time.Second, For: time.Second}
	var reports []Report
	for _, mode := range []string{Lease, Local} {
		rep, err := Run(t.Context(), target, sc, mode, nil)
		if err != nil {
			t.Fatalf("%s: Run: %v", mode, err)
		}
		if rep.Errors != 0 {
			t.Errorf("%s: %d errors, first %s", mode, rep.Errors, rep.FirstError)
		}
		o := rep.Outage
		if o == nil {
			t.Fatalf("%s: no outage in the report", mode)
		}
		// It ends at At + For after the start, however late a busy machine
		// took Redis down.
		if o.From < 0.99 || o.To < 1.99 || o.To > o.From+1.5 {
			t.Errorf("%s: outage from %.3fs to %.3fs, want about 1s to 2s", mode, o.From, o.To)
		}
		if o.Errors != 0 {
			t.Errorf("%s: %d errors in the outage", mode, o.Errors)
		}
		// A Poisson count over 1 s at 400/s: within 20% of it by far.
		if off := sc.Offered(); o.DecisionsPerSec < 0.8*off || o.DecisionsPerSec > 1.2*off {
			t.Errorf("%s: %.0f decisions/s in the outage, offered %.0f", mode, o.DecisionsPerSec, off)
		}
		switch mode {
		case Lease:
			if o.Fallback == 0 {
				t.Errorf("lease: no fallback decision in the outage: %+v", o)
			}
			if !o.Recovered || o.Recovery >= 2*time.Second {
				t.Errorf("lease: recovered %v after %v, want within 2s", o.Recovered, o.Recovery)
			}
		case Local:
			if o.Fallback != 0 || o.Recovered {
				t.Errorf("local: %+v, want no fallback and no recovery figure", o)
			}
		}
		reports = append(reports, rep)
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, reports); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "recovery") {
		t.Errorf("the table has no outage columns:\n%s", buf.String())
	}
	c := Chart(sc, reports)
	if len(c.Spans) != 1 || c.Spans[0].Label != "Redis down" {
		t.Errorf("spans %+v, want one labelled Redis down", c.Spans)
	}
	// The Redis is back and answers.
	if err := target.clock.Ping(t.Context()).Err(); err != nil {
		t.Errorf("PING after the runs: %v", err)
	}
}

// TestRunOutageNotOwned: an outage needs a Redis started here.
func TestRunOutageNotOwned(t *testing.T) {
	m := miniTarget(t)
	target, err := Dial(m.addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	sc := fleetScenario
	sc.Outage = Outage{At: time.Second, For: 500 * time.Millisecond}
	if _, err := Run(t.Context(), target, sc, Lease, nil); !errors.Is(err, ErrNotOwned) {
		t.Errorf("Run with an outage on a dialled Redis: %v, want ErrNotOwned", err)
	}
	sc.Outage = Outage{At: 2 * time.Second, For: time.Second}
	if _, err := Run(t.Context(), m, sc, Lease, nil); !errors.Is(err, ErrScenario) {
		t.Errorf("Run with an outage past the duration: %v, want ErrScenario", err)
	}
}

func TestParseOutage(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Outage
		ok   bool
	}{
		{"", Outage{}, true},
		{"2s@5s", Outage{At: 5 * time.Second, For: 2 * time.Second}, true},
		{"500ms@0s", Outage{For: 500 * time.Millisecond}, true},
		{"2s", Outage{}, false},
		{"0s@1s", Outage{}, false},
		{"1s@-1s", Outage{}, false},
		{"x@1s", Outage{}, false},
	} {
		got, err := ParseOutage(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseOutage(%q) = %+v, %v; want %+v, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
		if tc.ok && got.String() != tc.in && tc.in != "500ms@0s" {
			t.Errorf("%+v.String() = %q, want %q", got, got.String(), tc.in)
		}
	}
}

func TestWriteSweep(t *testing.T) {
	var buf bytes.Buffer
	reports := []Report{
		{Mode: Lease, SyncInterval: 50 * time.Millisecond, LocalCapacity: 256, CommandsPerDecision: 0.1, SaturatedKeys: 1, AdmittedPct: 99.5, UnderPct: 0.5},
		{Mode: Optimistic, SyncInterval: 200 * time.Millisecond, LocalCapacity: 4096, CommandsPerDecision: 0.01, SaturatedKeys: 1, AdmittedPct: 101, Overshoot: 10, OvershootPct: 1},
	}
	if err := WriteSweep(&buf, reports); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("WriteSweep wrote %d lines, want a header and 2 rows:\n%s", len(lines), buf.String())
	}
	for i, want := range [][]string{{"lease", "50ms", "256", "0.1000", "99.50%"}, {"optimistic", "200ms", "4096", "+10 (1.00%)"}} {
		for _, w := range want {
			if !strings.Contains(lines[i+1], w) {
				t.Errorf("row %d %q lacks %q", i, lines[i+1], w)
			}
		}
	}
}

// TestRunClosed: a closed loop asks as fast as it is answered, so every key
// asked for is saturated; lease admits no key more than B + R*T, counted per
// worker and per key, and local admits each key about N times as much.
func TestRunClosed(t *testing.T) {
	target := miniTarget(t)
	sc := Scenario{Instances: 2, Workers: 2, Duration: time.Second, Keys: 8, Dist: Zipf, Rate: 50, Burst: 50, Closed: true, Seed: 3}
	// miniredis serves from this process, whose cores the closed loop keeps
	// busy: give its answers time, so that the fallback (which the bound
	// B + R*T does not cover) never decides.
	sc.Config.Breaker.CallTimeout = 5 * time.Second
	sc.Config.ColdWait = 5 * time.Second
	for _, mode := range []string{Lease, Local} {
		t.Run(mode, func(t *testing.T) {
			rep, err := Run(t.Context(), target, sc, mode, nil)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			t.Logf("%s: %.0f decisions/s, admitted %d, %d saturated keys, ideal %.1f each, p50 %v, fallback %d, redis errors %d", mode, rep.DecisionsPerSec, rep.AdmittedTokens, rep.SaturatedKeys, rep.IdealPerKey, rep.P50, rep.Fallback, rep.RedisErrors)
			if !rep.Closed || rep.Offered != 0 {
				t.Errorf("Closed = %v, Offered = %v; want true, 0", rep.Closed, rep.Offered)
			}
			if rep.Errors != 0 || rep.Fallback != 0 {
				t.Errorf("%d errors (the first %q), %d fallback decisions; want none", rep.Errors, rep.FirstError, rep.Fallback)
			}
			// More than an open loop at 4x would ask, 4*50*8 = 1600/s:
			// how much more depends on the machine (about 10,000 on 2
			// idle cores with the race detector, a third of it beside
			// other packages' tests).
			if rep.Decisions < 2*1600 {
				t.Errorf("Decisions = %d, want many more than an open loop asks", rep.Decisions)
			}
			if rep.SaturatedKeys < 2 {
				t.Errorf("SaturatedKeys = %d, want every key asked for (at least the Zipf head)", rep.SaturatedKeys)
			}
			if got, want := rep.AdmittedSaturated, rep.AdmittedTokens; got != want {
				t.Errorf("AdmittedSaturated = %d, want all admitted tokens %d: every key asked is saturated", got, want)
			}
			// One decision in closedSample is timed.
			if n := rep.Decisions / closedSample; rep.P50 <= 0 || n == 0 {
				t.Errorf("p50 = %v over about %d timed decisions, want > 0", rep.P50, n)
			}
			switch mode {
			case Lease:
				if rep.Overshoot != 0 {
					t.Errorf("lease: Overshoot = %v, want 0", rep.Overshoot)
				}
			case Local:
				// Each instance admits a key its own B + R*T: up to N
				// times the ideal, less when the machine is too busy to
				// keep every instance's keys saturated.
				if got := float64(rep.AdmittedTokens); rep.Overshoot <= 0 || got < 1.15*rep.IdealSaturated {
					t.Errorf("local: Overshoot = %.0f, admitted %.0f; want > 0 and well above B+R*T over the keys = %.0f", rep.Overshoot, got, rep.IdealSaturated)
				}
			}
		})
	}
}

func TestFmtPerDecision(t *testing.T) {
	tests := []struct {
		v    float64
		want string
	}{
		{0, "0"},
		{1.00071, "1.0007"},
		{0.054, "0.0540"},
		{0.00031, "0.00031"},
		{0.0000312, "0.000031"},
		{12.5, "12.5000"},
	}
	for _, tt := range tests {
		if got := fmtPerDecision(tt.v); got != tt.want {
			t.Errorf("fmtPerDecision(%v) = %q, want %q", tt.v, got, tt.want)
		}
	}
}
