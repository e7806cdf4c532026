package redistest_test

import (
	"fmt"
	"net"
	"strconv"
	"testing"

	"github.com/hybridlimit/hybrid/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestCluster(t *testing.T) {
	t.Parallel()
	c := redistest.Cluster(t)
	if n := len(c.Addrs()); n < 1 {
		t.Fatalf("len(Addrs()) = %d, want at least 1", n)
	}
	rdb := redistest.ClusterClient(t, c)
	ctx := t.Context()

	shards, err := rdb.ClusterShards(ctx).Result()
	if err != nil {
		t.Fatalf("CLUSTER SHARDS: %v", err)
	}
	if c.Owned() && len(shards) != 3 {
		t.Fatalf("CLUSTER SHARDS lists %d shards, want 3: %v", len(shards), shards)
	}
	covered := 0
	for _, sh := range shards {
		for _, r := range sh.Slots {
			covered += int(r.End - r.Start + 1)
		}
	}
	if covered != 16384 {
		t.Errorf("CLUSTER SHARDS covers %d slots, want 16384", covered)
	}

	// One key per slot range, written through the cluster client, must be
	// stored on the master that serves the range.
	nodes := make(map[string]*redistest.Proc)
	for _, p := range c.Nodes() {
		nodes[p.Addr()] = p
	}
	for _, sh := range shards {
		master := ""
		for _, n := range sh.Nodes {
			if n.Role == "master" {
				master = net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
			}
		}
		for _, r := range sh.Slots {
			key := keyInSlots(t, rdb, r.Start, r.End)
			want := "v-" + key
			if err := rdb.Set(ctx, key, want, 0).Err(); err != nil {
				t.Fatalf("SET %s: %v", key, err)
			}
			if got, err := rdb.Get(ctx, key).Result(); err != nil || got != want {
				t.Errorf("GET %s = %q, %v; want %q", key, got, err, want)
			}
			p, ok := nodes[master]
			if !ok {
				if c.Owned() {
					t.Errorf("slots %d-%d: master %q is not among the nodes %v", r.Start, r.End, master, c.Addrs())
				}
				continue
			}
			if got, err := redistest.Client(t, p).Get(ctx, key).Result(); err != nil || got != want {
				t.Errorf("GET %s on master %s = %q, %v; want %q", key, master, got, err, want)
			}
		}
	}

	if !c.Owned() {
		return
	}
	var pids []int
	for _, p := range c.Nodes() {
		if !alive(p.Pid()) {
			t.Errorf("node %s pid %d is not alive", p.Addr(), p.Pid())
		}
		pids = append(pids, p.Pid())
	}
	if err := c.Stop(); err != nil {
		t.Fatalf("Stop() = %v", err)
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("pid %d is alive after Stop", pid)
		}
	}
	if err := c.Stop(); err != nil {
		t.Errorf("second Stop() = %v, want nil", err)
	}
}

// keyInSlots returns a key whose hash slot is in [start, end].
func keyInSlots(t *testing.T, rdb *redis.ClusterClient, start, end int64) string {
	t.Helper()
	for i := 0; i < 100000; i++ {
		k := fmt.Sprintf("redistest:%d", i)
		slot, err := rdb.ClusterKeySlot(t.Context(), k).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %s: %v", k, err)
		}
		if slot >= start && slot <= end {
			return k
		}
	}
	t.Fatalf("no key found in slots %d-%d", start, end)
	return ""
}

func BenchmarkStartCluster(b *testing.B) {
	needBinary(b, "redis-server")
	needBinary(b, "redis-cli")
	for b.Loop() {
		c, err := redistest.StartCluster(redistest.ClusterOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Stop(); err != nil {
			b.Fatal(err)
		}
	}
}
