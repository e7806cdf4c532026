package hybrid_test

import (
	"context"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid"
)

// TestRedisFullShare: on a full Redis the calls that write nothing still
// succeed, so a node's breaker may stay closed, or close and open again,
// while the charges of what its fallback admitted are refused, and the
// key's view stays where it was before Redis filled up. A share started
// anew from that view (a second after the key's last fallback decision)
// must not give out what the earlier share gave and Redis has not
// charged. One instance, an Exact key "a" with 4 of its burst 10 taken
// (and a key "z" drained), Redis filled, and then "a" asked for 3.5 s, each
// request followed by 10 peeks of "z", reads that a full Redis answers, so
// that the breaker stays closed: "a" admits at most B + R*T. Before a Lease
// or Exact key's share counted its unsettled admissions, "a" admitted its
// view's share again each second: 28 of a bound of 10.06, in 3 runs of 4
// (the fourth's breaker opened, and an open breaker keeps its stretch).
func TestRedisFullShare(t *testing.T) {
	srv, admin := faultServer(t)
	f, _, _ := fullFleet(t, srv.Addr(), 1, "share")
	l := f[0].lim
	ctx := context.Background()
	lim := hybrid.Limit{Rate: 1.0 / 60, Burst: 10, Mode: hybrid.Exact}
	start := time.Now()
	var admitted int
	ask := func(key string) hybrid.Result {
		t.Helper()
		res, err := l.Allow(ctx, key, lim)
		if err != nil {
			t.Fatalf("Allow %s: %v", key, err)
		}
		if key == "a" && res.Allowed {
			admitted++
		}
		return res
	}
	for range lim.Burst {
		ask("z")
	}
	if res := ask("z"); res.Allowed {
		t.Fatalf("z admitted beyond its burst on a healthy Redis")
	}
	for range 4 {
		ask("a")
	}
	if admitted != 4 {
		t.Fatalf("a admitted %d of 4 on a healthy Redis", admitted)
	}
	fillRedis(t, admin)
	var fallback, transitions int
	for time.Since(start) < 3500*time.Millisecond {
		if res := ask("a"); res.Source == hybrid.SourceFallback {
			fallback++
		}
		for range 10 { // reads, which a full Redis answers: the breaker stays closed
			if _, err := l.Peek(ctx, "z", lim, 1); err != nil {
				t.Fatalf("Peek z: %v", err)
			}
		}
		time.Sleep(time.Millisecond) // a request's pace, not a synchronisation
	}
	transitions = f[0].states.len()
	bound := float64(lim.Burst) + lim.Rate*time.Since(start).Seconds()
	t.Logf("a admitted %d over %v (bound %.2f); %d fallback decisions of a, %d breaker transitions, breaker %v",
		admitted, time.Since(start).Round(time.Millisecond), bound, fallback, transitions, l.Stats().Reconcile.Breaker)
	if fallback == 0 {
		t.Fatalf("no fallback decision of a: Redis did not refuse its charges")
	}
	if float64(admitted) > bound {
		t.Errorf("a admitted %d over the run, want at most B + R*T = %.2f: a share gave out again what Redis had not charged", admitted, bound)
	}
}
