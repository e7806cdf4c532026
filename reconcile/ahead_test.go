package reconcile_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hybridlimit/hybrid/reconcile"
)

// TestAhead: a lease key that others take too, in a fleet large enough
// for its burst that its turns are shares of the burst, whose bucket its
// last reply found short of a turn for each instance, takes its next turn
// ahead: one
// unnumbered charge of a whole turn that sinks the bucket into debt and
// grants nothing, spendable here once the refill has paid the debt and not
// before. A turn not yet due goes back when the key leaves.
func TestAhead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: time.Hour, Instances: 4})
		// 100,000/s burst 1,000: a turn is four fifths of a share of the
		// burst, 200 tokens (4 ms of refill, 400, is more); ahead below 4
		// turns, 800 tokens.
		sp := spec(t, 100000, 1000, reconcile.Lease)
		e := entry(r, "k", sp)
		fetch := func(others int64) { t.Helper(); fetchAfter(t, st, r, e, others) }
		fetch(0)
		fetch(3)
		fetch(3)
		if n := r.Takers(e); n < 2 {
			t.Fatalf("Takers = %d after replies that found others' takes, want more than 1", n)
		}
		if r.Ahead(e, sp) {
			t.Fatalf("Ahead with a bucket of %d tokens, want not (it holds a turn for each of 4)", e.View().Tokens/M)
		}
		st.set(func(s *store) { s.tokens["k"] = 700 * M }) // less than 4 turns
		fetch(0)
		if !r.Ahead(e, sp) {
			t.Fatalf("not Ahead with a bucket of %d tokens, want ahead (less than a turn for each of 4)", e.View().Tokens/M)
		}

		// The turn, taken ahead of a bucket that holds 1 token.
		st.set(func(s *store) { s.tokens["k"] = M })
		seqs := len(st.seqs["k"])
		fetch(0)
		if got, _ := st.get("k"); got != -199*M {
			t.Fatalf("bucket %d micro-tokens after the turn, want -199 tokens (200 charged of 1)", got)
		}
		if n := len(st.seqs["k"]) - seqs; n != 0 {
			t.Errorf("the turn was sent with %d seqs, want none", n)
		}
		if got := e.Allowance.Load(); got != 0 {
			t.Fatalf("allowance %d before the turn is due, want 0", got)
		}
		wait, ok := r.Reserved(e, r.Clock().Now())
		if due := 1990 * time.Microsecond; !ok || wait < due || wait > due+2*time.Microsecond {
			t.Fatalf("Reserved = %v, %v; want due in %v (199 tokens of debt at 100,000/s)", wait, ok, due)
		}
		time.Sleep(wait - time.Microsecond)
		if wait, ok := r.Reserved(e, r.Clock().Now()); !ok || wait <= 0 {
			t.Fatalf("Reserved = %v, %v a microsecond before the turn is due, want a wait", wait, ok)
		}
		if got := e.Allowance.Load(); got != 0 {
			t.Fatalf("allowance %d before the turn is due, want 0", got)
		}
		time.Sleep(time.Microsecond)
		if wait, ok := r.Reserved(e, r.Clock().Now()); !ok || wait != 0 {
			t.Fatalf("Reserved = %v, %v once due, want 0, true", wait, ok)
		}
		if got := e.Allowance.Load(); got != 200*M {
			t.Fatalf("allowance %d once the turn is due, want 200 tokens", got)
		}
		if _, ok := r.Reserved(e, r.Clock().Now()); ok {
			t.Fatal("Reserved after the turn was claimed: still one")
		}

		// A turn not yet due goes back with the key.
		e.Allowance.TakeAll()
		st.set(func(s *store) { s.tokens["k"] = 0 })
		fetch(0)
		if got, _ := st.get("k"); got != -200*M {
			t.Fatalf("bucket %d micro-tokens after a second turn, want -200 tokens", got)
		}
		if err := r.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got, _ := st.get("k"); got != 0 {
			t.Fatalf("bucket %d micro-tokens after Close, want 0: the turn not due goes back", got)
		}
	})
}

// TestAheadPartOfFleet: a key that a few instances of a large fleet take,
// whose turns the fleet's count would make a token, is fetched in turns
// sized by its takers, not taken ahead.
func TestAheadPartOfFleet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: time.Hour, Instances: 1024})
		defer r.Close(context.Background())
		// 20,000/s burst 1,000: the fleet's turn is a token (four fifths
		// of 1,000/1,024), a few takers' 17 or more (B/2n for 30 takers or
		// fewer, at most 2 ms of refill, 40).
		sp := spec(t, 20000, 1000, reconcile.Lease)
		e := entry(r, "k", sp)
		fetch := func(others int64) { t.Helper(); fetchAfter(t, st, r, e, others) }
		fetch(0)
		for range 8 {
			fetch(4)
		}
		if n := r.Takers(e); n < 2 || n > 30 {
			t.Fatalf("Takers = %d after replies that found 4 taken by others for each of its own, want a few (2 to 30: turns of 17 tokens or more)", n)
		}
		st.set(func(s *store) { s.tokens["k"] = 0 })
		fetch(0)
		if r.Ahead(e, sp) {
			t.Fatalf("Ahead for a key that %d of 1,024 instances take, want its turns sized by its takers", r.Takers(e))
		}
	})
}

// TestAheadNotCrowded: a key whose fleet is small for its burst, whose
// turns are 2 ms of refill (not shares of the burst), is fetched in its
// turns, never taken ahead, however empty its bucket.
func TestAheadNotCrowded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: time.Hour, Instances: 4})
		defer r.Close(context.Background())
		sp := spec(t, 1000, 100, reconcile.Lease) // a fifth of the burst each, 20 tokens: 4 ms of refill is 4
		e := entry(r, "k", sp)
		for _, others := range []int64{0, 3, 3} {
			fetchAfter(t, st, r, e, others)
		}
		st.set(func(s *store) { s.tokens["k"] = 0 })
		fetchAfter(t, st, r, e, 0)
		if n := r.Takers(e); n < 2 {
			t.Fatalf("Takers = %d, want more than 1", n)
		}
		if r.Ahead(e, sp) {
			t.Fatalf("Ahead with a bucket of %d tokens in a fleet of 4 of a burst of 100, want its turns fetched in turn", e.View().Tokens/M)
		}
	})
}

// fetchAfter has e, whose lease was spent, fetch a token of its key "k" a
// millisecond on, after the other instances took others tokens of the
// bucket (down to an empty one), if it exists.
func fetchAfter(t *testing.T, st *store, r *reconcile.Reconciler, e *reconcile.Entry, others int64) {
	t.Helper()
	st.set(func(s *store) {
		if _, ok := s.tokens["k"]; ok {
			s.tokens["k"] = max(s.tokens["k"]-others*M, min(s.tokens["k"], 0))
		}
	})
	e.Allowance.TakeAll()
	time.Sleep(time.Millisecond)
	if err := r.Fetch(context.Background(), e, M); err != nil {
		t.Fatal(err)
	}
}
