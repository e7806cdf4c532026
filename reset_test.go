package hybrid_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid"
)

// TestReset: a fleet of 4 drains a key; a Reset from one instance makes the
// bucket full again for every instance, within a heartbeat: the fleet admits
// the burst again, each instance some of it, though each had a view of the
// empty bucket. What the fleet spent before the reset and had not charged
// yet takes from the new bucket and never sinks it. Every mode.
func TestReset(t *testing.T) {
	for _, mode := range []hybrid.Mode{hybrid.Lease, hybrid.Optimistic, hybrid.Exact} {
		t.Run(mode.String(), func(t *testing.T) {
			lim := hybrid.Limit{Rate: slow, Burst: 8, Mode: mode}
			inFleet(t, 4, hybrid.Config{}, func(t *testing.T, f *fleet) {
				ctx := context.Background()
				// ask asks each instance in turn, rounds times, a round
				// apart, and returns what each admitted.
				ask := func(key string, rounds int) (admitted [4]int) {
					for range rounds {
						for i, l := range f.lims {
							if res, err := l.Allow(ctx, key, lim); err == nil && res.Allowed {
								admitted[i]++
							}
						}
						settle(interval)
					}
					return admitted
				}
				sum := func(a [4]int) int { return a[0] + a[1] + a[2] + a[3] }

				// Settled before the reset: the fleet admits the burst
				// again, every instance some of it.
				if got := sum(ask("k", 10)); got < 8 {
					t.Fatalf("before the reset the fleet admitted %d, want the burst, 8", got)
				}
				settle(5 * interval)
				if got := sum(ask("k", 2)); got != 0 {
					t.Fatalf("the drained key admitted %d more", got)
				}
				if err := f.lims[0].Reset(ctx, "k"); err != nil {
					t.Fatalf("Reset = %v", err)
				}
				settle(time.Second + interval) // a heartbeat tells the others
				after := ask("k", 10)
				t.Logf("after the reset each instance admitted %v", after)
				if got := sum(after); got < 8 || got > 8+int(f.lims[0].Overshoot(lim)) {
					t.Errorf("after the reset the fleet admitted %d, want the burst, 8", got)
				}
				for i, n := range after {
					if n == 0 {
						t.Errorf("instance %d admitted nothing after the reset: the bucket is not full for it", i)
					}
				}

				// Spent and not charged at the reset: the charges come
				// within the grace and take from the new bucket, to 0 at
				// most.
				spent := 0
				for _, l := range f.lims { // no round between: an optimistic budget's spending is not charged yet
					if res, err := l.Allow(ctx, "u", lim); err == nil && res.Allowed {
						spent++
					}
				}
				if err := f.lims[1].Reset(ctx, "u"); err != nil {
					t.Fatalf("Reset = %v", err)
				}
				settle(time.Second + 5*interval)
				held := min(tokensIn(t, f.m, "u"), lim.Burst*micro) // a reset writes more, which every read caps
				if held < 0 {
					t.Errorf("%d admitted before the reset were charged into debt: the bucket holds %d micro-tokens", spent, held)
				}
				got := sum(ask("u", 10))
				t.Logf("a key that spent %d before its reset: the bucket held %d micro-tokens once the rounds had charged what they owed, and the fleet admitted %d after", spent, held, got)
				if got < 8-spent || got > 8 {
					t.Errorf("after the reset of a key that spent %d not yet charged, the fleet admitted %d, want %d to 8", spent, got, 8-spent)
				}
			})
		})
	}
}

// TestResetDown: a reset while Redis is down is an error, never a silent
// no-op, in a fleet of 4 and every mode; once Redis is back it resets.
func TestResetDown(t *testing.T) {
	for _, mode := range []hybrid.Mode{hybrid.Lease, hybrid.Optimistic, hybrid.Exact} {
		t.Run(mode.String(), func(t *testing.T) {
			inFleet(t, 4, hybrid.Config{}, func(t *testing.T, f *fleet) {
				ctx := context.Background()
				l := f.lims[0]
				lim := hybrid.Limit{Rate: slow, Burst: 2, Mode: mode}
				f.setDown(true)
				for range 20 { // the breakers open
					for _, l := range f.lims {
						l.Allow(ctx, "k", lim)
					}
					settle(interval)
				}
				if err := l.Reset(ctx, "k"); !errors.Is(err, hybrid.ErrUnavailable) {
					t.Errorf("Reset with Redis down = %v, want ErrUnavailable", err)
				}
				if err := l.Reset(ctx, ""); !errors.Is(err, hybrid.ErrInvalidKey) {
					t.Errorf("Reset of an empty key = %v, want ErrInvalidKey", err)
				}
				f.setDown(false)
				settle(2*openTimeout + 3*interval)
				if err := l.Reset(ctx, "k"); err != nil {
					t.Errorf("Reset with Redis back = %v", err)
				}
				if err := l.Close(ctx); err != nil {
					t.Fatal(err)
				}
				if err := l.Reset(ctx, "k"); !errors.Is(err, hybrid.ErrClosed) {
					t.Errorf("Reset after Close = %v, want ErrClosed", err)
				}
			})
		})
	}
}
