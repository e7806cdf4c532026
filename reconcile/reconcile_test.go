package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hybridlimit/hybrid/reconcile"
)

// TestRounds: rounds come every SyncInterval and settle only keys with
// something to settle; an optimistic key's consumption is charged once.
func TestRounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: 100 * time.Millisecond})
		defer r.Close(context.Background())
		sp := spec(t, 10, 100, reconcile.Optimistic)
		e := entry(r, "k", sp)
		e.Pending.Add(7 * M)

		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
		if n, _ := st.counts(); n != 0 {
			t.Fatalf("Settle called %d times before the first interval", n)
		}
		time.Sleep(60 * time.Millisecond) // past the first tick
		synctest.Wait()
		if got, _ := st.get("k"); got != 93*M {
			t.Fatalf("after the first round the bucket holds %d, want %d", got, 93*M)
		}
		if e.Pending.Load() != 0 {
			t.Fatalf("pending after the round = %d, want 0", e.Pending.Load())
		}
		if b := e.Allowance.Load(); b <= 0 || b > r.Cap(sp) {
			t.Fatalf("optimistic budget after the round = %d, want in (0, %d]", b, r.Cap(sp))
		}
		if v := e.View(); v.Tokens != 93*M || v.Seen == 0 {
			t.Fatalf("view after the round = %+v, want 93 tokens, seen", v)
		}
		// Nothing touched, nothing pending: the next rounds send nothing.
		before, _ := st.counts()
		time.Sleep(time.Second)
		synctest.Wait()
		if after, _ := st.counts(); after != before {
			t.Fatalf("%d Settle calls for an idle key", after-before)
		}
		if got, _ := st.get("k"); got != 93*M {
			t.Fatalf("the idle key was charged again: %d", got)
		}
	})
}

// TestLeaseLifecycle: a lease is fetched on demand with whole tokens, grows
// when starved, and goes back once the key is idle.
func TestLeaseLifecycle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: 100 * time.Millisecond})
		defer r.Close(context.Background())
		sp := spec(t, 10, 100, reconcile.Lease)
		e := entry(r, "k", sp)
		if err := r.Fetch(context.Background(), e, 2*M); err != nil {
			t.Fatal(err)
		}
		lease := e.Allowance.Load()
		if lease < 2*M || lease%M != 0 {
			t.Fatalf("fetched lease %d, want whole tokens and at least the cost", lease)
		}
		if got, _ := st.get("k"); got != 100*M-lease {
			t.Fatalf("Redis holds %d after the fetch, want %d", got, 100*M-lease)
		}
		// Spend it all and starve: the next round tops up to a larger lease.
		e.Allowance.TakeAll()
		r.Keys().Get("k")
		r.Starved(e, false)
		time.Sleep(150 * time.Millisecond)
		synctest.Wait()
		if got := e.Allowance.Load(); got <= lease {
			t.Fatalf("after a starved round the lease is %d, want more than %d", got, lease)
		}
		// Idle for two rounds: everything goes back.
		time.Sleep(300 * time.Millisecond)
		synctest.Wait()
		if got := e.Allowance.Load(); got != 0 {
			t.Fatalf("an idle key still holds %d", got)
		}
		if got, _ := st.get("k"); got != 100*M-lease {
			t.Fatalf("Redis holds %d after the lease went back, want %d (what was spent)", got, 100*M-lease)
		}
	})
}

// TestFailedRoundKeepsDues: while Redis fails, nothing is lost and nothing is
// charged twice; once it is back, the dues are settled exactly once.
func TestFailedRoundKeepsDues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: 100 * time.Millisecond})
		defer r.Close(context.Background())
		sp := spec(t, 10, 100, reconcile.Optimistic)
		e := entry(r, "k", sp)
		st.set(func(s *store) { s.fail = errors.New("connection refused") })
		for range 5 {
			r.Keys().Get("k")
			e.Pending.Add(3 * M)
			time.Sleep(100 * time.Millisecond)
			synctest.Wait()
		}
		if !r.Degraded() {
			t.Fatal("the breaker did not open after 5 failed rounds")
		}
		if got := r.Stats().Unsettled; got != 15*M {
			t.Fatalf("unsettled while failing = %d, want %d", got, 15*M)
		}
		st.set(func(s *store) { s.fail = nil })
		time.Sleep(2 * time.Second) // open timeout, a probe, rounds
		synctest.Wait()
		if r.Degraded() {
			t.Fatal("the breaker did not close once Redis was back")
		}
		if got, _ := st.get("k"); got != 85*M {
			t.Fatalf("Redis holds %d, want %d: 15 tokens charged exactly once", got, 85*M)
		}
	})
}

// TestEvictionOrphans: keys evicted with dues are settled at the next round.
func TestEvictionOrphans(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: 100 * time.Millisecond, MaxKeys: 4})
		defer r.Close(context.Background())
		lease := spec(t, 10, 100, reconcile.Lease)
		opt := spec(t, 10, 100, reconcile.Optimistic)
		for i := range 20 {
			sp := lease
			if i%2 == 1 {
				sp = opt
			}
			e := entry(r, fmt.Sprint("k", i), sp)
			e.Pending.Add(1 * M) // consumption to charge
			if sp == lease {
				// a lease held: as if granted, so take it from Redis first
				// (one token, a never-sized lease's size: a larger one
				// would give back what it holds beyond its size)
				st.set(func(s *store) { s.tokens[e.Key()] = 99 * M })
				e.Allowance.Add(1 * M)
			}
		}
		time.Sleep(150 * time.Millisecond)
		synctest.Wait()
		if s := r.Stats(); s.Evicted != 16 || s.Orphans != 0 {
			t.Fatalf("Evicted %d, Orphans %d; want 16 and 0 after a round", s.Evicted, s.Orphans)
		}
		evicted := 0
		for i := range 20 {
			key := fmt.Sprint("k", i)
			live := r.Keys().Get(key) != nil
			if !live {
				evicted++
			}
			got, _ := st.get(key)
			want := int64(99 * M) // charged 1; an evicted lease also gave its 1 back
			if i%2 == 0 && live {
				want = 98 * M // a live lease keeps its 1
			}
			if got != want {
				t.Errorf("%s (live %v): Redis holds %d, want %d", key, live, got, want)
			}
		}
		if evicted != 16 {
			t.Fatalf("%d keys evicted, want 16", evicted)
		}
	})
}

