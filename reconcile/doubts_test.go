package reconcile_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

// Settlements in doubt: a reply lost after Redis may have applied the
// settlement is sent again as it was, and Redis applies it once.

// TestLostReplyGivesBackOnce: a settlement whose reply is lost (a timeout
// after Redis applied it) must not give a lease back twice: the give-back is
// not put back into the entry, and Redis ends with the lease exactly once.
func TestLostReplyGivesBackOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: 100 * time.Millisecond})
		defer r.Close(context.Background())
		sp := spec(t, 10, 100, reconcile.Lease)
		e := entry(r, "k", sp)
		if err := r.Fetch(context.Background(), e, M); err != nil {
			t.Fatal(err)
		}
		lease := e.Allowance.Load()
		st.set(func(s *store) { s.lost = context.DeadlineExceeded })
		time.Sleep(250 * time.Millisecond) // untouched for a round: the lease goes back, and the reply is lost
		synctest.Wait()
		st.set(func(s *store) { s.lost = nil })
		time.Sleep(time.Second)
		synctest.Wait()
		if got, _ := st.get("k"); got != 100*M {
			t.Fatalf("Redis holds %d after the lease of %d went back, want %d: given back exactly once", got, lease, 100*M)
		}
		if got := e.Allowance.Load(); got != 0 {
			t.Fatalf("the entry still holds %d: a give-back that may have been applied was put back", got)
		}
		if r.Stats().Uncertain == 0 {
			t.Fatal("Stats().Uncertain = 0 after a lost reply")
		}
	})
}

// TestLostReplyResent: a settlement whose reply is lost after Redis applied
// it is sent again, as it was, and Redis (which keeps the last sequence
// number of each instance per key) answers it as a duplicate: consumption is
// charged once, a lease top-up is granted once and reaches the entry, and
// the consumption spent meanwhile waits for the next round, after the
// duplicate.
func TestLostReplyResent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: 100 * time.Millisecond})
		defer r.Close(context.Background())
		opt := entry(r, "opt", spec(t, 10, 100, reconcile.Optimistic))
		ls := spec(t, 10, 100, reconcile.Lease)
		lease := entry(r, "lease", ls)
		round := func() {
			time.Sleep(100 * time.Millisecond)
			synctest.Wait()
		}

		r.Keys().Get("opt")
		r.Keys().Get("lease")
		opt.Pending.Add(3 * M)
		r.Starved(lease, false) // the round tops the lease up
		st.set(func(s *store) { s.lost = context.DeadlineExceeded })
		round() // applied, replies lost
		st.set(func(s *store) { s.lost = nil })
		if got, _ := st.get("opt"); got != 97*M {
			t.Fatalf("Redis holds %d for opt after the lost round, want %d (it was applied)", got, 97*M)
		}
		granted, _ := st.get("lease")
		granted = 100*M - granted
		if granted == 0 || lease.Allowance.Load() != 0 {
			t.Fatalf("lease: %d granted in Redis, %d in the entry after the lost round, want some and 0", granted, lease.Allowance.Load())
		}
		r.Keys().Get("opt")
		opt.Pending.Add(2 * M) // spent while the round is in doubt
		round()                // sent again: duplicates
		s := r.Stats()
		if s.Uncertain != 2 || s.Duplicates != 2 {
			t.Errorf("Uncertain %d, Duplicates %d after the resend, want 2, 2", s.Uncertain, s.Duplicates)
		}
		if got, _ := st.get("opt"); got != 97*M {
			t.Errorf("Redis holds %d for opt after the resend, want %d: charged once, the 2 spent since not yet", got, 97*M)
		}
		if got := lease.Allowance.Load(); got != granted {
			t.Errorf("lease: the entry holds %d after the resend, want the %d granted the first time", got, granted)
		}
		round()
		if got, _ := st.get("opt"); got != 95*M {
			t.Errorf("Redis holds %d for opt a round later, want %d", got, 95*M)
		}
		if got := r.Stats().Unsettled; got != 0 {
			t.Errorf("Unsettled = %d, want 0", got)
		}
	})
}

