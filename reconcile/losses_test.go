package reconcile_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hybridlimit/hybrid/reconcile"
)

// witnessStore is a store whose heartbeat tells when it last saw the
// instance beat, as global.Limiter.HeartbeatWas does; lose makes it forget
// the beats (and so the writes) after a time.
type witnessStore struct {
	*store
	mu    sync.Mutex
	last  time.Time // the instance's last beat, as this Redis holds it
	since time.Time // if not zero: the next beat finds last no later than this
	name  string    // the server's name (Server): a replica promoted has another
	asked int       // calls of Server
}

func (w *witnessStore) Server(ctx context.Context) (string, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.asked++
	return w.name, nil
}

// rename gives the server that answers the name name: a replica promoted
// in its master's place, behind the same address.
func (w *witnessStore) rename(name string) {
	w.mu.Lock()
	w.name = name
	w.mu.Unlock()
}

func (w *witnessStore) HeartbeatWas(ctx context.Context, id string, ttl time.Duration) (int, time.Time, time.Time, error) {
	live, now, err := w.Heartbeat(ctx, id, ttl)
	if err != nil {
		return 0, time.Time{}, time.Time{}, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	was := w.last
	if !w.since.IsZero() && was.After(w.since) {
		was, w.since = w.since, time.Time{}
	}
	w.last = now.Truncate(time.Millisecond)
	return live, now.Truncate(time.Millisecond), was, nil
}

// lose makes the next heartbeat find the instance's last beat at since: a
// Redis that lost its writes after since.
func (w *witnessStore) lose(since time.Time) {
	w.mu.Lock()
	w.since = since
	w.mu.Unlock()
}

// TestLostWrites: a heartbeat that finds an older beat than the instance's
// last (a failover to a replica that lagged) has the instance charge again
// what its settlements took since: a lease fetch's grant after that time,
// not one before it; a heartbeat that finds the last beat changes nothing.
func TestLostWrites(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, r := beating(t)
		defer r.Close(context.Background())
		leased(t, r, "early", 5*M)
		time.Sleep(100 * time.Millisecond)
		cut := time.Now()
		late := leased(t, r, "late", 7*M)
		granted := late.Allowance.Load()
		if granted < 7*M {
			t.Fatalf("the fetch granted %d micro-tokens, want 7 tokens or more", granted)
		}
		time.Sleep(time.Second) // a heartbeat that finds the last beat
		synctest.Wait()
		if st := r.Stats(); st.Losses != 0 || st.Orphans != 0 {
			t.Fatalf("after a heartbeat that found the last beat: %d losses, %d orphans; want none", st.Losses, st.Orphans)
		}
		w.lose(cut)
		time.Sleep(time.Second)
		synctest.Wait()
		st := r.Stats()
		if st.Losses != 1 || st.Recharged != uint64(granted) || st.Orphans != 1 {
			t.Fatalf("after a heartbeat that found a beat before the late fetch: %d losses, %d micro-tokens charged again, %d orphans; want 1, %d (the late grant), 1",
				st.Losses, st.Recharged, st.Orphans, granted)
		}
	})
}

// TestLostWritesLongOutage: an outage longer than the journal's span (a
// failover that takes its time) keeps what the instance took before it, so
// that the first heartbeat after it, which finds the loss, charges it
// again, though settlements came back in between.
func TestLostWritesLongOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, r := beating(t)
		defer r.Close(context.Background())
		cut := time.Now()
		e := leased(t, r, "k", 7*M)
		granted := e.Allowance.Load()
		time.Sleep(time.Second)         // a beat after the grant, which the loss takes too
		goDown(t, r, w, 10*time.Second) // more than three heartbeat intervals
		w.lose(cut)
		other := entry(r, "other", spec(t, 10, 100, reconcile.Lease))
		comeBack(r, w, other)
		time.Sleep(time.Second)
		synctest.Wait()
		st := r.Stats()
		if st.Losses != 1 || st.Recharged < uint64(granted) {
			t.Fatalf("after an outage of 10 s that lost the grant: %d losses, %d micro-tokens charged again; want 1, at least %d (the grant before it)",
				st.Losses, st.Recharged, granted)
		}
	})
}

