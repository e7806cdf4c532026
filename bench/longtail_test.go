package bench

import (
	"bytes"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid/internal/proccpu"
	"github.com/hybridlimit/hybrid/internal/redistest"
)

// deal returns the lists of every worker of sc's fleet, by instance and
// worker, drawn as newRunRange draws them.
func deal(sc Scenario) [][][]int32 {
	lists := make([][][]int32, sc.Instances)
	for i := range sc.Instances {
		for j := range sc.Workers {
			rng := rand.New(rand.NewPCG(sc.Seed, uint64(i)<<32|uint64(j)))
			lists[i] = append(lists[i], dealTail(sc, i, j, rng))
		}
	}
	return lists
}

// TestDealTail: each pass asks every key once, the passes one after
// another in each worker's list; the workers' shares of a pass differ by
// one at most; a key's passes go to different instances while there are
// enough of them; the lists are shuffled, and the same for the same seed.
func TestDealTail(t *testing.T) {
	tests := []Scenario{
		{Keys: 200, Passes: 3, Instances: 2, Workers: 2},
		{Keys: 1000, Passes: 3, Instances: 4, Workers: 8},
		{Keys: 7, Passes: 2, Instances: 3, Workers: 4}, // fewer keys than workers
		{Keys: 1, Passes: 5, Instances: 2, Workers: 1},
		{Keys: 999, Passes: 1, Instances: 1, Workers: 32},
	}
	for _, sc := range tests {
		sc.Seed = 9
		lists := deal(sc)
		w := sc.Instances * sc.Workers
		lo, hi := sc.Keys/w, (sc.Keys+w-1)/w // a worker's share of a pass
		asked := make([]int, sc.Keys)
		byInstance := make([]map[int]int, sc.Keys) // key -> instance -> asks
		for k := range byInstance {
			byInstance[k] = make(map[int]int)
		}
		for i, ws := range lists {
			for j, list := range ws {
				if n := len(list); n < lo*sc.Passes || n > hi*sc.Passes {
					t.Errorf("%+v: worker %d/%d asks %d keys, want %d to %d", sc, i, j, n, lo*sc.Passes, hi*sc.Passes)
				}
				seen := make(map[int32]int)
				for _, k := range list {
					asked[k]++
					byInstance[k][i]++
					seen[k]++
				}
				// A worker asks a key twice only if there are fewer workers
				// than passes.
				for k, n := range seen {
					if n > 1 && sc.Passes <= w {
						t.Errorf("%+v: worker %d/%d asks key %d %d times", sc, i, j, k, n)
					}
				}
			}
		}
		for k, n := range asked {
			if n != sc.Passes {
				t.Errorf("%+v: key %d asked %d times, want %d", sc, k, n, sc.Passes)
			}
			if sc.Passes <= sc.Instances && len(byInstance[k]) != sc.Passes {
				t.Errorf("%+v: key %d asked by %d instances, want %d (one per pass)", sc, k, len(byInstance[k]), sc.Passes)
			}
		}
		if again := deal(sc); !slices.EqualFunc(again, lists, func(a, b [][]int32) bool {
			return slices.EqualFunc(a, b, slices.Equal[[]int32])
		}) {
			t.Errorf("%+v: another deal with the same seed differs", sc)
		}
	}

	// A large share of a pass is shuffled, not in key order.
	sc := Scenario{Keys: 1000, Passes: 1, Instances: 2, Workers: 2, Seed: 9}
	if list := deal(sc)[0][0]; slices.IsSorted(list) {
		t.Errorf("worker 0/0 asks %v..., in key order: want it shuffled", list[:10])
	}
}

