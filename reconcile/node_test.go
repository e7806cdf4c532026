package reconcile_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hybridlimit/hybrid/breaker"
	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/reconcile"
)

// nodeStore is a store whose keys are on two nodes, as on a Redis Cluster:
// a key's node is its first byte ("a" or "b"), and down nodes give no reply
// for their keys while the others answer, in the same Settle call, as
// go-redis's cluster pipelines do. With routed, it is a Router.
type nodeStore struct {
	*store
	down      map[string]bool // guarded by store.mu
	relayouts atomic.Int32    // Relayout calls (routedStore)
}

// routedStore is a nodeStore that tells the reconciler the nodes.
type routedStore struct{ *nodeStore }

// Relayout counts the reconciler's requests for the layout.
func (s routedStore) Relayout() { s.relayouts.Add(1) }

func (s routedStore) Spread() bool                                { return true }
func (s routedStore) Node(ctx context.Context, key string) string { return key[:1] }
func (s routedStore) FleetNode(ctx context.Context) string        { return "a" }

var errNoReply = errors.New("read tcp 127.0.0.1:1->127.0.0.1:2: i/o timeout")

func (s *nodeStore) Settle(ctx context.Context, batch []global.Settlement, replies []global.Reply) error {
	var up []global.Settlement
	var at []int
	s.mu.Lock()
	for i := range batch {
		if s.down[batch[i].Key[:1]] {
			replies[i] = global.Reply{Err: errNoReply}
		} else {
			up, at = append(up, batch[i]), append(at, i)
		}
	}
	s.mu.Unlock()
	if len(up) > 0 {
		got := make([]global.Reply, len(up))
		if err := s.store.Settle(ctx, up, got); err != nil {
			return err
		}
		for j, i := range at {
			replies[i] = got[j]
		}
	}
	if len(at) < len(batch) {
		return errNoReply
	}
	return nil
}

// TestNodeBreakers: on a Redis Cluster, a node that gives no reply opens its
// own breaker, and the reconciler asks for the cluster's layout again: its
// keys are degraded and keep their dues, while the keys of the node that
// answers keep settling, every round, each charge once. The layout is
// asked for again while its breaker is not closed, and no longer after.
func TestNodeBreakers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := routedStore{&nodeStore{store: newStore(), down: map[string]bool{}}}
		var changes []string
		r := newReconciler(t, st, reconcile.Config{SyncInterval: 100 * time.Millisecond,
			Breaker: breaker.Config{OnStateChange: func(from, to breaker.State) { changes = append(changes, from.String()+">"+to.String()) }}})
		defer r.Close(context.Background())
		sp := spec(t, 10, 100, reconcile.Optimistic)
		a, b := entry(r, "a1", sp), entry(r, "b1", sp)
		st.set(func(s *store) { st.down["b"] = true })
		for range 5 {
			r.Keys().Get("a1")
			r.Keys().Get("b1")
			a.Pending.Add(3 * M)
			b.Pending.Add(3 * M)
			time.Sleep(100 * time.Millisecond)
			synctest.Wait()
		}
		if !r.DegradedKey("b1") || !r.Degraded() {
			t.Errorf("DegradedKey(b1) = %v, Degraded() = %v after 5 rounds without a reply from b, want true, true", r.DegradedKey("b1"), r.Degraded())
		}
		if r.DegradedKey("a1") {
			t.Errorf("DegradedKey(a1) = true, want false: node a answers")
		}
		if got, _ := st.get("a1"); got != 85*M {
			t.Errorf("node a holds %d for a1, want %d: 15 tokens charged once, while b was down", got, 85*M)
		}
		if got := r.Stats().Unsettled; got != 15*M {
			t.Errorf("b1 keeps %d unsettled, want %d", got, 15*M)
		}
		s := r.Stats()
		want := []reconcile.NodeState{{Addr: "", Breaker: breaker.Closed}, {Addr: "a", Breaker: breaker.Closed}, {Addr: "b", Breaker: breaker.Open}}
		if len(s.Nodes) != len(want) {
			t.Fatalf("Stats.Nodes = %+v, want %+v", s.Nodes, want)
		}
		for i := range want {
			if s.Nodes[i] != want[i] {
				t.Errorf("Stats.Nodes = %+v, want %+v", s.Nodes, want)
				break
			}
		}
		if s.Breaker != breaker.Open {
			t.Errorf("Stats.Breaker = %v, want open (the worst node's)", s.Breaker)
		}
		if strings.Join(changes, " ") != "closed>open" {
			t.Errorf("OnStateChange saw %v, want [closed>open] (node b's breaker alone)", changes)
		}
		// Asked when b's breaker opened, and at each round since, while it
		// is not closed (a replica may take its slots).
		if n := st.relayouts.Load(); n < 2 || n > 5 {
			t.Errorf("%d requests for the cluster's layout over 5 rounds, b's breaker open from the first or second: want one when it opened and one a round since", n)
		}

		st.set(func(s *store) { st.down["b"] = false })
		time.Sleep(2 * time.Second) // open timeout, a probe, rounds
		synctest.Wait()
		if r.Degraded() || r.DegradedKey("b1") {
			t.Errorf("Degraded() = %v, DegradedKey(b1) = %v once b answers again, want false", r.Degraded(), r.DegradedKey("b1"))
		}
		if got, _ := st.get("b1"); got != 85*M {
			t.Errorf("node b holds %d for b1, want %d: 15 tokens charged once it was back", got, 85*M)
		}
		n := st.relayouts.Load()
		time.Sleep(time.Second)
		synctest.Wait()
		if more := st.relayouts.Load() - n; more != 0 {
			t.Errorf("%d requests for the cluster's layout over 10 rounds with every breaker closed, want 0", more)
		}
	})
}

// TestPartialReplies: a Settle call that fails for some keys, as a cluster
// pipeline does when one node gives no reply, leaves the replies of the
// others valid: those are applied (charged once), only the others are kept
// for a later round. A store that is not a Router has one breaker.
func TestPartialReplies(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &nodeStore{store: newStore(), down: map[string]bool{"b": true}}
		r := newReconciler(t, st, reconcile.Config{SyncInterval: 100 * time.Millisecond})
		defer r.Close(context.Background())
		sp := spec(t, 10, 100, reconcile.Optimistic)
		a, b := entry(r, "a1", sp), entry(r, "b1", sp)
		r.Keys().Get("a1")
		r.Keys().Get("b1")
		a.Pending.Add(3 * M)
		b.Pending.Add(3 * M)
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		if got, _ := st.get("a1"); got != 97*M {
			t.Errorf("Redis holds %d for a1, want %d", got, 97*M)
		}
		if got := a.Pending.Load(); got != 0 {
			t.Errorf("a1 keeps %d unsettled after its reply came, want 0: it would be charged twice", got)
		}
		if got := r.Stats().Unsettled; got != 3*M {
			t.Errorf("b1 keeps %d unsettled, want %d", got, 3*M)
		}
		if n := len(r.Stats().Nodes); n != 1 {
			t.Errorf("Stats.Nodes has %d breakers, want 1 for a store that is not a Router", n)
		}
	})
}
