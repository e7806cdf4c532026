package reconcile_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hybridlimit/hybrid/reconcile"
)

// TestAskers: an instance whose fetches find the bucket as its last reply
// left it, refilled, counts itself alone on the key, and so does one whose
// first reply finds the bucket full; another instance's take seen twice in
// a row makes it count the fleet again, and once (its own calls crossing,
// say) does not. A first reply that finds the bucket short of full counts
// the fleet.
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
		want(1, "after a first reply that found the bucket full")
		other := func() { st.set(func(s *store) { s.tokens["k"] -= M }) }
		other()
		fetch()
		other()
		fetch()
		want(4, "after two replies in a row that found another's take")
		fetch()
		want(1, "after a reply that found what the last one left")
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

		// A bucket that another instance took from before this one's
		// first reply.
		j := entry(r, "j", spec(t, 1e-6, 1000, reconcile.Lease))
		st.set(func(s *store) { s.tokens["j"] = 1000*M - M })
		if err := r.Fetch(context.Background(), j, M); err != nil {
			t.Fatal(err)
		}
		if got := r.Askers(j); got != 4 {
			t.Fatalf("Askers = %d after a first reply that found the bucket short of full, want 4", got)
		}
	})
}

// TestAskersOptimistic: an optimistic key whose replies found another
// instance's write counts itself alone again only after a quiet spell,
// however clean its replies are meanwhile: the others may hold budget they
// spend and charge later, which a grant to an instance alone would take.
// Two replies that find another's write within the spell end its being
// alone, in a row or not (a storm's instances charge between some of its
// replies, not all).
// A limit of one micro-token a second, in a fleet of 4: the spell is its
// longest, a minute.
func TestAskersOptimistic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore() // no refill: fetch adds what the limit refills
		r := newReconciler(t, st, reconcile.Config{SyncInterval: time.Hour, Instances: 4})
		defer r.Close(context.Background())
		e := entry(r, "o", spec(t, 1e-6, 1000, reconcile.Optimistic))
		fetch := func(d time.Duration) {
			t.Helper()
			time.Sleep(d)
			st.set(func(s *store) {
				if tk, ok := s.tokens["o"]; ok {
					s.tokens["o"] = min(tk+int64(d/time.Second), 1000*M)
				}
			})
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
		other := func() { st.set(func(s *store) { s.tokens["o"] -= M }) }
		fetch(time.Millisecond)
		want(1, "after a first reply that found the bucket full")
		other()
		fetch(time.Millisecond)
		other()
		fetch(time.Millisecond)
		want(4, "after two replies in a row that found another's take")
		for range 3 {
			fetch(10 * time.Second)
			want(4, "after a clean reply within a minute of another's take")
		}
		fetch(31 * time.Second)
		want(1, "after a clean reply a minute after another's take")
		other()
		fetch(time.Millisecond)
		want(1, "after one reply that found another's take")
		fetch(time.Millisecond)
		want(1, "after a clean reply")
		other()
		fetch(time.Millisecond)
		want(4, "after two replies that found another's take within a minute, not in a row")
	})
}
