package reconcile_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

// TestAwaitRound: a request may wait for the round that is settling its key
// (until its reply is applied, and the allowance it grants is there); with
// no round in flight for the key it does not wait at all.
func TestAwaitRound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: 100 * time.Millisecond, ColdWait: 200 * time.Millisecond})
		defer r.Close(context.Background())
		e := entry(r, "k", spec(t, 10, 100, reconcile.Lease))
		if r.AwaitRound(context.Background(), e) {
			t.Fatal("AwaitRound = true with no round under way")
		}
		gate := make(chan struct{})
		st.set(func(s *store) { s.gate = gate })
		r.Keys().Get("k")
		r.Starved(e, false) // the round asks for a lease
		time.Sleep(100 * time.Millisecond)
		synctest.Wait() // the round waits at the gate
		done := make(chan int64)
		go func() {
			waited := r.AwaitRound(context.Background(), e)
			if !waited {
				done <- -1
				return
			}
			done <- e.Allowance.Load()
		}()
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		select {
		case got := <-done:
			t.Fatalf("AwaitRound returned (%d) while the round was in flight", got)
		default:
		}
		close(gate)
		synctest.Wait()
		if got := <-done; got <= 0 {
			t.Fatalf("after the round, AwaitRound saw allowance %d, want the round's grant", got)
		}
	})
}

// TestFetchGone: Fetch and Take of an entry that left the store say so with
// ErrGone, for the caller to look the key up again, and send nothing.
func TestFetchGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: 100 * time.Millisecond})
		defer r.Close(context.Background())
		e := entry(r, "k", spec(t, 10, 100, reconcile.Lease))
		r.Keys().Remove("k")
		if err := r.Fetch(context.Background(), e, M); !errors.Is(err, reconcile.ErrGone) {
			t.Errorf("Fetch of a removed entry = %v, want ErrGone", err)
		}
		if ok, err := r.Take(context.Background(), e, M); ok || !errors.Is(err, reconcile.ErrGone) {
			t.Errorf("Take of a removed entry = %v, %v, want false, ErrGone", ok, err)
		}
		if n, _ := st.counts(); n != 0 {
			t.Errorf("%d Settle calls, want none", n)
		}
	})
}

// TestOneChargeAtATime: an optimistic key's consumption is charged by one
// settlement at a time. A fetch that comes while a round is charging the
// key waits for the round's reply before it is sent (else Redis could
// answer it from a bucket the round's charge has not reached, and the
// budget or grant it brings would count the tokens the round charges); a
// round that comes while a fetch is charging the key leaves the key to the
// next round.
func TestOneChargeAtATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: 100 * time.Millisecond, ColdWait: time.Second})
		defer r.Close(context.Background())
		sp := spec(t, 1, 100, reconcile.Optimistic)
		e := entry(r, "k", sp)
		time.Sleep(time.Millisecond)
		e.SetView(local.View{Tokens: 100 * M, Seen: r.Clock().Now()})
		st.set(func(s *store) { s.tokens["k"] = 100 * M })

		// A round charges 90 while a fetch comes.
		e.Pending.Add(90 * M)
		r.Keys().Get("k")
		gate := make(chan struct{})
		st.set(func(s *store) { s.gate = gate })
		time.Sleep(100 * time.Millisecond)
		synctest.Wait() // the round waits at the gate
		entered := func() int {
			st.mu.Lock()
			defer st.mu.Unlock()
			return st.entered
		}
		before := entered()
		fetched := make(chan error, 1)
		go func() { fetched <- r.Fetch(context.Background(), e, 20*M) }()
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if got := entered(); got != before {
			t.Fatalf("a fetch was sent while a round charging its key was on its way (%d calls, want %d)", got, before)
		}
		st.set(func(s *store) { s.gate = nil })
		close(gate)
		if err := <-fetched; err != nil {
			t.Fatal(err)
		}
		// The round left 10 in the bucket: the fetch could take 10 at
		// most, and asked for 20.
		if got := e.Allowance.Load(); got > 10*M {
			t.Errorf("after the round charged 90 of 100, the fetch brought a budget of %d micro-tokens, more than the 10 left", got)
		}

		// A fetch charges 5 while the round comes (within the fetch's call
		// timeout, 50ms): the round leaves the key.
		time.Sleep(70 * time.Millisecond) // the next round is 30ms away
		e.Pending.Add(5 * M)
		gate = make(chan struct{})
		st.set(func(s *store) { s.gate = gate })
		go func() { fetched <- r.Fetch(context.Background(), e, 50*M) }()
		synctest.Wait() // the fetch waits at the gate
		before = entered()
		r.Keys().Get("k")
		time.Sleep(35 * time.Millisecond)
		synctest.Wait()
		if got := entered(); got != before {
			t.Fatalf("a round charged the key while a fetch charging it was on its way (%d calls, want %d)", got, before)
		}
		st.set(func(s *store) { s.gate = nil })
		close(gate)
		if err := <-fetched; err != nil {
			t.Fatal(err)
		}
		if got, _ := st.get("k"); got > 10*M-5*M {
			t.Errorf("the bucket holds %d micro-tokens after charges of 90 and 5 from 100, want at most 5M", got)
		}
	})
}