// TestDealSpread: with a Spread, each pass asks every key once on each of
// Spread instances, and nowhere else; the instances that ask a key follow
// one order, so with Spread equal to Instances worker j of every instance
// asks the same list; the workers' shares differ by one at most.
func TestDealSpread(t *testing.T) {
	for _, sc := range []Scenario{
		{Keys: 1000, Passes: 3, Instances: 4, Workers: 8, Spread: 4, Seed: 3},
		{Keys: 1001, Passes: 2, Instances: 4, Workers: 3, Spread: 2, Seed: 4},
		{Keys: 10, Passes: 1, Instances: 3, Workers: 16, Spread: 3, Seed: 5},
	} {
		lists := deal(sc)
		byInstance := make(map[int32]map[int]int)
		total := 0
		for i := range sc.Instances {
			for j := range sc.Workers {
				total += len(lists[i][j])
				for _, k := range lists[i][j] {
					if byInstance[k] == nil {
						byInstance[k] = map[int]int{}
					}
					byInstance[k][i]++
				}
				if sc.Spread == sc.Instances && !slices.Equal(lists[i][j], lists[0][j]) {
					t.Errorf("%+v: worker %d/%d asks another list than worker 0/%d", sc, i, j, j)
				}
			}
			lo, hi := len(lists[i][0]), len(lists[i][0])
			for _, l := range lists[i] {
				lo, hi = min(lo, len(l)), max(hi, len(l))
			}
			if hi-lo > sc.Passes {
				t.Errorf("%+v: instance %d's workers ask %d to %d keys", sc, i, lo, hi)
			}
		}
		if want := int64(total); want != sc.asks() {
			t.Errorf("%+v: %d asks dealt, want %d", sc, total, sc.asks())
		}
		for k := range int32(sc.Keys) {
			// Spread instances a pass, moving on by one each pass.
			if got, want := len(byInstance[k]), min(sc.Spread+sc.Passes-1, sc.Instances); got != want {
				t.Errorf("%+v: key %d asked by %d instances, want %d", sc, k, got, want)
			}
			n := 0
			for _, c := range byInstance[k] {
				n += c
			}
			if n != sc.Passes*sc.Spread {
				t.Errorf("%+v: key %d asked %d times, want %d", sc, k, n, sc.Passes*sc.Spread)
			}
		}
	}
	if _, err := (Scenario{Keys: 10, Passes: 1, Instances: 2, Spread: 3}).withDefaults(); err == nil {
		t.Error("a spread over more instances than the fleet's: no error")
	}
	if _, err := (Scenario{Keys: 10, Instances: 2, Spread: 2}).withDefaults(); err == nil {
		t.Error("a spread without passes: no error")
	}
}

// tailScenario is the tests' long tail: 200 keys asked 3 times each by 2
// instances of 2 workers, at a limit that no key reaches (B=10, 0.1/s:
// a bucket is full again, and its key expires, 30 s after 3 asks).
var tailScenario = Scenario{Instances: 2, Workers: 2, Keys: 200, Passes: 3, Rate: 0.1, Burst: 10, Seed: 5}

// checkTail checks what every long tail must report: each key asked
// exactly Passes times, and the counts adding up.
func checkTail(t *testing.T, sc Scenario, rep Report) {
	t.Helper()
	want := sc.asks()
	lt := rep.LongTail
	if lt == nil {
		t.Fatalf("%s: no LongTail in the report", rep.Mode)
	}
	t.Logf("%s: %d decisions in %.0f/s, %d admitted, p50 %v, %.4f commands per decision, fallback %d, redis errors %d",
		rep.Mode, rep.Decisions, rep.DecisionsPerSec, rep.Admitted, rep.P50, rep.CommandsPerDecision, rep.Fallback, rep.RedisErrors)
	if rep.Errors != 0 {
		t.Errorf("%s: %d errors, the first %q", rep.Mode, rep.Errors, rep.FirstError)
	}
	if lt.Asks != want || lt.Issued != want || !lt.Complete || rep.Decisions != want {
		t.Errorf("%s: asks %d, issued %d, complete %v, decisions %d; want %d each and complete", rep.Mode, lt.Asks, lt.Issued, lt.Complete, rep.Decisions, want)
	}
	if lt.KeysExact != sc.Keys || lt.Passes != sc.Passes || lt.Asks != sc.asks() {
		t.Errorf("%s: %d keys asked exactly %d times, want all %d", rep.Mode, lt.KeysExact, lt.Passes, sc.Keys)
	}
	if _, ok := proccpu.Used(); ok && lt.ProcessCPUPerDecision <= 0 {
		t.Errorf("%s: ProcessCPUPerDecision = %v, want the fleet's CPU time measured", rep.Mode, lt.ProcessCPUPerDecision)
	}
	// No key nears B + R*T, so none is saturated, and every ask is admitted.
	if rep.Admitted != rep.Decisions || rep.SaturatedKeys != 0 {
		t.Errorf("%s: admitted %d of %d, %d saturated keys; want all admitted and none saturated", rep.Mode, rep.Admitted, rep.Decisions, rep.SaturatedKeys)
	}
	if !rep.Closed || rep.Offered != 0 {
		t.Errorf("%s: Closed %v, Offered %v; want a closed loop", rep.Mode, rep.Closed, rep.Offered)
	}
	var sum int64
	for _, s := range rep.Timeline {
		sum += s.Decisions
	}
	if sum != rep.Decisions {
		t.Errorf("%s: the timeline holds %d decisions, want %d", rep.Mode, sum, rep.Decisions)
	}
	if rep.DecisionsPerSec <= 0 {
		t.Errorf("%s: %v decisions/s", rep.Mode, rep.DecisionsPerSec)
	}
	// The commands until the limiters closed include those until the last
	// answer.
	if lt.Commands < rep.Commands || lt.CommandsPerDecision != float64(lt.Commands)/float64(rep.Decisions) {
		t.Errorf("%s: %d commands (%v per decision) until closed, %d until the last answer", rep.Mode, lt.Commands, lt.CommandsPerDecision, rep.Commands)
	}
	// Exact decides every request in Redis: the requests of an instance's
	// workers that need Redis at once go in one call, so at least one call
	// a worker's decision on each instance.
	if least := 1 / float64(sc.Workers); rep.Mode == Exact && lt.CommandsPerDecision < least {
		t.Errorf("exact: %v commands per decision, want at least %v", lt.CommandsPerDecision, least)
	}
}

