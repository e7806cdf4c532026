package reconcile_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/reconcile"
)

// movingStore is a nodeStore whose layout moves, as a Redis Cluster's does
// when a replica takes a master's place: a key's node is route[its first
// byte], and the fleet count is on node "a". Each key's node keeps a witness
// beside its bucket, as global.Limiter.Witness does; lose makes the node of
// a key forget the beats (and so the writes) after a time.
type movingStore struct {
	*nodeStore
	wmu    sync.Mutex
	route  map[string]string      // first byte of a key -> node
	beats  map[string][]time.Time // by key: the instance's beats beside it, as the node holds them
	beaten map[string]int         // by node: beats answered
}

func newMovingStore() *movingStore {
	return &movingStore{
		nodeStore: &nodeStore{store: newStore(), down: map[string]bool{}},
		route:     map[string]string{"a": "a", "b": "b"},
		beats:     map[string][]time.Time{},
		beaten:    map[string]int{},
	}
}

func (s *movingStore) Relayout()    {}
func (s *movingStore) Spread() bool { return true }
func (s *movingStore) Node(ctx context.Context, key string) string {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.route[key[:1]]
}
func (s *movingStore) FleetNode(ctx context.Context) string { return "a" }

func (s *movingStore) Witness(ctx context.Context, key, id string, ttl time.Duration) (time.Time, time.Time, error) {
	s.mu.Lock()
	down := s.down[key[:1]]
	s.mu.Unlock()
	if down {
		return time.Time{}, time.Time{}, errNoReply
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	now := time.Now().Truncate(time.Millisecond)
	var was time.Time
	if b := s.beats[key]; len(b) > 0 {
		was = b[len(b)-1]
	}
	s.beats[key] = append(s.beats[key], now)
	s.beaten[s.route[key[:1]]]++
	return now, was, nil
}

func (s *movingStore) Unwitness(ctx context.Context, key, id string) error { return nil }

// lose makes the node of key forget the beats beside it after since: a
// node that lost its writes after since.
func (s *movingStore) lose(key string, since time.Time) {
	s.wmu.Lock()
	b := s.beats[key]
	for len(b) > 0 && b[len(b)-1].After(since) {
		b = b[:len(b)-1]
	}
	s.beats[key] = b
	s.wmu.Unlock()
}

// TestNodeWitness: on a Redis Cluster, a master other than the fleet
// count's that lost writes is seen by the witness beside its keys, and
// only its keys are charged again; when its replica takes its place, the
// first beat the replica answers sees what it lacks, and the dead master's
// node is retired: the instance is no longer degraded.
func TestNodeWitness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMovingStore()
		r, a, b := witnessFleet(t, st)
		defer r.Close(context.Background())
		fetch := func(e *reconcile.Entry, n int64) int64 {
			t.Helper()
			before := e.Allowance.Load()
			if err := r.Fetch(context.Background(), e, n*M); err != nil {
				t.Fatal(err)
			}
			return e.Allowance.Load() - before
		}
		fetch(a, 1)
		fetch(b, 1)
		time.Sleep(2500 * time.Millisecond) // beats: the first compares with nothing
		synctest.Wait()
		if st.beaten["b"] == 0 || st.beaten["a"] != 0 {
			t.Fatalf("beats beside the keys: %v; want some on b, none on a (the fleet count's node, whose heartbeat witnesses it)", st.beaten)
		}

		cut := time.Now()
		time.Sleep(10 * time.Millisecond)
		fetch(a, 3)
		gb := fetch(b, 7)
		time.Sleep(time.Second) // a beat after the fetches
		synctest.Wait()
		st.lose("b1", cut)
		time.Sleep(time.Second)
		synctest.Wait()
		if s := r.Stats(); s.Losses != 1 || s.Recharged != uint64(gb) || s.Orphans != 1 {
			t.Fatalf("after b lost its writes since the cut: %d losses, %d micro-tokens charged again, %d orphans; want 1, %d (b1's grant, not a1's), 1",
				s.Losses, s.Recharged, s.Orphans, gb)
		}

		// A grant node b answers and will lose; then b dies: its breaker
		// opens.
		time.Sleep(time.Second) // past the loss above
		cut = time.Now()
		time.Sleep(10 * time.Millisecond)
		b.Allowance.TakeAll()
		lostGrant := fetch(b, 4)
		time.Sleep(time.Second) // a beat after it
		killB(st, r, b)
		if !r.Degraded() || !r.DegradedKey("b1") {
			t.Fatalf("Degraded() = %v, DegradedKey(b1) = %v with node b dead, want true, true", r.Degraded(), r.DegradedKey("b1"))
		}
		// Its replica c takes its place, having missed the writes since
		// the cut; a grant c answers before the next beat is c's own.
		st.lose("b1", cut)
		promoteC(st)
		before := r.Stats()
		b.Allowance.TakeAll()
		fetch(b, 3)
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		s := r.Stats()
		if s.Losses != before.Losses+1 || s.Recharged-before.Recharged != uint64(lostGrant) {
			t.Errorf("after the replica took b's place: %d losses, %d micro-tokens charged again; want %d, %d (the grant b answered, not the one c did)",
				s.Losses, s.Recharged-before.Recharged, before.Losses+1, lostGrant)
		}
		if r.Degraded() || r.DegradedKey("b1") {
			t.Errorf("Degraded() = %v, DegradedKey(b1) = %v once c holds b's keys, want false, false", r.Degraded(), r.DegradedKey("b1"))
		}
		for _, n := range s.Nodes {
			if n.Addr == "b" {
				t.Errorf("Stats.Nodes = %+v still lists b, retired", s.Nodes)
			}
		}
	})
}

