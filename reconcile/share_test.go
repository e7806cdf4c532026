package reconcile_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

// TestTakers: a lease key's count of the instances that take it follows
// what its replies show the others took against what this instance took,
// a quarter of the way to each reading, within the live count; an instance
// whose replies find only its own doing counts itself alone.
func TestTakers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: time.Hour, Instances: 64})
		defer r.Close(context.Background())
		e := entry(r, "k", spec(t, 1e-6, 1000, reconcile.Lease))
		// fetch takes a token for this instance after others took n.
		fetch := func(others int64) {
			t.Helper()
			st.set(func(s *store) {
				if _, ok := s.tokens["k"]; ok {
					s.tokens["k"] -= others * M
				}
			})
			e.Allowance.TakeAll() // spent: the fetch asks for a token
			time.Sleep(time.Millisecond)
			if err := r.Fetch(context.Background(), e, M); err != nil {
				t.Fatal(err)
			}
		}
		fetch(0)
		if got := r.Takers(e); got != 1 {
			t.Fatalf("Takers = %d after a first reply that found the bucket full, want 1", got)
		}
		fetch(3)
		fetch(3)
		if got := r.Takers(e); got != 4 {
			t.Fatalf("Takers = %d after two replies that found 3 tokens taken by others for each of its own, want 4", got)
		}
		for range 12 {
			fetch(15)
		}
		if got := r.Takers(e); got < 14 || got > 16 {
			t.Fatalf("Takers = %d after replies that found 15 taken by others for each of its own, want about 16", got)
		}
		fetch(500)
		fetch(500)
		if got := r.Takers(e); got > 64 {
			t.Fatalf("Takers = %d, more than the live count 64", got)
		}
		for range 3 {
			fetch(0)
		}
		if got := r.Takers(e); got != 1 {
			t.Fatalf("Takers = %d after replies that found nobody else's take, want 1", got)
		}
	})
}

// TestLeaseCap: an instance alone holds up to LocalCapacity; one that
// shares a key holds two turns, a turn being turnTime's refill or, for a
// fleet whose leases would then hold more than half the burst, its share
// of half the burst, rounded up to a token.
func TestLeaseCap(t *testing.T) {
	for _, c := range []struct {
		instances   int
		rate        float64
		burst, want int64 // tokens
	}{
		{1, 20000, 20000, 4096},
		{8, 20000, 20000, 2 * 40},    // turnTime's refill: 40
		{256, 20000, 20000, 2 * 40},  // B/2N = 39.06, rounded up
		{1024, 20000, 20000, 2 * 10}, // B/2N = 9.8
		{4096, 20000, 20000, 2 * 3},  // B/2N = 2.4
		{64, 10, 20, 2},              // a token at least
	} {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{Instances: c.instances})
		e := entry(r, "k", spec(t, c.rate, c.burst, reconcile.Lease))
		if got := r.LeaseCap(e, e.X.Spec()) / M; got != c.want {
			t.Errorf("%d instances, %v/s burst %d: LeaseCap = %d tokens, want %d", c.instances, c.rate, c.burst, got, c.want)
		}
		r.Close(context.Background())
	}
}

// TestDueTurn: a lease key that N instances take waits for its share of
// the refill, 1/N of it, to bring a turn (its lease, at most half its
// cap) beyond what its view shows the bucket holding: from half to one and
// a half times N turns' refill; one alone waits for what it needs.
func TestDueTurn(t *testing.T) {
	st := newStore()
	r := newReconciler(t, st, reconcile.Config{Instances: 256})
	defer r.Close(context.Background())
	sp := spec(t, 20000, 20000, reconcile.Lease)
	e := entry(r, "k", sp)
	e.X.SetSpec(sp)
	turn := min(r.LeaseCap(e, sp)/2, r.LeaseSize(e, sp))
	for seen := time.Duration(1); seen < 100*time.Millisecond; seen += 7 * time.Millisecond {
		v := local.View{Tokens: 0, Seen: seen}
		due := r.Due(e, sp, v, M)
		if lo, hi := 256*turn/2, 256*turn*3/2; due < lo || due > hi {
			t.Fatalf("Due = %d tokens from an empty bucket, want within [%d, %d]", due/M, lo/M, hi/M)
		}
		if due := r.Due(e, sp, local.View{Tokens: 2 * turn, Seen: seen}, M); due > 2*turn {
			t.Fatalf("Due = %d tokens from a bucket that holds two turns, want what it holds at most", due/M)
		}
	}
	one := newReconciler(t, newStore(), reconcile.Config{Instances: 1})
	defer one.Close(context.Background())
	e1 := entry(one, "k", sp)
	if due := one.Due(e1, sp, local.View{Seen: 1}, M); due > 20*M {
		t.Fatalf("Due = %d tokens for an instance alone, want at most a millisecond's refill", due/M)
	}
}