// TestAwaitLongRound: a round of many keys goes to Redis in calls of 512
// keys, one after another; a request waiting for its key's settlement waits
// while the round makes progress, and ColdWait at most in all: a decision
// never waits for Redis longer. Here 4,097 keys take 9 calls of 45ms each
// on a busy Redis, 405ms in all: the keys of the first call see their
// settlement applied, the others stop waiting at ColdWait (50ms), and the
// round goes on to settle them all.
func TestAwaitLongRound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: 100 * time.Millisecond})
		defer r.Close(context.Background())
		sp := spec(t, 1, 100, reconcile.Optimistic)
		const n = 8*512 + 1
		es := make([]*reconcile.Entry, n)
		for i := range es {
			es[i] = entry(r, "k"+strconv.Itoa(i), sp)
			es[i].Pending.Add(M)
		}
		st.set(func(s *store) { s.delay = 45 * time.Millisecond })
		time.Sleep(100 * time.Millisecond)
		synctest.Wait() // the round's first call is on its way
		time.Sleep(5 * time.Millisecond)
		start := time.Now()
		var wg sync.WaitGroup
		var mu sync.Mutex
		var applied, gaveUp int
		for _, e := range es {
			wg.Go(func() {
				if !r.AwaitRound(context.Background(), e) {
					t.Errorf("%s: AwaitRound = false while the round was on its way", e.Key())
					return
				}
				if took := time.Since(start); took > r.ColdWait() {
					t.Errorf("%s: AwaitRound returned after %v, more than ColdWait %v", e.Key(), took, r.ColdWait())
				}
				st.mu.Lock()
				done := len(st.seqs[e.Key()]) > 0
				st.mu.Unlock()
				mu.Lock()
				if done {
					applied++
				} else {
					gaveUp++
				}
				mu.Unlock()
			})
		}
		wg.Wait()
		if applied < 512 || gaveUp == 0 {
			t.Errorf("%d keys saw their settlement applied and %d stopped waiting at ColdWait; want the first call's 512 at least, and some", applied, gaveUp)
		}
		time.Sleep(500 * time.Millisecond) // the round ends
		synctest.Wait()
		st.mu.Lock()
		settled := len(st.seqs)
		st.mu.Unlock()
		if settled != n {
			t.Errorf("%d keys settled after the round, want all %d", settled, n)
		}
	})
}

