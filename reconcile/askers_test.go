package reconcile_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hybridlimit/hybrid/reconcile"
)

// TestAskers: an instance whose fetches find the bucket as its last reply
// left it, refilled, counts itself alone on the key; another instance's
// take seen twice in a row makes it count the fleet again, and once (its
// own calls crossing, say) does not.
func TestAskers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore() // a bucket that never refills: a limit of one micro-token a second refills none in 1 ms
		r := newReconciler(t, st, reconcile.Config{SyncInterval: time.Hour, Instances: 4})
		defer r.Close(context.Background())
		e := entry(r, "k", spec(t, 1e-6, 1000, reconcile.Lease))
		fetch := func() {
			t.Helper()
			time.Sleep(time.Millisecond)
			if err := r.Fetch(context.Background(), e, M); err != nil {
				t.Fatal(err)
			}
		}
		want := func(n int64, why string) {
			t.Helper()
			if got := r.Askers(e); got != n {
				t.Fatalf("Askers = %d %s, want %d", got, why, n)
			}
		}
		fetch()
		want(4, "after the first reply (nothing to compare)")
		fetch()
		want(1, "after a reply that found what the last one left")
		other := func() { st.set(func(s *store) { s.tokens["k"] -= M }) }
		other()
		fetch()
		want(1, "after one reply that found another's take")
		fetch()
		want(1, "after a reply that found what the last one left")
		other()
		fetch()
		other()
		fetch()
		want(4, "after two replies in a row that found another's take")
		fetch()
		want(1, "after a reply that found what the last one left")
	})
}