// TestFetchShared: concurrent fetches of one key make one call; a fetch that
// cannot be answered within ColdWait gives up.
func TestFetchShared(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: time.Hour, ColdWait: 40 * time.Millisecond})
		defer r.Close(context.Background())
		sp := spec(t, 10, 100, reconcile.Lease)
		e := entry(r, "k", sp)
		gate := make(chan struct{})
		st.set(func(s *store) { s.gate = gate })
		before, _ := st.counts()
		var wg sync.WaitGroup
		errs := make(chan error, 20)
		for range 20 {
			wg.Go(func() { errs <- r.Fetch(context.Background(), e, M) })
		}
		synctest.Wait() // all 20 wait: one in Settle, the others on it
		close(gate)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
		if after, _ := st.counts(); after-before != 1 {
			t.Fatalf("20 concurrent fetches made %d calls, want 1", after-before)
		}

		// Redis slower than ColdWait: the fetch gives up at ColdWait.
		stall := make(chan struct{})
		defer close(stall) // before Close, which settles through the store
		st.set(func(s *store) { s.gate = stall })
		start := time.Now()
		err := r.Fetch(context.Background(), e, 50*M)
		if err == nil || time.Since(start) != 40*time.Millisecond {
			t.Fatalf("Fetch against a stalled Redis = %v after %v, want an error after 40ms", err, time.Since(start))
		}
		if s := r.Stats(); s.FetchTimeouts != 1 {
			t.Fatalf("FetchTimeouts = %d, want 1", s.FetchTimeouts)
		}
	})
}

// TestHeartbeats: the live count comes from the heartbeats unless
// Config.Instances is set; a count that rises is taken at once, one that
// falls at the second heartbeat that says so (a Redis that lost its data
// counts too few until every instance has beaten again); Close leaves the
// fleet.
func TestHeartbeats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		st.live = 5
		r := newReconciler(t, st, reconcile.Config{})
		synctest.Wait()
		if got := r.Instances(); got != 5 {
			t.Fatalf("Instances = %d after the first heartbeat, want 5", got)
		}
		beat := func(live int, want int64) {
			t.Helper()
			st.set(func(s *store) { s.live = live })
			time.Sleep(time.Second)
			synctest.Wait()
			if got := r.Instances(); got != want {
				t.Fatalf("Instances = %d after a heartbeat counting %d, want %d", got, live, want)
			}
		}
		beat(1, 5) // Redis restarted empty: only this instance beat yet
		beat(5, 5) // the others beat within the interval
		beat(3, 5) // two left: believed at the next heartbeat
		beat(3, 3)
		beat(6, 6)
		if err := r.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if !st.left {
			t.Fatal("Close did not leave the fleet")
		}
		fixed := newReconciler(t, st, reconcile.Config{Instances: 8})
		synctest.Wait()
		if got := fixed.Instances(); got != 8 {
			t.Fatalf("Instances = %d with Config.Instances 8", got)
		}
		fixed.Close(context.Background())
	})
}

// TestClose: Close settles every key for the last time, is idempotent, and
// refuses fetches afterwards.
func TestClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{})
		sp := spec(t, 10, 100, reconcile.Lease)
		e := entry(r, "k", sp)
		if err := r.Fetch(context.Background(), e, M); err != nil {
			t.Fatal(err)
		}
		e.Allowance.Spend(M)
		e.Pending.Add(4 * M) // consumption during an outage
		if err := r.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got, _ := st.get("k"); got != 95*M {
			t.Fatalf("Redis holds %d after Close, want %d (1 spent from the lease, 4 charged)", got, 95*M)
		}
		if err := r.Close(context.Background()); err != nil {
			t.Fatalf("second Close = %v, want nil", err)
		}
		if err := r.Fetch(context.Background(), e, M); !errors.Is(err, reconcile.ErrClosed) {
			t.Fatalf("Fetch after Close = %v, want ErrClosed", err)
		}
	})
}

func TestConfig(t *testing.T) {
	for _, cfg := range []reconcile.Config{
		{SyncInterval: -1}, {FirstRound: -1}, {LocalCapacity: -1}, {LocalCapacity: 1 << 32}, {MaxKeys: -1}, {Instances: -1}, {MaxDebt: -1}, {RefillPace: -1},
	} {
		if _, err := reconcile.New(newStore(), cfg); !errors.Is(err, reconcile.ErrConfig) {
			t.Errorf("New(%+v) error = %v, want ErrConfig", cfg, err)
		}
	}
	if _, err := reconcile.New(nil, reconcile.Config{}); !errors.Is(err, reconcile.ErrConfig) {
		t.Errorf("New(nil store) error = %v, want ErrConfig", err)
	}
}
