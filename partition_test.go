package hybrid_test

import (
	"testing"
	"time"

	"github.com/hybridlimit/hybrid"
)

// TestPartitionQuarter: a quarter of a fleet of 8 loses Redis for 2 s while
// the rest still reaches it, one lease key at 4x its limit (R=100/s,
// B=100). The cut instances decide by the fallback (their shares, R/N
// each), the others by Redis alone; once the link is back the fallback's
// admissions are charged, as debt, and over a window that ends once that
// debt is repaid the fleet admits at most B + R*T. On miniredis in a
// synctest bubble.
func TestPartitionQuarter(t *testing.T) {
	const (
		n      = 8
		cut    = n / 4
		rate   = 100
		burst  = 100
		gap    = 20 * time.Millisecond // each instance asks for 50/s: 4x its share
		before = 2 * time.Second
		outage = 2 * time.Second
		after  = 3 * time.Second // the debt, at most the cut's shares, is repaid within a second
	)
	lim := hybrid.Limit{Rate: rate, Burst: burst}
	inFleet(t, n, hybrid.Config{}, func(t *testing.T, f *fleet) {
		settle(time.Second) // heartbeats: every instance counts the fleet
		start := time.Now()
		var admitted int64
		phase := func(name string, d time.Duration) []window {
			ws := each(t, f, "hot", lim, gap, d, nil)
			for _, w := range ws {
				admitted += w.allowed
			}
			return ws
		}
		phase("before", before)
		for _, ln := range f.links[:cut] {
			ln.down.Store(true)
		}
		ws := phase("partition", outage)
		for i, w := range ws {
			fb := w.bySource[hybrid.SourceFallback]
			switch {
			case i < cut && fb == 0:
				t.Errorf("instance %d, cut from Redis: no decision by the fallback (%+v)", i, w)
			case i >= cut && fb > 0:
				t.Errorf("instance %d, which reaches Redis: %d admitted by the fallback", i, fb)
			}
		}
		var byFallback int64
		for _, w := range ws[:cut] {
			byFallback += w.bySource[hybrid.SourceFallback]
		}
		for _, ln := range f.links[:cut] {
			ln.down.Store(false)
		}
		phase("healed", after)
		elapsed := time.Since(start)
		bound := burst + rate*elapsed.Seconds()
		t.Logf("admitted %d over %v, %d of them by the cut instances' fallback; B + R*T %.0f", admitted, elapsed, byFallback, bound)
		if byFallback == 0 {
			t.Fatal("the fallback admitted nothing: no partition to test")
		}
		if float64(admitted) > bound {
			t.Errorf("admitted %d over %v, above B + R*T %.0f: the fallback's admissions were not charged", admitted, elapsed, bound)
		}
		if float64(admitted) < 0.9*bound {
			t.Errorf("admitted %d over %v, under 90%% of B + R*T %.0f", admitted, elapsed, bound)
		}
		for i, l := range f.lims {
			if s := l.Stats(); s.Degraded {
				t.Errorf("instance %d still degraded %v after the link came back", i, after)
			}
		}
	})
}