// TestDoubtExpires: a settlement that stays in doubt (every reply lost) is
// sent again for 5 minutes, then given up: its consumption is charged anew,
// once more, which errs towards denying.
func TestDoubtExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: 100 * time.Millisecond, Breaker: neverOpens})
		defer r.Close(context.Background())
		e := entry(r, "k", spec(t, 1e-3, 100, reconcile.Optimistic))
		r.Keys().Get("k")
		e.Pending.Add(3 * M)
		st.set(func(s *store) { s.lost = context.DeadlineExceeded })
		time.Sleep(4*time.Minute + 59*time.Second)
		synctest.Wait()
		if got, _ := st.get("k"); got != 97*M {
			t.Fatalf("Redis holds %d while in doubt, want %d: applied once, then duplicates", got, 97*M)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		st.set(func(s *store) { s.lost = nil })
		time.Sleep(time.Second)
		synctest.Wait()
		s := r.Stats()
		if got, _ := st.get("k"); got != 94*M || s.DoubtsExpired != 1 || s.Unsettled != 0 {
			t.Errorf("Redis holds %d, DoubtsExpired %d, Unsettled %d after the doubt expired, want %d, 1, 0: charged anew, once", got, s.DoubtsExpired, s.Unsettled, 94*M)
		}
	})
}

// TestDoubtBlocksTopUps: while a lease's settlement is in doubt, early
// top-ups send nothing for its key (a higher seq applied first would make
// the resend read as superseded, and its grant lost); the resend goes first
// and brings the grant of the first call.
func TestDoubtBlocksTopUps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: 100 * time.Millisecond})
		defer r.Close(context.Background())
		e := entry(r, "lease", spec(t, 10, 100, reconcile.Lease))
		r.Keys().Get("lease")
		r.Starved(e, false)
		st.set(func(s *store) { s.lost = context.DeadlineExceeded })
		time.Sleep(100 * time.Millisecond) // the round's top-up: applied, reply lost
		synctest.Wait()
		st.set(func(s *store) { s.lost = nil })
		tokens, _ := st.get("lease")
		granted := 100*M - tokens
		other := entry(r, "other", spec(t, 10, 100, reconcile.Lease))
		for range 2 { // two early rounds before the next regular one, with another key to top up
			for _, x := range []*reconcile.Entry{e, other} {
				x.SetView(local.View{Tokens: 50 * M, Seen: r.Clock().Now()}) // Redis has tokens: top up early
				r.Starved(x, true)
			}
			time.Sleep(30 * time.Millisecond)
			synctest.Wait()
		}
		time.Sleep(40 * time.Millisecond) // the next round: the resend
		synctest.Wait()
		st.mu.Lock()
		seqs := slices.Clone(st.seqs["lease"])
		st.mu.Unlock()
		if len(seqs) < 2 || seqs[1] != seqs[0] {
			t.Errorf("seqs sent for the key: %v, want the one in doubt sent again before any other", seqs)
		}
		if got := e.Allowance.Load(); got < granted {
			t.Errorf("the entry holds %d, want at least the %d granted by the call in doubt", got, granted)
		}
	})
}