// TestRunLongTail: a long tail on miniredis asks every key exactly Passes
// times and ends when done, in one process and over two; the table has a
// row per mode. Redis's own figures are not read on miniredis.
func TestRunLongTail(t *testing.T) {
	target := miniTarget(t)
	sc := tailScenario
	// miniredis serves from this process, which the closed loop keeps
	// busy: give its answers time, so that the fallback never decides.
	sc.Config.Breaker.CallTimeout = 5 * time.Second
	sc.Config.ColdWait = 5 * time.Second
	var reports []Report
	for _, mode := range []string{Lease, Exact, Local} {
		rep, err := Run(t.Context(), target, sc, mode, nil)
		if err != nil {
			t.Fatalf("%s: Run: %v", mode, err)
		}
		checkTail(t, sc, rep)
		if rep.LongTail.Redis != nil || rep.LongTail.RedisError != "" {
			t.Errorf("%s: Redis figures %+v, error %q on miniredis; want none", mode, rep.LongTail.Redis, rep.LongTail.RedisError)
		}
		reports = append(reports, rep)
	}
	t.Run("procs", func(t *testing.T) {
		for _, mode := range []string{Exact, Local} {
			rep, err := RunProcs(t.Context(), target, sc, mode, 2, nil)
			if err != nil {
				t.Fatalf("%s: RunProcs: %v", mode, err)
			}
			checkTail(t, sc, rep)
		}
	})

	var buf bytes.Buffer
	if err := WriteLongTail(&buf, reports); err != nil {
		t.Fatal(err)
	}
	checkAligned(t, buf.String(), len(reports))
}

// checkAligned checks that table is a header and rows aligned with it,
// each starting with a mode.
func checkAligned(t *testing.T, table string, rows int) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(table, "\n"), "\n")
	if len(lines) != 1+rows {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), 1+rows, table)
	}
	for i, line := range lines {
		if len([]rune(line)) != len([]rune(lines[0])) {
			t.Errorf("line %d is %d characters wide, the header %d: not aligned:\n%s", i, len([]rune(line)), len([]rune(lines[0])), table)
		}
	}
}

