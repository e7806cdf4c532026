package global_test

import (
	"strings"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid/internal/redistest"
)

// TestServer: Server names the Redis server process that answers: the same
// name through a connection made again, and whether it takes a replica or
// not; another once a replica of it answers in its place, promoted
// (REPLICAOF NO ONE) as Sentinel does in a failover; "" from miniredis,
// which does not tell.
func TestServer(t *testing.T) {
	ctx := t.Context()
	if name, err := newLimiter(t, newMiniredis(t)).Server(ctx); name != "" || err != nil {
		t.Errorf("miniredis: Server = %q, %v; want \"\", nil", name, err)
	}
	master := redistest.Server(t)
	rdb := redistest.Client(t, master)
	l := newLimiter(t, backend{rdb: rdb})
	name, err := l.Server(ctx)
	if err != nil || len(name) != 40 {
		t.Fatalf("Server = %q, %v; want a run_id of 40 hex digits", name, err)
	}
	if err := rdb.ClientKillByFilter(ctx, "TYPE", "normal", "SKIPME", "no").Err(); err != nil && !strings.Contains(err.Error(), "EOF") {
		t.Logf("CLIENT KILL: %v", err)
	}
	if again, err := l.Server(ctx); again != name || err != nil {
		t.Errorf("Server through a connection made again = %q, %v; want %q", again, err, name)
	}

	rp, err := redistest.Start(redistest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rp.Stop() })
	replica := redistest.Client(t, rp)
	host, port, _ := strings.Cut(master.Addr(), ":")
	if err := rdb.ConfigSet(ctx, "repl-diskless-sync-delay", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := replica.ReplicaOf(ctx, host, port).Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		info, err := replica.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica's link is not up after 10 s: %q, %v", info, err)
		}
		time.Sleep(10 * time.Millisecond) // polling the replica's state, not waiting in its place
	}
	if got, err := l.Server(ctx); got != name || err != nil {
		t.Errorf("Server with a replica = %q, %v; want %q", got, err, name)
	}
	lr := newLimiter(t, backend{rdb: replica})
	if err := replica.ReplicaOf(ctx, "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := lr.Server(ctx); got == name || len(got) != 40 || err != nil {
		t.Errorf("the promoted replica's Server = %q, %v; want a run_id other than the master's %q", got, err, name)
	}
}
