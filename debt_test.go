package hybrid_test

import (
	"testing"
	"time"

	"github.com/hybridlimit/hybrid"
)

// TestOutageDebt: FailOpen admits everything while Redis is down; when it
// is back, what it admitted is charged down to -max(B, R*MaxDebt). With a
// MaxDebt that covers the outage (the default, a minute), over a window
// that ends once the debt is repaid the instance has admitted at most B +
// R*T, and nothing was forgiven. With the burst alone, what the outage
// admitted beyond what the bucket held and the debt's bound is forgiven,
// at most A - B - D (A what the fallback admitted, D the debt's bound; the
// bucket held B), and the window admits that much more, as
// Stats().Reconcile.Forgiven tells and docs/accuracy.md bounds it.
func TestOutageDebt(t *testing.T) {
	const (
		rate  = 10
		burst = 10
		gap   = 10 * time.Millisecond // 100 requests a second, 10x the limit
	)
	lim := hybrid.Limit{Rate: rate, Burst: burst}
	for _, tt := range []struct {
		name    string
		maxDebt time.Duration
		debt    int64 // tokens: max(B, R*MaxDebt)
	}{
		{"the default, a minute", 0, rate * 60},
		{"the burst alone", time.Nanosecond, burst},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := hybrid.Config{Instances: 1, Fallback: hybrid.FailOpen, MaxDebt: tt.maxDebt}
			inFleet(t, 1, cfg, func(t *testing.T, f *fleet) {
				l := f.lims[0]
				start := time.Now()
				f.setDown(true)
				during := each(t, f, "k", lim, gap, time.Second, nil)[0]
				f.setDown(false)
				// Long enough for the debt to be repaid: FailOpen goes on
				// until the breaker closes and for two rounds after.
				after := each(t, f, "k", lim, gap, 40*time.Second, nil)[0]
				elapsed := time.Since(start)

				st := l.Stats()
				a := int64(st.FallbackAllowed)
				admitted := during.allowed + after.allowed
				bound := burst + rate*elapsed.Seconds()
				most := max(a-burst-tt.debt, 0) // the key was new: its bucket held B
				forgiven := float64(st.Reconcile.Forgiven) / 1e6
				t.Logf("MaxDebt %v: admitted %d over %v (%d by the fallback, %d during the outage), B + R*T %.0f, forgiven %.2f (at most %d)",
					tt.maxDebt, admitted, elapsed.Round(time.Millisecond), a, during.allowed, bound, forgiven, most)
				if a < 2*burst+tt.debt/10 {
					t.Fatalf("the fallback admitted %d: too few to check the debt's bound", a)
				}
				if forgiven > float64(most) || most > 0 && forgiven < float64(most)/2 {
					t.Errorf("Stats says %.2f tokens forgiven, want at most %d (and some, if that is above 0)", forgiven, most)
				}
				if float64(admitted) > bound+forgiven+1 {
					t.Errorf("admitted %d, above B + R*T %.0f + forgiven %.0f", admitted, bound, forgiven)
				}
				if float64(admitted) < 0.95*(bound+forgiven) {
					t.Errorf("admitted %d, want about B + R*T %.0f + forgiven %.0f: nothing more denied than the debt", admitted, bound, forgiven)
				}
			})
		})
	}
}
