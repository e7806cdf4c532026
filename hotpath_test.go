package hybrid_test

import (
	"context"
	"testing"

	"github.com/hybridlimit/hybrid"
)

// TestHotPath: every entry point, a Handle's too, decides a key this
// instance holds allowance for on the one hot path: from the allowance
// (SourceLocal), with no allocation but what the caller keeps (AllowAll: its
// Decision's Results; Reserve: the Reservation and its cancel channel), in
// lease and optimistic modes. BenchmarkAllow times it against x/time/rate.
func TestHotPath(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	inFleet(t, 1, hybrid.Config{LocalCapacity: 1 << 30}, func(t *testing.T, f *fleet) {
		l := f.lims[0]
		for _, mode := range []hybrid.Mode{hybrid.Lease, hybrid.Optimistic} {
			lim := hybrid.Limit{Rate: 1e9, Burst: 1e9, Mode: mode}
			key := "hot-" + mode.String()
			checks := []hybrid.Check{{Key: key, Limit: lim}, {Key: key + "-2", Limit: lim}}
			// The first decisions fetch the leases or the budgets, which
			// grow with the keys' demand (in fake time, all at one instant).
			settle(interval)
			for range 5000 {
				if _, err := l.AllowAll(context.Background(), checks...); err != nil {
					t.Fatal(err)
				}
			}
			hotPath(t, l, mode, key, lim, checks)
		}
	})
}

// hotPath checks that every entry point decides key, and AllowAll checks,
// on the hot path.
func hotPath(t *testing.T, l *hybrid.Limiter, mode hybrid.Mode, key string, lim hybrid.Limit, checks []hybrid.Check) {
	t.Helper()
	ctx := context.Background()
	h, err := l.Handle(key, lim)
	if err != nil {
		t.Fatal(err)
	}
	entries := []struct {
		name   string
		allocs float64
		call   func() (hybrid.Result, error)
	}{
		{"Allow", 0, func() (hybrid.Result, error) { return l.Allow(ctx, key, lim) }},
		{"AllowN", 0, func() (hybrid.Result, error) { return l.AllowN(ctx, key, lim, 3) }},
		{"Handle.Allow", 0, func() (hybrid.Result, error) { return h.Allow(ctx) }},
		{"Handle.AllowN", 0, func() (hybrid.Result, error) { return h.AllowN(ctx, 2) }},
		{"Wait", 0, func() (hybrid.Result, error) {
			return hybrid.Result{Allowed: true, Source: hybrid.SourceLocal}, l.Wait(ctx, key, lim)
		}},
		{"AllowAll", 1, func() (hybrid.Result, error) {
			d, err := l.AllowAll(ctx, checks...)
			return d.Result(), err
		}},
		{"Reserve", 2, func() (hybrid.Result, error) {
			r, err := l.Reserve(ctx, key, lim, 1)
			if err != nil {
				return hybrid.Result{}, err
			}
			return r.Result(), nil
		}},
	}
	for _, ep := range entries {
		var bad string
		got := testing.AllocsPerRun(100, func() {
			res, err := ep.call()
			if err != nil || !res.Allowed || res.Source != hybrid.SourceLocal {
				bad = res.Source.String()
			}
		})
		if bad != "" {
			t.Errorf("%v %s: a decision not allowed from the allowance (source %s)", mode, ep.name, bad)
		}
		if got > ep.allocs {
			t.Errorf("%v %s: %.1f allocations a decision, want %.0f", mode, ep.name, got, ep.allocs)
		}
	}
}
