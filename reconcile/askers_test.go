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
		p := newAskersProbe(t, "k", reconcile.Lease)
		defer p.r.Close(context.Background())
		fetch := func() { p.fetch(time.Millisecond) }
		want, other, st, r := p.want, p.other, p.st, p.r
		fetch()
		want(1, "after a first reply that found the bucket full")
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
		p := newAskersProbe(t, "o", reconcile.Optimistic)
		defer p.r.Close(context.Background())
		fetch, want, other := p.fetch, p.want, p.other
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

// askersProbe is one key of a fleet of 4 whose limit, a micro-token a
// second, the test store (which refills nothing) is refilled by hand: a
// fetch after a sleep finds what that refill brings and no more.
type askersProbe struct {
	t   *testing.T
	st  *store
	r   *reconcile.Reconciler
	e   *reconcile.Entry
	key string
}

func newAskersProbe(t *testing.T, key string, mode reconcile.Mode) *askersProbe {
	st := newStore()
	r := newReconciler(t, st, reconcile.Config{SyncInterval: time.Hour, Instances: 4})
	return &askersProbe{t: t, st: st, r: r, e: entry(r, key, spec(t, 1e-6, 1000, mode)), key: key}
}

// fetch sleeps d, refills the bucket for d, and fetches the key.
func (p *askersProbe) fetch(d time.Duration) {
	p.t.Helper()
	time.Sleep(d)
	p.st.set(func(s *store) {
		if tk, ok := s.tokens[p.key]; ok {
			s.tokens[p.key] = min(tk+int64(d/time.Second), 1000*M)
		}
	})
	if err := p.r.Fetch(context.Background(), p.e, M); err != nil {
		p.t.Fatal(err)
	}
}

// other takes a token out of the bucket, as another instance would.
func (p *askersProbe) other() { p.st.set(func(s *store) { s.tokens[p.key] -= M }) }

// want checks that Askers counts n for the key.
func (p *askersProbe) want(n int64, why string) {
	p.t.Helper()
	if got := p.r.Askers(p.e); got != n {
		p.t.Fatalf("Askers = %d %s, want %d", got, why, n)
	}
}