// TestFetchAwaitsSlowRound: a fetch of an optimistic key that waits for the
// round charging the key counts that wait in the request's ColdWait: on a
// busy Redis whose calls take 45ms (the floor of the breaker's deadline is
// 50ms), the round's and then the fetch's, the request stops waiting at
// ColdWait, 50ms from its start, denied unanswered rather than held for
// 85ms; the fetch goes on, and the budget it brings reaches the entry.
func TestFetchAwaitsSlowRound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: 100 * time.Millisecond})
		defer r.Close(context.Background())
		sp := spec(t, 1, 100, reconcile.Optimistic)
		e := entry(r, "k", sp)
		time.Sleep(time.Millisecond)
		e.SetView(local.View{Tokens: 100 * M, Seen: r.Clock().Now()})
		st.set(func(s *store) { s.tokens["k"] = 100 * M; s.delay = 45 * time.Millisecond })
		e.Pending.Add(10 * M)
		r.Keys().Get("k")
		before, _ := st.counts()
		time.Sleep(100 * time.Millisecond)
		synctest.Wait() // the round's call is on its way
		st.mu.Lock()
		entered := st.entered
		st.mu.Unlock()
		if entered != before+1 {
			t.Fatalf("%d Settle calls begun, want the round's (%d before)", entered, before)
		}
		time.Sleep(5 * time.Millisecond)
		start := time.Now()
		err := r.Fetch(context.Background(), e, 20*M)
		if !errors.Is(err, reconcile.ErrNoAnswer) {
			t.Fatalf("Fetch while a round charged the key, on a Redis that answers in 45ms: %v, want ErrNoAnswer", err)
		}
		if took := time.Since(start); took != r.ColdWait() {
			t.Errorf("Fetch gave up after %v, want ColdWait %v in all", took, r.ColdWait())
		}
		if n := r.Stats().FetchTimeouts; n != 1 {
			t.Errorf("Stats().FetchTimeouts = %d, want 1", n)
		}
		time.Sleep(100 * time.Millisecond) // the fetch's own call comes back
		synctest.Wait()
		if got, _ := st.get("k"); got > 90*M {
			t.Errorf("the bucket holds %d micro-tokens, want the round's charge of 10 made", got)
		}
		if e.Allowance.Load() == 0 {
			t.Error("the fetch's budget did not reach the entry after the request stopped waiting")
		}
	})
}

// TestHurry: a round of more keys than one call carries sends them in calls
// one after another, to each node; a request that waits for its key's
// settlement gets it in the round's next call, not in its turn. Thirty
// requests wait while the first of three calls is on its way: all are
// answered by the end of the second (with the keys in their turns, the ten
// or so in the third call would wait for it too). On a Cluster, each
// node's calls are ordered so.
func TestHurry(t *testing.T) {
	for _, nodes := range []int{1, 2} {
		t.Run(strconv.Itoa(nodes)+" nodes", func(t *testing.T) { testHurry(t, nodes) })
	}
}

func testHurry(t *testing.T, nodes int) {
	synctest.Test(t, func(t *testing.T) {
		const call = 10 * time.Millisecond
		st := newStore()
		st.set(func(s *store) { s.delay = call })
		var rs reconcile.Store = st
		if nodes > 1 {
			rs = routedStore{&nodeStore{store: st, down: map[string]bool{}}}
		}
		r := newReconciler(t, rs, reconcile.Config{SyncInterval: 100 * time.Millisecond, ColdWait: time.Second})
		defer r.Close(context.Background())
		sp := spec(t, 10, 100, reconcile.Lease)
		n := 3 * reconcile.MaxBatch * nodes
		entries := make([]*reconcile.Entry, n)
		for i := range entries {
			entries[i] = entry(r, string(rune('a'+i%nodes))+strconv.Itoa(i), sp)
			r.Starved(entries[i], false) // the round asks for a lease
		}
		time.Sleep(100*time.Millisecond + call/2) // the round's first call is on its way
		start := time.Now()
		var wg sync.WaitGroup
		waited := make([]time.Duration, 30)
		for i := range waited {
			e := entries[i*n/len(waited)]
			wg.Go(func() {
				if !r.AwaitRound(context.Background(), e) {
					waited[i] = -1
					return
				}
				waited[i] = time.Since(start)
			})
		}
		wg.Wait()
		for i, w := range waited {
			if w < 0 || w > 3*call/2 {
				t.Errorf("request %d waited %v for its key's settlement, want at most %v (the call on its way and the next)", i, w, 3*call/2)
			}
		}
		if got := r.Stats().Hurried; got == 0 {
			t.Error("Stats.Hurried = 0, want the keys moved into the round's next call")
		}
	})
}