// TestLostWritesAfterOutage: a loss found after an outage, of writes made
// after it (Sentinel failing over a second time, to a replica that lagged
// behind the first one it promoted), is charged again: what the instance
// wrote after the outage began did not all go to the Redis that answers
// now. Before, only what came before the outage's start counted, and a
// loss from after it charged nothing.
func TestLostWritesAfterOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, r := beating(t)
		defer r.Close(context.Background())
		goDown(t, r, w, 4*time.Second) // three failed heartbeats
		e := entry(r, "k", spec(t, 10, 100, reconcile.Lease))
		comeBack(r, w, e)
		time.Sleep(time.Second) // a beat on the Redis that answers after the outage
		synctest.Wait()
		cut := time.Now()
		e.Allowance.Spend(e.Allowance.Load())
		if err := r.Fetch(context.Background(), e, 7*M); err != nil {
			t.Fatal(err)
		}
		granted := e.Allowance.Load()
		if granted < 7*M {
			t.Fatalf("the fetch granted %d micro-tokens, want 7 tokens or more", granted)
		}
		time.Sleep(time.Second) // a beat after the grant, which the loss takes too
		synctest.Wait()
		if st := r.Stats(); st.Losses != 0 {
			t.Fatalf("%d losses before any, want none", st.Losses)
		}
		w.lose(cut) // a second failover, within the outage's mark
		time.Sleep(time.Second)
		synctest.Wait()
		st := r.Stats()
		if st.Losses != 1 || st.Recharged < uint64(granted) {
			t.Fatalf("after a loss of writes made after the outage: %d losses, %d micro-tokens charged again; want 1, at least %d (the grant after the outage)",
				st.Losses, st.Recharged, granted)
		}
	})
}

// TestLostWritesCredited: a lost charge is charged again for what it took
// out of the bucket: its consumption less what its claim took back out of
// an outage's pool (global.Reply.Credited). Before, the consumption was
// charged again in full, and a second failover after an outage left the
// bucket in debt for what the claims had rightly taken back.
func TestLostWritesCredited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &witnessStore{store: newStore()}
		w.credit = true
		r := newReconciler(t, w, reconcile.Config{SyncInterval: 100 * time.Millisecond, HeartbeatInterval: time.Second, ShareCredit: true})
		defer r.Close(context.Background())
		time.Sleep(1500 * time.Millisecond) // two beats: the first one compares with nothing
		e := entry(r, "k", spec(t, 100, 100, reconcile.Lease))
		kept(r, e) // about 200 tokens of refill kept by the fallback's share
		cut := time.Now()
		e.Pending.Add(150 * M)
		r.Keys().Get("k")
		time.Sleep(100 * time.Millisecond) // a round charges it, all claimed
		synctest.Wait()
		w.mu.Lock()
		claimed := w.claims["k"]
		w.mu.Unlock()
		if claimed != 150*M {
			t.Fatalf("claimed %d micro-tokens of the 150 tokens charged, want all", claimed)
		}
		if c := r.Stats().Credited; c != 150*M {
			t.Fatalf("Stats.Credited %d after a charge whose claim was credited in full, want %d", c, 150*M)
		}
		time.Sleep(time.Second) // a beat after the charge, which the loss takes too
		w.lose(cut)
		time.Sleep(time.Second)
		synctest.Wait()
		if st := r.Stats(); st.Losses != 1 || st.Recharged != 0 {
			t.Fatalf("after losing a charge its claim took back in full: %d losses, %d micro-tokens charged again; want 1, 0", st.Losses, st.Recharged)
		}
	})
}

// TestBeatsAfterOutage: after an outage, heartbeats come a SyncInterval
// apart while the journal is pinned (two journal spans), so that a second
// loss of writes (Sentinel failing over again) is charged again from a
// beat a round old, not a heartbeat interval old; then a heartbeat
// interval apart again. Before, they came a heartbeat interval apart
// throughout.
func TestBeatsAfterOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &witnessStore{store: newStore()}
		r := newReconciler(t, w, reconcile.Config{SyncInterval: 100 * time.Millisecond, HeartbeatInterval: time.Second})
		defer r.Close(context.Background())
		beats := func(d time.Duration) int {
			var before, after int
			w.set(func(s *store) { before = s.beats })
			time.Sleep(d)
			synctest.Wait()
			w.set(func(s *store) { after = s.beats })
			return after - before
		}
		time.Sleep(1500 * time.Millisecond) // past the first beats, a round apart
		if n := beats(3 * time.Second); n > 4 {
			t.Fatalf("%d heartbeats in 3 s before any outage, want a second apart", n)
		}
		goDown(t, r, w, 4*time.Second)
		e := entry(r, "k", spec(t, 10, 100, reconcile.Lease))
		comeBack(r, w, e)
		time.Sleep(time.Second) // the first beat after the outage
		synctest.Wait()
		if r.Degraded() {
			t.Fatal("still degraded after the calls came back")
		}
		if n := beats(2 * time.Second); n < 15 {
			t.Fatalf("%d heartbeats in the 2 s after an outage, want a round (100 ms) apart", n)
		}
		time.Sleep(5 * time.Second) // the pin ends two journal spans (6 s) after the outage
		if n := beats(3 * time.Second); n > 4 {
			t.Fatalf("%d heartbeats in 3 s once the outage's pin ended, want a second apart", n)
		}
	})
}

