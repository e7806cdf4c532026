package bench

import (
	"encoding/json"
	"testing"
	"time"
)

// TestRunProcs: a fleet split over separate processes, coordinated through
// Redis alone, keeps the limit as one process's fleet does (lease never
// above B + R*T), local multiplies it, and the parent's report adds up the
// shards' counts.
func TestRunProcs(t *testing.T) {
	target := miniTarget(t)
	sc := fleetScenario
	sc.Duration = 1500 * time.Millisecond
	for _, mode := range []string{Lease, Local} {
		t.Run(mode, func(t *testing.T) {
			var ticks int
			rep, err := RunProcs(t.Context(), target, sc, mode, 2, func(p Progress) { ticks++ })
			if err != nil {
				t.Fatalf("RunProcs: %v", err)
			}
			t.Logf("%s: %d decisions, admitted %d, ideal %.1f; p50 %v; %d commands; fallback %d", mode, rep.Decisions, rep.AdmittedTokens, rep.IdealPerKey, rep.P50, rep.Commands, rep.Fallback)
			if rep.Procs != 2 || rep.Instances != sc.Instances {
				t.Errorf("Procs = %d, Instances = %d; want 2, %d", rep.Procs, rep.Instances, sc.Instances)
			}
			if rep.Errors != 0 || rep.Fallback > rep.Decisions/50 {
				t.Errorf("errors %d (first %q), fallback %d of %d; want none and under 2%%", rep.Errors, rep.FirstError, rep.Fallback, rep.Decisions)
			}
			if want := sc.Offered() * sc.Duration.Seconds(); float64(rep.Decisions) < 0.5*want || float64(rep.Decisions) > 1.5*want {
				t.Errorf("Decisions = %d, want about %.0f", rep.Decisions, want)
			}
			if rep.P50 <= 0 || rep.P50 > rep.P99 || rep.P99 > rep.Max {
				t.Errorf("latency p50 %v p99 %v max %v", rep.P50, rep.P99, rep.Max)
			}
			var sum int64
			for _, s := range rep.Timeline {
				sum += s.Decisions
			}
			if sum != rep.Decisions || ticks == 0 {
				t.Errorf("the timeline holds %d decisions, want %d; %d progress calls", sum, rep.Decisions, ticks)
			}
			ideal := rep.IdealPerKey
			got := float64(rep.AdmittedTokens)
			switch mode {
			case Lease:
				if got > ideal || got < 0.5*ideal {
					t.Errorf("lease admitted %v, want at most and about B+R*T = %.1f", got, ideal)
				}
				if rep.Commands == 0 {
					t.Error("no Redis command counted in the shards")
				}
			case Local:
				if got < 2*ideal {
					t.Errorf("local admitted %v, want more than twice B+R*T = %.1f", got, ideal)
				}
			}
		})
	}
}

// TestRunProcsOutage: the parent takes Redis down and tells the shards,
// which count the decisions of the outage and their fallback, and recover.
func TestRunProcsOutage(t *testing.T) {
	target := miniTarget(t)
	sc := fleetScenario
	sc.Duration = 3 * time.Second
	sc.Outage = Outage{At: time.Second, For: time.Second}
	rep, err := RunProcs(t.Context(), target, sc, Lease, 2, nil)
	if err != nil {
		t.Fatalf("RunProcs: %v", err)
	}
	o := rep.Outage
	if o == nil {
		t.Fatal("no outage report")
	}
	t.Logf("outage %.2fs-%.2fs: %d decisions (%.0f/s), fallback %.1f%%, p99 %v, recovered %v after %v", o.From, o.To, o.Decisions, o.DecisionsPerSec, o.FallbackPct, o.P99, o.Recovered, o.Recovery)
	if rep.Errors != 0 || o.Errors != 0 {
		t.Errorf("%d errors, %d in the outage; want none", rep.Errors, o.Errors)
	}
	if o.Decisions == 0 || o.Fallback == 0 {
		t.Errorf("outage: %d decisions, %d by the fallback; want both > 0", o.Decisions, o.Fallback)
	}
	if !o.Recovered {
		t.Errorf("not recovered within the run")
	}
}

func TestHistogramJSON(t *testing.T) {
	var h Histogram
	for _, d := range []time.Duration{0, 1, 17, 1000, time.Millisecond, time.Second, time.Second} {
		h.Record(d)
	}
	b, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	var g Histogram
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatalf("Unmarshal(%s): %v", b, err)
	}
	if g != h {
		t.Errorf("Unmarshal(Marshal(h)) differs from h; JSON %s", b)
	}
	for _, bad := range []string{`{"n":2,"max_ns":5,"buckets":[[1,1]]}`, `{"n":1,"max_ns":5,"buckets":[[100000,1]]}`} {
		if err := json.Unmarshal([]byte(bad), &g); err == nil {
			t.Errorf("Unmarshal(%s) = nil, want an error", bad)
		}
	}
}
