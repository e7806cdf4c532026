package runner_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/hybridlimit/hybrid/envoyrls/runner"
)

// fixedWindow models how envoyproxy/ratelimit decides one descriptor: its
// Redis key ends with the start of the current window, now/unit*unit in
// Unix seconds (src/limiter/cache_key.go, GenerateCacheKey), every request
// adds its hits to that key with INCRBY (src/redis/fixed_cache_impl.go,
// DoLimit), and a request is over the limit when the count after it
// exceeds the limit (src/limiter/base_limiter.go,
// GetResponseDescriptorStatus). A new window starts from 0, whatever the
// last one spent.
type fixedWindow struct {
	limit, unit int64 // requests per unit; the unit in seconds
	counts      map[int64]int64
}

// allow reports whether the original admits a request at now.
func (f *fixedWindow) allow(now time.Time) bool {
	w := now.Unix() / f.unit * f.unit
	f.counts[w]++
	return f.counts[w] <= f.limit
}

// TestWindowEdge measures the window-edge case: a client sends N requests
// just before a minute boundary and N just after, 1.5 s later, against a
// limit of N a minute. The original's fixed window starts afresh at the
// boundary and admits 2N within those 1.5 s; the token bucket admits N,
// then what refilled in 1.5 s (N/60 a second). Redis's clock (miniredis)
// is set by the test: the Limiter's buckets take their time from Redis.
func TestWindowEdge(t *testing.T) {
	const n = 60
	before := time.Date(2026, 1, 1, 12, 0, 59, 0, time.UTC)
	after := before.Add(1500 * time.Millisecond) // 12:01:00.5
	refill := int(float64(n) / 60 * after.Sub(before).Seconds())

	fw := &fixedWindow{limit: n, unit: 60, counts: map[int64]int64{}}
	var orig [2]int
	for phase, at := range []time.Time{before, after} {
		for range n {
			if fw.allow(at) {
				orig[phase]++
			}
		}
	}
	if orig != [2]int{n, n} {
		t.Fatalf("fixed window model admitted %v, want %d and %d", orig, n, n)
	}
	t.Logf("limit %d a minute; %d requests at %s and %d at %s (Redis time)", n, n, before.Format("15:04:05.000"), n, after.Format("15:04:05.000"))
	t.Logf("%-34s %6s %6s %6s", "", "before", "after", "total")
	t.Logf("%-34s %6d %6d %6d", "fixed window (the original, model)", orig[0], orig[1], orig[0]+orig[1])

	for _, mode := range []string{"exact", "lease", "optimistic"} {
		m := miniredis.RunT(t)
		m.SetTime(before)
		yaml := fmt.Sprintf("domain: edge\ndescriptors:\n  - key: client\n    rate_limit: {unit: minute, requests_per_unit: %d, mode: %s}\n", n, mode)
		v := start(t, yaml, func(c *runner.Config) { c.Redis = runner.Redis{URL: m.Addr()} })
		var got [2]int
		for phase, at := range []time.Time{before, after} {
			m.SetTime(at)
			for range n {
				if v.call("edge", "client", "c1").GetOverallCode() == ok {
					got[phase]++
				}
			}
		}
		t.Logf("%-34s %6d %6d %6d", "hybrid-rls, "+mode, got[0], got[1], got[0]+got[1])
		switch {
		case got[0]+got[1] > n+refill:
			t.Errorf("%s: admitted %d, more than N + refill = %d", mode, got[0]+got[1], n+refill)
		case mode == "exact" && got != [2]int{n, refill}:
			t.Errorf("exact: admitted %v, want %d and %d", got, n, refill)
		case got[0] < n*9/10:
			t.Errorf("%s: admitted %d before the boundary, want about %d", mode, got[0], n)
		}
	}
}