// TestSettleDue: a round settles an optimistic key in use when its turn
// comes (N turnTimes after its last reply), not at every round, nor
// sooner when half its budget cap is spent unsettled or its bucket is full
// as far as its view tells: a settlement before its turn would renew its
// budget by its share of what the bucket holds.
func TestSettleDue(t *testing.T) {
	st := newStore()
	r := newReconciler(t, st, reconcile.Config{Instances: 256})
	defer r.Close(context.Background())
	sp := spec(t, 20000, 20000, reconcile.Optimistic)
	e := entry(r, "k", sp)
	if !reconcile.SettleDue(r, e, sp, time.Second) {
		t.Fatal("a key with no view is not due")
	}
	seen := time.Second
	e.SetView(local.View{Tokens: 1000 * M, Seen: seen})
	turn := 256 * reconcile.TurnTime
	if reconcile.SettleDue(r, e, sp, seen+turn/2) {
		t.Fatal("due half a turn after its last reply, with nothing spent")
	}
	if !reconcile.SettleDue(r, e, sp, seen+turn) {
		t.Fatal("not due a turn after its last reply")
	}
	e.Pending.Add(r.Cap(sp) / 2)
	e.Allowance.Update(func(int64) int64 { return M })
	if reconcile.SettleDue(r, e, sp, seen+time.Millisecond) {
		t.Fatal("due before its turn with half its cap spent unsettled")
	}
	e.SetView(local.View{Tokens: 20000*M - 10*M, Seen: seen})
	if reconcile.SettleDue(r, e, sp, seen+time.Millisecond) {
		t.Fatal("due before its turn with its bucket full as its view tells")
	}
}

// TestSettleHeld: an optimistic key that a round held for a later one,
// not due, is settled once it is due, whether its instance asked for it
// meanwhile or not; not by the first round that finds it untouched.
func TestSettleHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{Instances: 256, SyncInterval: 100 * time.Millisecond})
		defer r.Close(ctx)
		sp := spec(t, 20000, 20000, reconcile.Optimistic)
		st.set(func(s *store) { s.tokens["k"] = 20000*M - 100*M }) // others take it
		e := entry(r, "k", sp)
		time.Sleep(time.Millisecond) // a view seen at 0 is none
		if err := r.Fetch(ctx, e, M); err != nil {
			t.Fatal(err)
		}
		e.Pending.Add(M) // spent, to charge
		before, _ := st.counts()
		turn := 256 * reconcile.TurnTime
		time.Sleep(turn - time.Millisecond) // rounds that find it touched once, then untouched
		synctest.Wait()
		if after, _ := st.counts(); after != before {
			t.Fatalf("%d Settle calls before the key's turn", after-before)
		}
		if e.Pending.Load() != M {
			t.Fatalf("pending %d before the key's turn, want %d", e.Pending.Load(), M)
		}
		time.Sleep(2 * 100 * time.Millisecond) // its turn, then a round
		synctest.Wait()
		if e.Pending.Load() != 0 {
			t.Fatalf("pending %d after the key's turn, want 0: not settled", e.Pending.Load())
		}
		if got, _ := st.get("k"); got != 20000*M-101*M {
			t.Fatalf("the bucket holds %d after the key's turn, want %d", got, 20000*M-101*M)
		}
	})
}
