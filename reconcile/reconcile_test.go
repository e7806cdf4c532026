package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/local"
	"github.com/hybridlimit/hybrid/reconcile"
)

const M = local.Micro

// store is an in-memory Store: the settlement arithmetic of the script with
// no refill (the tests set the tokens they need), a fleet count, a log of
// calls, and a switch that makes every call fail.
type store struct {
	mu      sync.Mutex
	tokens  map[string]int64 // missing: full
	settles int              // Settle calls
	keys    int              // settlements applied
	fail    error
	beats   int
	live    int
	left    bool
	gate    chan struct{}       // if not nil, Settle waits for it
	entered int                 // Settle calls begun, at the gate or past it
	lost    error               // if not nil, Settle applies the batch, then fails with it (a reply lost)
	recs    map[string][2]int64 // key + " " + instance: the last seq applied and its grant
	dups    int                 // settlements found to be duplicates
	seqs    map[string][]int64  // the seqs each key was sent, in order
	sizes   []int               // the settlements of each Settle call past the gate
	delay   time.Duration       // how long each Settle call takes past the gate (a round trip)
}

func newStore() *store {
	return &store{tokens: map[string]int64{}, live: 1, recs: map[string][2]int64{}, seqs: map[string][]int64{}}
}

func (s *store) Settle(ctx context.Context, batch []global.Settlement, replies []global.Reply) error {
	s.mu.Lock()
	s.entered++
	gate := s.gate
	s.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.mu.Lock()
	delay := s.delay
	s.mu.Unlock()
	if delay > 0 {
		time.Sleep(delay) // in a synctest bubble: a round trip of fake time
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settles++
	s.sizes = append(s.sizes, len(batch))
	if s.fail != nil {
		for i := range batch {
			replies[i] = global.Reply{Err: s.fail}
		}
		return s.fail
	}
	for i, st := range batch {
		b := st.Limit.Burst
		t, ok := s.tokens[st.Key]
		if !ok {
			t = b
		}
		rk := st.Key + " " + st.Instance
		if st.Seq > 0 {
			s.seqs[st.Key] = append(s.seqs[st.Key], st.Seq)
		}
		if rec, ok := s.recs[rk]; ok && st.Seq > 0 && st.Seq <= rec[0] {
			// Applied already, as the script tells.
			g := int64(0)
			if st.Seq == rec[0] {
				g = rec[1]
			}
			s.dups++
			replies[i] = global.Reply{Granted: g, Tokens: t, Now: time.Now(), Duplicate: true}
			continue
		}
		t = min(b, t+st.Returned)
		t = max(-b, t-st.Consumed)
		g := min(st.Want, max(t, 0))
		g -= g % max(st.Quantum, 1)
		if g < st.MinGrant {
			g = 0
		}
		t -= g
		s.tokens[st.Key] = t
		if st.Seq > 0 {
			s.recs[rk] = [2]int64{st.Seq, g}
		}
		s.keys++
		replies[i] = global.Reply{Granted: g, Tokens: t, Now: time.Now()}
	}
	if s.lost != nil {
		for i := range batch {
			replies[i] = global.Reply{Err: s.lost}
		}
		return s.lost
	}
	return nil
}

func (s *store) Heartbeat(ctx context.Context, id string, ttl time.Duration) (int, time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return 0, time.Time{}, s.fail
	}
	s.beats++
	return s.live, time.Now(), nil
}

func (s *store) Leave(ctx context.Context, id string, ttl time.Duration) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.left = true
	return s.live - 1, s.fail
}

func (s *store) get(key string) (tokens int64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tokens, ok = s.tokens[key]
	return tokens, ok
}

func (s *store) set(f func(s *store)) {
	s.mu.Lock()
	f(s)
	s.mu.Unlock()
}

func (s *store) counts() (settles, keys int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.settles, s.keys
}

func newReconciler(t *testing.T, st reconcile.Store, cfg reconcile.Config) *reconcile.Reconciler {
	t.Helper()
	r, err := reconcile.New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func spec(t *testing.T, rate float64, burst int64, m reconcile.Mode) *reconcile.Spec {
	t.Helper()
	sp, err := reconcile.NewSpec(rate, burst, m)
	if err != nil {
		t.Fatal(err)
	}
	return sp
}

// neverOpens is a breaker policy that never opens: for tests whose calls
// fail on purpose, round after round.
var neverOpens = breaker.Config{ConsecutiveFailures: 1 << 30, FailureRatio: 1, MinRequests: 1 << 30}

// entry adds key to r's store with spec sp.
func entry(r *reconcile.Reconciler, key string, sp *reconcile.Spec) *reconcile.Entry {
	e, _ := r.Keys().GetOrAdd(key)
	e.X.SetSpec(sp)
	return e
}

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
		{SyncInterval: -1}, {FirstRound: -1}, {LocalCapacity: -1}, {LocalCapacity: 1 << 32}, {MaxKeys: -1}, {Instances: -1}, {MaxDebt: -1},
	} {
		if _, err := reconcile.New(newStore(), cfg); !errors.Is(err, reconcile.ErrConfig) {
			t.Errorf("New(%+v) error = %v, want ErrConfig", cfg, err)
		}
	}
	if _, err := reconcile.New(nil, reconcile.Config{}); !errors.Is(err, reconcile.ErrConfig) {
		t.Errorf("New(nil store) error = %v, want ErrConfig", err)
	}
}

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
// as long as the round makes progress, not a call's deadline. Here 4,097
// keys take 9 calls of 45ms each on a busy Redis, 405ms in all, more than
// two of the breaker's deadlines for a full call: every key's AwaitRound,
// begun as the round starts, returns once the key's settlement is applied.
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
		late := make([]bool, n)
		for i, e := range es {
			wg.Go(func() {
				if !r.AwaitRound(context.Background(), e) {
					t.Errorf("%s: AwaitRound = false while the round was on its way", e.Key())
					return
				}
				st.mu.Lock()
				late[i] = len(st.seqs[e.Key()]) == 0
				st.mu.Unlock()
			})
		}
		wg.Wait()
		took := time.Since(start)
		if k := slices.Index(late, true); k >= 0 {
			t.Errorf("AwaitRound of %s returned before its settlement was applied, after %v (%d of %d keys)",
				es[k].Key(), took, len(slices.DeleteFunc(late, func(b bool) bool { return !b })), n)
		}
		if took < 350*time.Millisecond {
			t.Errorf("the round took %v: too short to show anything", took)
		}
	})
}

// TestFetchAwaitsSlowRound: a fetch of an optimistic key that waits for the
// round charging the key is not given up at ColdWait: the request waits for
// the round's reply, then ColdWait for its own. On a busy Redis each call
// here takes 45ms (the floor of the breaker's deadline is 50ms): the round's
// and then the fetch's, 85ms from the request, more than ColdWait, all of it
// on a Redis that answers every call.
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
		if err := r.Fetch(context.Background(), e, 20*M); err != nil {
			t.Fatalf("Fetch while a round charged the key, on a Redis that answers in 45ms: %v", err)
		}
		if took := time.Since(start); took <= 50*time.Millisecond {
			t.Fatalf("Fetch took %v: the round did not hold it past ColdWait (the test shows nothing)", took)
		}
		if n := r.Stats().FetchTimeouts; n != 0 {
			t.Errorf("Stats().FetchTimeouts = %d, want 0", n)
		}
		if got, _ := st.get("k"); got > 90*M {
			t.Errorf("the bucket holds %d micro-tokens, want the round's charge of 10 made", got)
		}
	})
}