// TestDoubtsShrink: the settlements of a large round whose replies were
// lost (orphans after an outage) fill the list and map of doubts; once they
// are answered, the reconciler lets go of both, as it does of a large
// round's buffers, so that its memory follows the doubts it has.
func TestDoubtsShrink(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: 100 * time.Millisecond, Breaker: neverOpens})
		defer r.Close(context.Background())
		sp := spec(t, 10, 100, reconcile.Optimistic)
		const n = 10 * reconcile.MaxBatch
		for i := range n {
			r.Orphan("k"+strconv.Itoa(i), sp, M)
		}
		// buffers returns the doubts' buffers during the next round, which
		// waits in its first call meanwhile (the round's state is the
		// loop's: the store's lock and the gate order the reads).
		buffers := func() (capacity, peak int) {
			gate := make(chan struct{})
			st.set(func(s *store) { s.gate = gate })
			time.Sleep(100 * time.Millisecond)
			synctest.Wait()
			st.set(func(s *store) { s.gate = nil })
			capacity, peak = reconcile.DoubtBuffers(r)
			close(gate)
			synctest.Wait()
			return capacity, peak
		}
		st.set(func(s *store) { s.lost = context.DeadlineExceeded })
		time.Sleep(100 * time.Millisecond)
		synctest.Wait() // applied, every reply lost
		st.set(func(s *store) { s.lost = nil })
		if c, peak := buffers(); c < n || peak < n { // sent again: duplicates
			t.Fatalf("while the doubts are sent again: their capacity %d, map peak %d, want at least %d each", c, peak, n)
		}
		if s := r.Stats(); s.Duplicates != n || s.Unsettled != 0 {
			t.Fatalf("Duplicates %d, Unsettled %d after the resend, want %d, 0", s.Duplicates, s.Unsettled, n)
		}
		r.Orphan("k0", sp, M) // for the round to call the store
		if c, peak := buffers(); c > 4*reconcile.MaxBatch || peak > 4*reconcile.MaxBatch {
			t.Errorf("doubts capacity %d, map peak %d with nothing in doubt, want at most %d each", c, peak, 4*reconcile.MaxBatch)
		}
		for i := range n {
			want := int64(99 * M)
			if i == 0 {
				want = 98 * M
			}
			if got, _ := st.get("k" + strconv.Itoa(i)); got != want {
				t.Fatalf("Redis holds %d for k%d, want %d: charged once", got, i, want)
			}
		}
	})
}

// lostFetch fetches e (a lease of burst 100, key "k", full in st) for one
// token with the reply lost after st applied it, checks that Redis granted
// it and the entry got nothing, and returns the grant.
func lostFetch(t *testing.T, st *store, r *reconcile.Reconciler, e *reconcile.Entry) (granted int64) {
	t.Helper()
	// Requests waiting for 2 tokens: a lease beyond the request, numbered
	// (a fetch for the request alone is not).
	r.AddDemand(e, 2*M)
	defer r.AddDemand(e, -2*M)
	st.set(func(s *store) { s.lost = context.DeadlineExceeded })
	if err := r.Fetch(context.Background(), e, M); err == nil {
		t.Fatal("Fetch with its reply lost: no error")
	}
	st.set(func(s *store) { s.lost = nil })
	tokens, _ := st.get("k")
	granted = 100*M - tokens
	if granted < M || e.Allowance.Load() != 0 {
		t.Fatalf("after the lost fetch: %d granted in Redis, %d in the entry, want at least %d and 0", granted, e.Allowance.Load(), M)
	}
	if s := r.Stats(); s.Uncertain != 1 {
		t.Fatalf("Uncertain = %d after the lost fetch, want 1", s.Uncertain)
	}
	return granted
}

// TestLostFetchResent: a fetch whose reply is lost after Redis granted it
// fails, and the next round sends it again, as it was: Redis answers it as a
// duplicate with its first grant, which reaches the entry, so the lease is
// not lost to the fleet. The fetch's Seq is counted apart from the rounds':
// the round that sends it again settles the key too.
func TestLostFetchResent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: 100 * time.Millisecond})
		defer r.Close(context.Background())
		e := entry(r, "k", spec(t, 1e-3, 100, reconcile.Lease))
		lostFetch(t, st, r, e)
		e.Pending.Add(M) // spent, for the round to settle alongside
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		s := r.Stats()
		if s.Duplicates != 1 {
			t.Errorf("Duplicates = %d after the round, want 1: the fetch sent again", s.Duplicates)
		}
		got, _ := st.get("k")
		if held := e.Allowance.Load(); got+held != 99*M {
			t.Errorf("Redis holds %d and the entry %d after the round, want %d between them: the grant reached the entry, the spent token was charged", got, held, 99*M)
		}
		if s.Unsettled != 0 {
			t.Errorf("Unsettled = %d, want 0", s.Unsettled)
		}
	})
}

