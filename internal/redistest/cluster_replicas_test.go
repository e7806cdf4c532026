package redistest_test

import (
	"slices"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestClusterReplicas(t *testing.T) {
	t.Parallel()
	start := time.Now()
	c := redistest.ClusterWith(t, redistest.ClusterOptions{Replicas: 1, NodeTimeout: time.Second})
	if !c.Owned() {
		t.Skip("needs a cluster started here, not one from " + redistest.EnvClusterAddrs)
	}
	t.Logf("StartCluster with 6 nodes took %v", time.Since(start))
	nodes := c.Nodes()
	if len(nodes) != 6 {
		t.Fatalf("len(Nodes()) = %d, want 6", len(nodes))
	}
	masters, replicas := layout(t, c, 3, 3)
	for _, p := range nodes {
		if slices.Contains(masters, p) == slices.Contains(replicas, p) {
			t.Fatalf("node %s: in Masters() %v, in Replicas() %v", p.Addr(), slices.Contains(masters, p), slices.Contains(replicas, p))
		}
	}
	seen := make(map[*redistest.Proc]bool)
	for _, m := range masters {
		r := replicaOf(t, c, m)
		if !slices.Contains(replicas, r) || seen[r] {
			t.Fatalf("ReplicaOf(%s) = %s, want a replica of its own", m.Addr(), r.Addr())
		}
		seen[r] = true
	}

	// One key per slot range, written on the master of its slot and
	// acknowledged by its replica (SET and WAIT on one connection).
	rdb := redistest.ClusterClient(t, c)
	ctx := t.Context()
	shards, err := rdb.ClusterShards(ctx).Result()
	if err != nil {
		t.Fatalf("CLUSTER SHARDS: %v", err)
	}
	covered := 0
	keys := make(map[string]string) // key -> address of its master
	for _, sh := range shards {
		for _, r := range sh.Slots {
			covered += int(r.End - r.Start + 1)
			key := keyInSlots(t, rdb, r.Start, r.End)
			m, err := rdb.MasterForKey(ctx, key)
			if err != nil {
				t.Fatalf("MasterForKey(%s): %v", key, err)
			}
			var wait *redis.Cmd
			if _, err := m.Pipelined(ctx, func(pipe redis.Pipeliner) error {
				pipe.Set(ctx, key, "v-"+key, 0)
				wait = pipe.Do(ctx, "WAIT", 1, 5000)
				return nil
			}); err != nil {
				t.Fatalf("SET %s, WAIT on %s: %v", key, m.Options().Addr, err)
			}
			if n, err := wait.Int64(); err != nil || n != 1 {
				t.Fatalf("WAIT 1 5000 on %s = %d, %v; want 1 replica", m.Options().Addr, n, err)
			}
			keys[key] = m.Options().Addr
		}
	}
	if covered != 16384 {
		t.Fatalf("CLUSTER SHARDS covers %d slots, want 16384", covered)
	}

	victim := masters[0]
	heir := replicaOf(t, c, victim)
	killed := time.Now()
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	promoted, err := c.WaitPromoted(victim, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("promotion after SIGKILL with NodeTimeout 1s took %v", time.Since(killed))
	if promoted != heir {
		t.Fatalf("WaitPromoted(%s) = %s, want its replica %s", victim.Addr(), promoted.Addr(), heir.Addr())
	}
	masters, _ = layout(t, c, 3, 2)
	if !slices.Contains(masters, heir) || slices.Contains(masters, victim) {
		t.Fatalf("Masters() = %v after the promotion of %s", addrsOf(masters), heir.Addr())
	}
	victimKeys := 0
	for key, addr := range keys {
		if addr == victim.Addr() {
			victimKeys++
		}
		getEventually(t, rdb, key, "v-"+key, func() {
			// go-redis reloads its slot map on MOVED, not when it cannot
			// reach a killed master (only every 60 s): ask.
			rdb.ReloadState(t.Context())
		})
	}
	if victimKeys == 0 {
		t.Fatalf("no key was on %s", victim.Addr())
	}

	// A manual failover of another master.
	i := slices.IndexFunc(masters, func(p *redistest.Proc) bool { return p != heir })
	other := masters[i]
	r := replicaOf(t, c, other)
	manual := time.Now()
	if err := c.Failover(r); err != nil {
		t.Fatal(err)
	}
	t.Logf("Failover() took %v", time.Since(manual))
	masters, replicas = layout(t, c, 3, 2)
	if !slices.Contains(masters, r) || !slices.Contains(replicas, other) {
		t.Fatalf("after Failover(%s): Masters() = %v, Replicas() = %v", r.Addr(), addrsOf(masters), addrsOf(replicas))
	}
	if got := replicaOf(t, c, r); got != other {
		t.Fatalf("ReplicaOf(%s) = %s after Failover, want the old master %s", r.Addr(), got.Addr(), other.Addr())
	}
	for key := range keys {
		getEventually(t, rdb, key, "v-"+key, func() {
			// go-redis reloads its slot map on MOVED, not when it cannot
			// reach a killed master (only every 60 s): ask.
			rdb.ReloadState(t.Context())
		})
	}

	// The killed master comes back as a replica of its heir.
	restarted := time.Now()
	if err := victim.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitOK(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Restart and WaitOK took %v", time.Since(restarted))
	layout(t, c, 3, 3)
	if got := replicaOf(t, c, heir); got != victim {
		t.Fatalf("ReplicaOf(%s) = %s after the restart, want %s", heir.Addr(), got.Addr(), victim.Addr())
	}
}

func TestClusterOptionsInvalid(t *testing.T) {
	t.Parallel()
	for _, opts := range []redistest.ClusterOptions{
		{Replicas: -1},
		{Replicas: 2},
		{NodeTimeout: time.Microsecond},
	} {
		if c, err := redistest.StartCluster(opts); err == nil {
			c.Stop()
			t.Errorf("StartCluster(%+v) = nil error, want one", opts)
		}
	}
}

// layout returns Masters and Replicas of c and checks how many there are.
func layout(t *testing.T, c *redistest.ClusterProc, nMasters, nReplicas int) (masters, replicas []*redistest.Proc) {
	t.Helper()
	masters, err := c.Masters()
	if err != nil {
		t.Fatal(err)
	}
	replicas, err = c.Replicas()
	if err != nil {
		t.Fatal(err)
	}
	if len(masters) != nMasters || len(replicas) != nReplicas {
		t.Fatalf("Masters() = %v, Replicas() = %v; want %d and %d", addrsOf(masters), addrsOf(replicas), nMasters, nReplicas)
	}
	return masters, replicas
}

// replicaOf returns c.ReplicaOf(m).
func replicaOf(t *testing.T, c *redistest.ClusterProc, m *redistest.Proc) *redistest.Proc {
	t.Helper()
	r, err := c.ReplicaOf(m)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// addrsOf returns the addresses of ps.
func addrsOf(ps []*redistest.Proc) []string {
	addrs := make([]string, len(ps))
	for i, p := range ps {
		addrs[i] = p.Addr()
	}
	return addrs
}
