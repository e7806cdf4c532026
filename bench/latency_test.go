package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// latencyScenario is a small closed loop of exact decisions, each one
// script call: each takes at least the round trip. The limiters wait long
// for Redis, so that a busy machine does not send them to the fallback.
func latencyScenario() Scenario {
	sc := Scenario{Instances: 2, Workers: 2, Duration: 500 * time.Millisecond, Keys: 1, Rate: 100, Burst: 100, Closed: true, Seed: 3}
	sc.Config.Breaker.CallTimeout = 2 * time.Second
	sc.Config.ColdWait = 2 * time.Second
	return sc
}

// TestAddLatency: through the proxy of a Target with latency, PING and the
// decisions of an exact run, in one process and in two, take at least the
// round trip added (the histogram is within 1/16), and the report and the
// Target's description say so; the direct PING is only logged. An address
// without a proxy is not dialled.
func TestAddLatency(t *testing.T) {
	target := miniTarget(t)
	const rtt = 20 * time.Millisecond
	if err := target.AddLatency(t.Context(), rtt); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", target)
	if target.pingVia < rtt {
		t.Errorf("PING through the proxy took %v, want at least %v", target.pingVia, rtt)
	}
	if want := "via a proxy adding 20ms round trip"; !strings.Contains(target.String(), want) {
		t.Errorf("String() = %q, want it to say %q", target, want)
	}
	if target.Latency() != rtt {
		t.Errorf("Latency() = %v, want %v", target.Latency(), rtt)
	}
	if err := target.AddLatency(t.Context(), rtt); err == nil {
		t.Errorf("AddLatency twice: no error")
	}
	sc := latencyScenario()
	var reports []Report
	for _, procs := range []int{0, 2} {
		var (
			rep Report
			err error
		)
		if procs == 0 {
			rep, err = Run(t.Context(), target, sc, Exact, nil)
		} else {
			rep, err = RunProcs(t.Context(), target, sc, Exact, procs, nil)
		}
		if err != nil {
			t.Fatalf("%d processes: %v", procs, err)
		}
		t.Logf("%d processes: %d decisions, p50 %v, max %v, fallback %d, redis errors %d", procs, rep.Decisions, rep.P50, rep.Max, rep.Fallback, rep.RedisErrors)
		if rep.Decisions == 0 || rep.Errors != 0 {
			t.Errorf("%d processes: %d decisions, %d errors (first %q); want some and none", procs, rep.Decisions, rep.Errors, rep.FirstError)
		}
		if low := rtt - rtt/16; rep.P50 < low {
			t.Errorf("%d processes: p50 %v, want at least %v: the decisions did not go through the proxy", procs, rep.P50, low)
		}
		if rep.Latency != rtt || !strings.Contains(rep.Target, "via a proxy") {
			t.Errorf("%d processes: report Latency %v, Target %q; want %v, via a proxy", procs, rep.Latency, rep.Target, rtt)
		}
		if rep.Health == nil {
			t.Errorf("%d processes: no Health in the report of exact", procs)
		}
		reports = append(reports, rep)
	}
	var buf bytes.Buffer
	if err := WriteHealth(&buf, reports); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(buf.String()), "\n"); len(lines) != 3 || !strings.Contains(lines[0], "fetch t/o") {
		t.Errorf("WriteHealth:\n%s\nwant a header with fetch t/o and two rows", buf.String())
	}
	if _, err := viaDialer(target.via)(t.Context(), "tcp", "127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "no proxy") {
		t.Errorf("dial of an address without a proxy: %v, want refused", err)
	}
}

// TestAddLatencyOutage: the proxy dials Redis for each connection, so a
// lease fleet with latency gets through an outage of the embedded miniredis
// as without: its breakers close again once Redis is back.
func TestAddLatencyOutage(t *testing.T) {
	target := miniTarget(t)
	if err := target.AddLatency(t.Context(), 2*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	sc := fleetScenario
	sc.Duration = 3 * time.Second
	sc.Outage = Outage{At: time.Second, For: time.Second}
	rep, err := Run(t.Context(), target, sc, Lease, nil)
	if err != nil {
		t.Fatal(err)
	}
	o := rep.Outage
	if o == nil {
		t.Fatal("no outage in the report")
	}
	if rep.Errors != 0 || o.Fallback == 0 || !o.Recovered {
		t.Errorf("%d errors, outage %+v; want none, fallback decisions in it, and recovered", rep.Errors, o)
	}
}

// TestAddLatencyZero: no latency is no proxy.
func TestAddLatencyZero(t *testing.T) {
	target := miniTarget(t)
	if err := target.AddLatency(t.Context(), 0); err != nil {
		t.Fatal(err)
	}
	if target.via != nil || target.proxy != nil || strings.Contains(target.String(), "proxy") {
		t.Errorf("AddLatency(0): via %v, proxy %v, %q; want direct", target.via, target.proxy, target)
	}
	if err := target.AddLatency(t.Context(), -time.Millisecond); err == nil {
		t.Errorf("AddLatency(-1ms): no error")
	}
}