// TestRetiredOutageMarks: on a Redis Cluster, once the node of a master
// that died is retired (its replica answers for its keys), the settlements
// that reach the replica still carry the outage's start for outageMark, as
// those of a node whose breaker closed do: the first write on the promoted
// replica keeps the refill its bucket lost for the fleet's outage charges
// to claim. Before, a retirement that came before that first write (the
// heartbeat's witnesses saw the replica first) left no node degraded and no
// mark: the write closed the pool, and an exact fleet's failover on a
// Cluster admitted about 20% less than B + R*T, one run in twenty.
func TestRetiredOutageMarks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMovingStore()
		r := newReconciler(t, st, reconcile.Config{SyncInterval: time.Hour, HeartbeatInterval: time.Second, ShareCredit: true,
			Breaker: breaker.Config{OpenTimeout: time.Second}})
		defer r.Close(context.Background())
		sp := spec(t, 10, 100, reconcile.Lease)
		b := entry(r, "b1", sp)
		if err := r.Fetch(context.Background(), b, M); err != nil {
			t.Fatal(err)
		}
		killB(st, r, b)
		if !r.DegradedKey("b1") {
			t.Fatal("DegradedKey(b1) = false with node b dead")
		}
		// The replica c takes b's place; the heartbeat's witness answered
		// by c retires b before any settlement reaches c.
		promoteC(st)
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		for _, n := range r.Stats().Nodes {
			if n.Addr == "b" {
				t.Fatalf("Stats.Nodes = %+v still lists b: not retired", r.Stats().Nodes)
			}
		}
		st.mu.Lock()
		before := st.marked["b1"]
		st.mu.Unlock()
		b.Allowance.TakeAll()
		if err := r.Fetch(context.Background(), b, M); err != nil {
			t.Fatal(err)
		}
		st.mu.Lock()
		got := st.marked["b1"] - before
		st.mu.Unlock()
		if got != 1 {
			t.Errorf("%d settlements of b1 on the promoted replica carried the outage's start after b was retired, want 1", got)
		}
	})
}

// TestNodeWitnessTail: on a Redis Cluster, a replica that takes the place
// of a master that died keeps the instance's last beat but may lack the
// writes of the master's last moments: the first beat it answers has the
// instance charge again what its settlements on the dead master took in
// their last moments, not what the replica answered itself. Before, a kept
// beat charged nothing.
func TestNodeWitnessTail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMovingStore()
		r, a, b := witnessFleet(t, st)
		defer r.Close(context.Background())
		if err := r.Fetch(context.Background(), b, M); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2500 * time.Millisecond) // beats: the first compares with nothing
		synctest.Wait()
		fetch := func(e *reconcile.Entry, n int64) int64 {
			t.Helper()
			e.Allowance.TakeAll()
			if err := r.Fetch(context.Background(), e, n*M); err != nil {
				t.Fatal(err)
			}
			return e.Allowance.Load()
		}
		fetch(a, 3)
		lost := fetch(b, 4)
		killB(st, r, b) // before the next beat
		promoteC(st)
		fetch(b, 3) // answered by c, before its first beat
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		s := r.Stats()
		if s.Tails != 1 || s.Losses != 0 || s.Recharged != uint64(lost) {
			t.Errorf("after the replica took b's place, the last beat kept: %d tails, %d losses, %d micro-tokens charged again; want 1, 0, %d (b's last grant, not a's nor c's)",
				s.Tails, s.Losses, s.Recharged, lost)
		}
	})
}

// killB takes node b down and asks for b's key until its breaker opens,
// inside a synctest bubble.
func killB(st *movingStore, r *reconcile.Reconciler, b *reconcile.Entry) {
	st.set(func(*store) { st.down["b"] = true })
	for range 10 {
		b.Allowance.TakeAll()
		r.Fetch(context.Background(), b, M)
		time.Sleep(100 * time.Millisecond)
	}
	synctest.Wait()
}

// witnessFleet returns a Reconciler on st (a heartbeat a second, rounds
// only when asked) with an entry of a lease key on node a, a1, and one on
// node b, b1.
func witnessFleet(t *testing.T, st *movingStore) (*reconcile.Reconciler, *reconcile.Entry, *reconcile.Entry) {
	r := newReconciler(t, st, reconcile.Config{SyncInterval: time.Hour, HeartbeatInterval: time.Second,
		Breaker: breaker.Config{OpenTimeout: time.Second}})
	sp := spec(t, 10, 100, reconcile.Lease)
	return r, entry(r, "a1", sp), entry(r, "b1", sp)
}

// promoteC puts node c, b's replica, in b's place: b's keys are c's now,
// and c holds what b's replica had of b's beats.
func promoteC(st *movingStore) {
	st.wmu.Lock()
	st.route["b"] = "c"
	st.wmu.Unlock()
	st.set(func(*store) { st.down["b"] = false })
}