// TestLostTail: a Redis that answers after an outage with the instance's
// last beat kept, under another name, is a replica promoted in a dead
// master's place behind the same address (Sentinel's master), which may
// lack the writes of the master's last moments (sent to the replica after
// they were answered): the instance charges again what its settlements
// took in their last moments before the outage, not what they took before
// nor after. The same server answering after the outage (a network that
// failed for a while) lost nothing, and nothing is charged. The name is
// asked at the first beat and at the first after the outage, no more.
// Before, a kept beat charged nothing, and a lease grant the replica never
// saw let a fleet's failover admit 0.1% beyond B + R*T, one run in 24
// under -race.
func TestLostTail(t *testing.T) {
	for _, tt := range []struct {
		name   string
		server string // the name of the server that answers after the outage
		tails  uint64
	}{
		{"failover", "m2", 1},
		{"network", "m1", 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w, r := beating(t)
				defer r.Close(context.Background())
				leased(t, r, "early", 5*M)
				time.Sleep(300 * time.Millisecond) // a journal slot and more, no beat
				late := leased(t, r, "late", 7*M)
				want := uint64(late.Allowance.Load()) * tt.tails
				goDown(t, r, w, 4*time.Second)
				if st := r.Stats(); st.Tails != 0 || st.Recharged != 0 {
					t.Fatalf("during the outage: %d tails, %d micro-tokens charged again; want none", st.Tails, st.Recharged)
				}
				w.rename(tt.server)
				comeBack(r, w, entry(r, "other", spec(t, 10, 100, reconcile.Lease)))
				time.Sleep(time.Second) // the first beat after the outage
				synctest.Wait()
				st := r.Stats()
				if st.Tails != tt.tails || st.Losses != 0 || st.Recharged != want {
					t.Fatalf("after an outage whose Redis kept the last beat: %d tails, %d losses, %d micro-tokens charged again; want %d, 0, %d",
						st.Tails, st.Losses, st.Recharged, tt.tails, want)
				}
				time.Sleep(3 * time.Second)
				synctest.Wait()
				if st := r.Stats(); st.Tails != tt.tails || st.Recharged != want {
					t.Fatalf("beats after the first: %d tails, %d micro-tokens charged again; want the first beat's alone", st.Tails, st.Recharged)
				}
				w.mu.Lock()
				asked := w.asked
				w.mu.Unlock()
				if asked != 2 {
					t.Errorf("the server's name asked %d times, want 2: at the first beat and the first after the outage", asked)
				}
			})
		})
	}
}

// goDown makes w fail every call for d, inside a synctest bubble, and
// checks that r is degraded then.
func goDown(t *testing.T, r *reconcile.Reconciler, w *witnessStore, d time.Duration) {
	t.Helper()
	w.set(func(s *store) { s.fail = errNoReply })
	time.Sleep(d)
	synctest.Wait()
	if !r.Degraded() {
		t.Fatalf("not degraded after %v of failing calls", d)
	}
}

// comeBack makes w answer again and fetches for e until the breaker lets a
// call through, inside a synctest bubble.
func comeBack(r *reconcile.Reconciler, w *witnessStore, e *reconcile.Entry) {
	w.set(func(s *store) { s.fail = nil })
	for range 20 {
		if r.Fetch(context.Background(), e, M) == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// beating returns a Reconciler on a witnessStore (a heartbeat a second,
// rounds only when asked) past its first two beats, the first of which
// compares with nothing, inside a synctest bubble.
func beating(t *testing.T) (*witnessStore, *reconcile.Reconciler) {
	w := &witnessStore{store: newStore(), name: "m1"}
	r := newReconciler(t, w, reconcile.Config{SyncInterval: time.Hour, HeartbeatInterval: time.Second})
	time.Sleep(1500 * time.Millisecond)
	return w, r
}

// leased returns an entry of a lease key (10/s, burst 100) of r that a
// fetch of n micro-tokens has granted to.
func leased(t *testing.T, r *reconcile.Reconciler, key string, n int64) *reconcile.Entry {
	t.Helper()
	e := entry(r, key, spec(t, 10, 100, reconcile.Lease))
	if err := r.Fetch(context.Background(), e, n); err != nil {
		t.Fatal(err)
	}
	return e
}
