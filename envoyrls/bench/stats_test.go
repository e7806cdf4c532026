package bench

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestCommandCalls(t *testing.T) {
	tests := []struct {
		name string
		info string
		want map[string]int64
		err  bool
	}{
		{"empty", "# Commandstats\r\n", map[string]int64{}, false},
		{"the bench's own left out", "# Commandstats\r\n" +
			"cmdstat_info:calls=7,usec=100,usec_per_call=14.29,rejected_calls=0,failed_calls=0\r\n" +
			"cmdstat_flushall:calls=2,usec=10,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\n" +
			"cmdstat_ping:calls=21,usec=10,usec_per_call=0.48,rejected_calls=0,failed_calls=0\r\n", map[string]int64{}, false},
		{"summed", "# Commandstats\r\n" +
			"cmdstat_incrby:calls=1000,usec=900,usec_per_call=0.90,rejected_calls=0,failed_calls=0\r\n" +
			"cmdstat_expire:calls=1000,usec=800,usec_per_call=0.80,rejected_calls=0,failed_calls=0\r\n" +
			"cmdstat_evalsha:calls=3,usec=30,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n",
			map[string]int64{"incrby": 1000, "expire": 1000, "evalsha": 3}, false},
		{"other sections ignored", "# Server\r\nredis_version:7.0.15\r\n# Commandstats\r\ncmdstat_get:calls=5,usec=1\r\n", map[string]int64{"get": 5}, false},
		{"no calls", "cmdstat_get:usec=1\r\n", nil, true},
		{"bad calls", "cmdstat_get:calls=x,usec=1\r\n", nil, true},
	}
	for _, tt := range tests {
		got, err := commandCalls(tt.info)
		if (err != nil) != tt.err || !maps.Equal(got, tt.want) {
			t.Errorf("%s: commandCalls() = %v, %v; want %v, error %v", tt.name, got, err, tt.want, tt.err)
		}
	}
}

func TestCallsSince(t *testing.T) {
	before := map[string]int64{"evalsha": 10, "get": 3}
	after := map[string]int64{"evalsha": 25, "get": 3, "time": 4}
	delta, total := callsSince(before, after)
	if want := map[string]int64{"evalsha": 15, "time": 4}; !maps.Equal(delta, want) || total != 19 {
		t.Errorf("callsSince() = %v, %d; want %v, 19", delta, total, want)
	}
}

func TestCPUTime(t *testing.T) {
	info := "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:0.250000\r\nused_cpu_sys_children:9.000000\r\n"
	if got, err := cpuTime(info); err != nil || got != 1750*time.Millisecond {
		t.Errorf("cpuTime() = %v, %v; want 1.75s", got, err)
	}
	if _, err := cpuTime("# CPU\r\nused_cpu_sys:1.5\r\n"); err == nil {
		t.Errorf("cpuTime() without used_cpu_user: no error")
	}
}

func TestScriptCalls(t *testing.T) {
	calls := map[string]int64{"evalsha": 10, "eval": 1, "hget": 30, "incrby": 5}
	if got := scriptCalls(calls); got != 11 {
		t.Errorf("scriptCalls(%v) = %d, want 11", calls, got)
	}
}

func TestPercentile(t *testing.T) {
	var hundred []time.Duration
	for i := 1; i <= 100; i++ {
		hundred = append(hundred, time.Duration(i))
	}
	tests := []struct {
		sorted []time.Duration
		q      float64
		want   time.Duration
	}{
		{nil, 0.5, 0},
		{[]time.Duration{7}, 0.999, 7},
		{hundred, 0.5, 50},
		{hundred, 0.99, 99},
		{hundred, 0.999, 100},
		{hundred, 1, 100},
		{hundred, 0.001, 1},
	}
	for i, tt := range tests {
		if got := percentile(tt.sorted, tt.q); got != tt.want {
			t.Errorf("%d: percentile(%d values, %v) = %v, want %v", i, len(tt.sorted), tt.q, got, tt.want)
		}
	}
}

func TestWriteTable(t *testing.T) {
	results := []Result{
		{Service: serviceOriginal, Workload: workloadHot, Elapsed: time.Second, OK: 20000, OverLimit: 10000,
			Latencies: []time.Duration{time.Millisecond}, RedisCalls: 60000, Bound: 20000},
		{Service: serviceHybrid, Workload: workloadHot, Elapsed: time.Second, OK: 19000, OverLimit: 71000,
			Latencies: []time.Duration{time.Millisecond / 2}, RedisCalls: 90, ScriptCalls: 15, RedisCPU: 9 * time.Millisecond, Bound: 20000},
		{Service: serviceOriginal, Workload: workloadTail, RTT: time.Millisecond, Elapsed: time.Second, OK: 100},
	}
	var b strings.Builder
	if err := WriteTable(&b, results); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"20000/20000 = 1.000", // the original's admitted against the bound
		"0.0010",              // hybrid-rls's commands per decision
		"0.0002",              // its scripts per decision
		"0.10",                // Redis's CPU per decision, in µs
		"3.00x",               // its decisions/s against the original's
		"1.00, 0.50",          // the p99s
	} {
		if !strings.Contains(out, want) {
			t.Errorf("WriteTable() has no %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "B tail") != 1 {
		t.Errorf("WriteTable() compares a cell with one service:\n%s", out)
	}
}

// TestWriteTableFloor: with the gRPC floor in a cell, the comparison has
// the floor's decisions a second against the original's and hybrid-rls's
// against the floor's; a cell the floor did not run says so, and without
// the floor the columns are not there.
func TestWriteTableFloor(t *testing.T) {
	results := []Result{
		{Service: serviceOriginal, Workload: workloadHot, Elapsed: time.Second, OK: 10000},
		{Service: serviceHybrid, Workload: workloadHot, Elapsed: time.Second, OK: 30000},
		{Service: serviceFloor, Workload: workloadHot, Elapsed: time.Second, OK: 40000},
		{Service: serviceFloor, Workload: workloadHot, Elapsed: time.Second, OK: 20000, Repeat: 1},
		{Service: serviceOriginal, Workload: workloadTail, Elapsed: time.Second, OK: 10000},
		{Service: serviceHybrid, Workload: workloadTail, Elapsed: time.Second, OK: 12000},
	}
	var b strings.Builder
	if err := WriteTable(&b, results); err != nil {
		t.Fatal(err)
	}
	// The comparison's lines, after the results' and a blank line.
	_, cmp, _ := strings.Cut(b.String(), "\n\n")
	want := map[string][]string{
		"hot":  {"3.00x", "3.00x", "1.00x"}, // hybrid-rls/original, floor/original, hybrid-rls/floor
		"tail": {"1.20x", "-", "-"},
	}
	lines := strings.Split(strings.TrimSpace(cmp), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "floor/original decisions/s") {
		t.Fatalf("WriteTable()'s comparison:\n%s", cmp)
	}
	for _, line := range lines[1:] {
		f := strings.Fields(line) // redis, workload (two words), the ratio, 4 more, the floor's two
		if len(f) != 10 {
			t.Errorf("comparison line %q: %d fields, want 10", line, len(f))
			continue
		}
		if got := []string{f[3], f[8], f[9]}; !slices.Equal(got, want[f[2]]) {
			t.Errorf("comparison of %s: %v, want %v", f[2], got, want[f[2]])
		}
	}
	b.Reset()
	if err := WriteTable(&b, results[:2]); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "floor") {
		t.Errorf("WriteTable() without the floor has its columns:\n%s", b.String())
	}
}