// TestRunLongTailRedis: on a real Redis, a long tail reads what each mode
// cost the server: one script call per decision for both redis_rate modes,
// a bucket read per decision for exact (its decisions that need Redis at
// once go in one call), a key left per key asked, their memory and CPU time;
// the auto-pipelined redis_rate sends one command per decision as the plain
// one does. On a Redis given by address the run's keys are deleted at the
// end; a spawned one is emptied before each mode.
func TestRunLongTailRedis(t *testing.T) {
	p := redistest.Server(t)
	target, err := Dial(p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	sc := tailScenario
	var reports []Report
	for _, mode := range []string{Exact, RedisRate, RedisRateAP, Lease} {
		rep, err := Run(t.Context(), target, sc, mode, nil)
		if err != nil {
			t.Fatalf("%s: Run: %v", mode, err)
		}
		checkTail(t, sc, rep)
		lt := rep.LongTail
		red := lt.Redis
		if red == nil {
			t.Fatalf("%s: no Redis figures (error %q)", mode, lt.RedisError)
		}
		t.Logf("%s: %+v", mode, *red)
		d := rep.Decisions
		last := red.AtLastAnswer
		if red.ScriptCalls < last.ScriptCalls || red.Calls < last.Calls || red.CPU < last.CPU {
			t.Errorf("%s: %d script calls, %d calls, CPU %v in all; %d, %d, %v at the last answer: want no fewer in all", mode, red.ScriptCalls, red.Calls, red.CPU, last.ScriptCalls, last.Calls, last.CPU)
		}
		// A key per key asked, at the last answer and once the fleet is
		// gone (the fleet's own key, if any, made and deleted meanwhile).
		if red.Keys != int64(sc.Keys) || last.Keys != int64(sc.Keys) {
			t.Errorf("%s: %d keys left in Redis, %d at the last answer; want %d", mode, red.Keys, last.Keys, sc.Keys)
		}
		switch mode {
		case RedisRate, RedisRateAP:
			// One script call per decision, and a NOSCRIPT answer (then
			// EVAL) at most once per worker.
			if max := d + int64(2*sc.Instances*sc.Workers); last.ScriptCalls < d || last.ScriptCalls > max {
				t.Errorf("%s: %d script calls for %d decisions, want %d to %d", mode, last.ScriptCalls, d, d, max)
			}
			if rep.CommandsPerDecision < 1 {
				t.Errorf("%s: %.4f commands sent per decision, want at least 1", mode, rep.CommandsPerDecision)
			}
		case Exact:
			// Each decision reads its bucket in Redis (a GET of a bucket
			// kept as a string, an HMGET of one kept as a hash); the
			// decisions of an instance's workers that need Redis at once go
			// in one call.
			if reads := red.Commands["get"].Calls + red.Commands["hmget"].Calls; reads < d {
				t.Errorf("exact: %d buckets read for %d decisions, want one a decision at least", reads, d)
			}
			if least, max := d/int64(sc.Workers), d+int64(2*sc.Instances*sc.Workers); last.ScriptCalls < least || last.ScriptCalls > max {
				t.Errorf("exact: %d script calls for %d decisions, want %d to %d", last.ScriptCalls, d, least, max)
			}
		}
		if red.ScriptCalls == 0 || red.ScriptUsec <= 0 || red.CPU <= 0 || red.UsedMemory <= 0 || red.MemPerKey <= 0 {
			t.Errorf("%s: script calls %d, µs %d, CPU %v, memory %d (%.0f per key): want them all > 0", mode, red.ScriptCalls, red.ScriptUsec, red.CPU, red.UsedMemory, red.MemPerKey)
		}
		// The scripts call commands, which Redis counts too; the clients
		// sent the scripts alone.
		// (A connection opened during the run sends HELLO and CLIENT
		// SETINFO besides.)
		if red.Calls <= red.ScriptCalls || red.Sent < red.ScriptCalls || red.Sent >= red.Calls || red.SentUsec < red.ScriptUsec {
			t.Errorf("%s: %d calls, %d sent (%d µs), %d script calls (%d µs): want more calls than sent, and the scripts sent", mode, red.Calls, red.Sent, red.SentUsec, red.ScriptCalls, red.ScriptUsec)
		}
		for _, own := range []string{"info", "dbsize", "config|resetstat"} {
			if c, ok := red.Commands[own]; ok {
				t.Errorf("%s: commandstats has the bench's own %s: %+v", mode, own, c)
			}
		}
		if got, want := red.ScriptsPerDecision, float64(red.ScriptCalls)/float64(d); got != want {
			t.Errorf("%s: ScriptsPerDecision = %v, want %v", mode, got, want)
		}
		reports = append(reports, rep)
	}
	Compare(reports, RedisRate)
	for _, r := range reports {
		lt := r.LongTail
		if lt.Base != RedisRate || lt.DecisionsVsBase <= 0 || lt.ScriptUsecVsBase <= 0 || lt.CPUVsBase <= 0 || lt.ProcessCPUVsBase <= 0 {
			t.Errorf("%s: compared with %q: %v, %v, %v, %v; want redis_rate and ratios > 0", r.Mode, lt.Base, lt.DecisionsVsBase, lt.ScriptUsecVsBase, lt.CPUVsBase, lt.ProcessCPUVsBase)
		}
		if r.Mode == RedisRate && (lt.DecisionsVsBase != 1 || lt.ScriptUsecVsBase != 1 || lt.CPUVsBase != 1 || lt.ProcessCPUVsBase != 1) {
			t.Errorf("redis_rate against itself: %v, %v, %v, %v; want 1 each", lt.DecisionsVsBase, lt.ScriptUsecVsBase, lt.CPUVsBase, lt.ProcessCPUVsBase)
		}
	}
	var buf bytes.Buffer
	if err := WriteLongTail(&buf, reports); err != nil {
		t.Fatal(err)
	}
	checkAligned(t, buf.String(), len(reports))
	t.Logf("\n%s", buf.String())

	if p.Owned() {
		// A server of this test's own: nothing but the runs' keys was there,
		// and they are deleted.
		if n, err := target.clock.DBSize(t.Context()).Result(); err != nil || n != 0 {
			t.Errorf("DBSIZE after the runs = %d, %v; want 0", n, err)
		}
	}

	t.Run("spawned", func(t *testing.T) {
		if !p.Owned() {
			t.Skip("REDIS_ADDR names the server: not spawning one")
		}
		target, err := SpawnRedis()
		if err != nil {
			t.Fatal(err)
		}
		defer target.Close()
		if err := target.clock.Set(t.Context(), "left-over", "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
		rep, err := Run(t.Context(), target, sc, RedisRate, nil)
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		checkTail(t, sc, rep)
		if n, err := target.clock.Exists(t.Context(), "left-over").Result(); err != nil || n != 0 {
			t.Errorf("EXISTS left-over after the run = %d, %v; want the server emptied first", n, err)
		}
		if red := rep.LongTail.Redis; red == nil || red.Keys != int64(sc.Keys) {
			t.Errorf("Redis figures %+v, want %d keys", red, sc.Keys)
		}
	})
}

// TestWriteLongTail: the ratios to redis_rate, "-" for what was not
// measured, and a run cut short.
func TestWriteLongTail(t *testing.T) {
	red := func(script, cpu float64) *RedisReport {
		return &RedisReport{ScriptsPerDecision: 1, CallsPerDecision: 4, ScriptUsecPerDecision: script, SentUsecPerDecision: script, CPUPerDecision: cpu, Keys: 50000, MemPerKey: 112}
	}
	reports := []Report{
		{Mode: RedisRate, DecisionsPerSec: 20000, Decisions: 150000, Admitted: 150000, CommandsPerDecision: 1,
			LongTail: &LongTailReport{Asks: 150000, Issued: 150000, Complete: true, CommandsPerDecision: 1.0007, ProcessCPUPerDecision: 16, Redis: red(8, 20)}},
		{Mode: RedisRateAP, DecisionsPerSec: 50000, Decisions: 150000, Admitted: 150000,
			LongTail: &LongTailReport{Asks: 150000, Issued: 150000, Complete: true, Redis: red(8, 5)}},
		{Mode: Lease, DecisionsPerSec: 10000, Decisions: 60000, Admitted: 60000,
			LongTail: &LongTailReport{Asks: 150000, Issued: 60000, ProcessCPUPerDecision: 12, Redis: red(20, 30)}},
		{Mode: Local, DecisionsPerSec: 1000000, Decisions: 150000, LongTail: &LongTailReport{Asks: 150000, Issued: 150000, Complete: true}},
	}
	var buf bytes.Buffer
	if err := WriteLongTail(&buf, reports); err != nil {
		t.Fatal(err)
	}
	table := buf.String()
	checkAligned(t, table, len(reports))
	lines := strings.Split(table, "\n")
	for i, want := range [][]string{
		{"redis_rate", "150000", "100.0%", "1.0007", "8.00", "20.00", "16.00", "50000", "112 B", "1.00x"},
		{"redis_rate_ap", "2.50x", "0.25x"},
		{"lease", "60000/150000", "12.00", "0.50x", "2.50x", "1.50x", "0.75x"},
		{"local", "50.00x", "0.0%"},
	} {
		for _, w := range want {
			if !strings.Contains(lines[1+i], w) {
				t.Errorf("row %d %q lacks %q", i, lines[1+i], w)
			}
		}
	}
	if f := strings.Fields(lines[4]); f[len(f)-3] != "-" || f[len(f)-4] != "-" || f[len(f)-5] != "-" {
		t.Errorf("local row %q: want - for the CPU and Redis ratios", lines[4])
	}
	if f := strings.Fields(lines[2]); f[len(f)-3] != "-" {
		t.Errorf("redis_rate_ap row %q: want - for proc vs rr (its CPU not measured)", lines[2])
	}
}

// TestRedisReport: the bench's own commands are taken out of commandstats
// (a CONFIG RESETSTAT counts itself), the commands the clients sent are
// told from those that scripts called, memory and keys run from the first
// reading, commands and CPU time from the reset.
func TestRedisReport(t *testing.T) {
	stats := parseCommandStats("# Commandstats\r\n" +
		"cmdstat_evalsha:calls=1000,usec=9000,usec_per_call=9.00,rejected_calls=0,failed_calls=2\r\n" +
		"cmdstat_eval:calls=2,usec=200,usec_per_call=100.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_time:calls=1004,usec=1004,usec_per_call=1.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_hset:calls=1000,usec=3000,usec_per_call=3.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_hello:calls=3,usec=30,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_client|setinfo:calls=6,usec=12,usec_per_call=2.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_config|resetstat:calls=1,usec=50,usec_per_call=50.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=3,usec=300,usec_per_call=100.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_dbsize:calls=2,usec=2,usec_per_call=1.00,rejected_calls=0,failed_calls=0\r\n")
	if got, want := stats["client|setinfo"], (CommandStat{Calls: 6, Usec: 12}); got != want {
		t.Errorf("parseCommandStats: client|setinfo = %+v, want %+v", got, want)
	}
	empty := &redisSnapshot{usedMemory: 1_000_000, keys: 5}
	// The clock client sent, from the reset on: the reset's CONFIG
	// RESETSTAT, INFO and DBSIZE, TIME twice (the window), and the last
	// answer's INFO twice and DBSIZE.
	reset := &redisSnapshot{own: map[string]int64{"config": 10, "info": 10, "dbsize": 10, "time": 10}, cpu: time.Second, keys: 6}
	last := &redisSnapshot{own: map[string]int64{"config": 11, "info": 11, "dbsize": 11, "time": 12}, stats: map[string]CommandStat{"evalsha": {Calls: 990, Usec: 8900}}, cpu: 1500 * time.Millisecond, keys: 1006}
	closed := &redisSnapshot{own: map[string]int64{"config": 11, "info": 13, "dbsize": 12, "time": 12}, stats: stats, cpu: 1600 * time.Millisecond, usedMemory: 1_200_000, keys: 1005}
	r := redisReport(empty, reset, last, closed)
	// The clients sent 1002 scripts, 3 HELLO and 6 CLIENT SETINFO (one
	// more hello counted than Redis ran: sent before the reset).
	r.finish(map[string]int64{"evalsha": 1000, "eval": 2, "hello": 4, "client": 6}, 1000)

	want := map[string]CommandStat{
		"evalsha": {1000, 9000}, "eval": {2, 200}, "time": {1002, 1002}, "hset": {1000, 3000},
		"hello": {3, 30}, "client|setinfo": {6, 12},
	}
	if !maps.Equal(r.Commands, want) {
		t.Errorf("Commands = %v, want %v (the bench's own taken out)", r.Commands, want)
	}
	for _, tt := range []struct {
		name      string
		got, want int64
	}{
		{"ScriptCalls", r.ScriptCalls, 1002},
		{"ScriptUsec", r.ScriptUsec, 9200},
		{"Calls", r.Calls, 1002 + 1002 + 1000 + 3 + 6},
		{"Sent", r.Sent, 1002 + 3 + 6},
		{"SentUsec", r.SentUsec, 9200 + 30 + 12},
		{"CPU µs", r.CPU.Microseconds(), 600_000},
		{"UsedMemory", r.UsedMemory, 200_000},
		{"Keys", r.Keys, 1000},
		{"AtLastAnswer.ScriptCalls", r.AtLastAnswer.ScriptCalls, 990},
		{"AtLastAnswer.Keys", r.AtLastAnswer.Keys, 1000},
		{"AtLastAnswer.CPU µs", r.AtLastAnswer.CPU.Microseconds(), 500_000},
	} {
		if tt.got != tt.want {
			t.Errorf("%s = %d, want %d", tt.name, tt.got, tt.want)
		}
	}
	for _, tt := range []struct {
		name      string
		got, want float64
	}{
		{"ScriptsPerDecision", r.ScriptsPerDecision, 1.002},
		{"CallsPerDecision", r.CallsPerDecision, 3.013},
		{"ScriptUsecPerDecision", r.ScriptUsecPerDecision, 9.2},
		{"SentUsecPerDecision", r.SentUsecPerDecision, 9.242},
		{"CPUPerDecision", r.CPUPerDecision, 600},
		{"MemPerKey", r.MemPerKey, 200},
	} {
		if math.Abs(tt.got-tt.want) > 1e-9 {
			t.Errorf("%s = %v, want %v", tt.name, tt.got, tt.want)
		}
	}
}
