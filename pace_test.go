package hybrid_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/hybridlimit/hybrid"
)

// TestRefillPace: one key of 1,000/s, burst 1,000, asked for at twice its
// rate for 10 simulated seconds by 1 and by 3 instances, in lease and
// optimistic mode, at the default RefillPace and at 50ms. Every run admits
// at most its bound (B + R*T, and the mode's overshoot for optimistic) and
// nearly all of B + R*T; at 50ms the fleet's Redis commands are a fraction
// of the default's, since a saturated key asks for 50ms of its refill at
// once rather than 1ms.
func TestRefillPace(t *testing.T) {
	for _, mode := range []hybrid.Mode{hybrid.Lease, hybrid.Optimistic} {
		t.Run(mode.String(), func(t *testing.T) { refillPace(t, mode) })
	}
}

// refillPace is TestRefillPace in one mode.
func refillPace(t *testing.T, mode hybrid.Mode) {
	const (
		rate  = 1000
		burst = 1000
		d     = 10 * time.Second
	)
	lim := hybrid.Limit{Rate: rate, Burst: burst, Mode: mode}
	ideal := float64(burst + rate*d.Seconds())
	for _, n := range []int{1, 3} {
		commands := map[time.Duration]int64{}
		for _, pace := range []time.Duration{0, 50 * time.Millisecond} {
			m := miniredis.RunT(t)
			synctest.Test(t, func(t *testing.T) {
				f := newFleet(t, m, n, hybrid.Config{RefillPace: pace})
				time.Sleep(time.Second) // heartbeats: every instance counts the fleet
				start := f.commands()
				var c tally
				gap := time.Second * time.Duration(n) / (2 * rate) // twice the limit over the fleet
				drive(f, "hot", lim, gap, d, &c, nil)
				c.check(t)
				noFaults(t, f)
				commands[pace] = f.commands() - start
				got := float64(c.allowed.Load())
				t.Logf("%d instances, RefillPace %v: admitted %v of %v requests, %.2f%% of B+R*T %v; %d Redis commands (%.1f a second)",
					n, pace, got, c.allowed.Load()+c.denied.Load(), 100*got/ideal, ideal, commands[pace], float64(commands[pace])/d.Seconds())
				if bound := ideal + float64(f.lims[0].Overshoot(lim)); got > bound {
					t.Errorf("%d instances, RefillPace %v: admitted %v, more than its bound %v", n, pace, got, bound)
				}
				if got < 0.95*ideal {
					t.Errorf("%d instances, RefillPace %v: admitted %v, less than 95%% of B+R*T %v", n, pace, got, ideal)
				}
				f.close(t)
			})
		}
		if slow, fast := commands[50*time.Millisecond], commands[0]; slow*5 > fast {
			t.Errorf("%d instances: %d Redis commands at a RefillPace of 50ms, %d at the default: want at most a fifth", n, slow, fast)
		}
	}
}