// TestLostFetchResentByFetch: the key's next fetch, before any round, sends
// the fetch in doubt again, as it was, rather than a newer one that would
// make it read as superseded: its grant reaches the entry.
func TestLostFetchResentByFetch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: time.Hour})
		defer r.Close(context.Background())
		e := entry(r, "k", spec(t, 1e-3, 100, reconcile.Lease))
		granted := lostFetch(t, st, r, e)
		if err := r.Fetch(context.Background(), e, M); err != nil {
			t.Fatal(err)
		}
		if got := e.Allowance.Load(); got != granted {
			t.Errorf("the entry holds %d after the second fetch, want the %d granted to the first", got, granted)
		}
		if got, _ := st.get("k"); got != 100*M-granted {
			t.Errorf("Redis holds %d, want %d: granted once", got, 100*M-granted)
		}
		st.mu.Lock()
		seqs := slices.Clone(st.seqs["k"])
		st.mu.Unlock()
		if len(seqs) != 2 || seqs[0] != seqs[1] {
			t.Errorf("the key was sent Seqs %v, want the same one twice", seqs)
		}
		if s := r.Stats(); s.Uncertain != 1 || s.Duplicates != 1 {
			t.Errorf("Uncertain %d, Duplicates %d, want 1, 1", s.Uncertain, s.Duplicates)
		}
		// Once answered, the next fetch is a new one.
		e.Allowance.TakeAll()
		r.AddDemand(e, 2*M)
		defer r.AddDemand(e, -2*M)
		if err := r.Fetch(context.Background(), e, M); err != nil {
			t.Fatal(err)
		}
		st.mu.Lock()
		seqs = slices.Clone(st.seqs["k"])
		st.mu.Unlock()
		if len(seqs) != 3 || seqs[2] <= seqs[1] {
			t.Errorf("the key was sent Seqs %v, want a third, newer one", seqs)
		}
	})
}

// TestSupersededFetchCharged: an optimistic fetch carrying the key's
// consumption fails without a reply before Redis applied it; sent again, it
// reads as superseded (a later settlement of the key went first), so it may
// never have been applied: its consumption is put back and charged by the
// next round, not lost.
func TestSupersededFetchCharged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: 100 * time.Millisecond, FirstRound: 100 * time.Millisecond, Breaker: neverOpens})
		defer r.Close(context.Background())
		e := entry(r, "k", spec(t, 1e-3, 100, reconcile.Optimistic))
		e.SetView(local.View{Tokens: 100 * M, Seen: r.Clock().Now()})
		e.Pending.Add(3 * M)
		st.set(func(s *store) { s.fail = context.DeadlineExceeded })
		if err := r.Fetch(context.Background(), e, M); err == nil {
			t.Fatal("Fetch that got no reply: no error")
		}
		if got := e.Pending.Load(); got != 0 {
			t.Fatalf("the entry holds %d unsettled after the fetch in doubt, want 0: the doubt carries it", got)
		}
		st.set(func(s *store) { s.fail, s.supersede = nil, true })
		r.Fetch(context.Background(), e, M) // sends the doubt again: superseded
		if got := e.Pending.Load(); got != 3*M {
			t.Fatalf("the entry holds %d unsettled after the resend read as superseded, want %d put back", got, 3*M)
		}
		st.set(func(s *store) { s.supersede = false })
		time.Sleep(100 * time.Millisecond) // the round charges it
		synctest.Wait()
		if got, _ := st.get("k"); got != 97*M {
			t.Errorf("Redis holds %d, want %d: the consumption charged once", got, 97*M)
		}
		if s := r.Stats(); s.Unapplied != 1 {
			t.Errorf("Unapplied = %d, want 1", s.Unapplied)
		}
	})
}
